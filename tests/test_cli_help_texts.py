"""The `--help` texts shipped in the package (trl_collm/cli/help_texts/, written by tools/ship_help_texts.py): a fresh
install's first `trl-collm ppo --help` reads one instead of importing transformers and torch, and a shipped text is
the parser's own, never a stale one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from trl_collm import cli
from trl_collm.cli.precheck import kept_options, names_file

from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]
# TRL's exp_name defaults to the running script's name (pytest here, trl-collm in the shipped text)
EXP_NAME = re.compile(r"(Name of this experiment\. \(default:)\s*\S+\)")
FIX = "run `python tools/ship_help_texts.py` after changing an option"


def test_shipped_texts_are_the_parsers_own(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # the width the tool writes them at
    for kind in ("ppo", "mc"):
        shipped = Path(cli.SHIPPED_HELP_DIR) / cli._help_key(kind)
        assert shipped.is_file(), f"no shipped --help for {kind} at these versions and options: {FIX}"
        parser = cli._train_parser(kind, cli._config_cls(kind))
        built = EXP_NAME.sub(r"\1 NAME)", parser.format_help())
        assert EXP_NAME.sub(r"\1 NAME)", shipped.read_text()) == built, FIX
        names = json.loads(Path(names_file(str(shipped))).read_text())
        assert set(names) == {a.dest for a in parser._actions} - {"help"}
        options = kept_options(str(shipped))
        assert options is not None and set(options["options"]) == {
            f for a in parser._actions for f in a.option_strings if f.startswith("--") and a.dest != "help"
        }
        assert options["field_choices"] == cli.field_choices(kind)[0], FIX
    stale = set(os.listdir(cli.SHIPPED_HELP_DIR)) - {
        f"{cli._help_key(k)[: -len('.txt')]}{ext}"
        for k in ("ppo", "mc")
        for ext in (".txt", ".names.json", ".options.json")
    }
    assert not stale, f"texts of older option files are left: {sorted(stale)}; {FIX}"


def test_first_help_and_config_check_of_a_fresh_install_skip_the_heavy_imports(tmp_path):
    """No kept copy of this user's (an empty cache): the shipped text is printed, a config-key typo refused, and
    neither imports torch or transformers."""
    (tmp_path / "typo.yaml").write_text("task: coord-penalty\nlearnin_rate: 0.1\n")
    code = (
        "import contextlib, io, sys; from trl_collm.cli import main\n"
        "main(['ppo', '--help'])\n"
        "err = io.StringIO()\n"
        "with contextlib.redirect_stderr(err):\n"
        f"    code = main(['ppo', '--config', {str(tmp_path / 'typo.yaml')!r}])\n"
        "print(code, err.getvalue().strip())\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRL_COLLM_CACHE=str(tmp_path / "cache"), COLUMNS="80")
    env.pop("TRL_COLLM_NO_SHIPPED_HELP", None)
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=HANG_GUARD_S
    )
    assert res.returncode == 0, res.stderr[-2000:]
    *help_lines, refused, imported = res.stdout.rstrip("\n").split("\n")
    assert "\n".join(help_lines) + "\n" == (Path(cli.SHIPPED_HELP_DIR) / cli._help_key("ppo")).read_text()
    assert refused.startswith("2 trl-collm: error:") and "learnin_rate" in refused, refused
    assert imported == "False False"
    assert not (tmp_path / "cache").exists()  # nothing was built, so nothing was kept


def test_mc_help_hides_the_grpo_fields_it_only_parses_to_refuse():
    """GRPOConfig's refused fields stay options (TRL's script passes them; a non-default is refused in one line) but
    `--help` lists only what a user can set; GRPO's accepted names are listed."""
    from trl_collm.trainers.grpo_fields import GRPORefusedFields

    parser = cli._train_parser("mc", cli._config_cls("mc"))
    text = parser.format_help()
    refused = set(GRPORefusedFields.__dataclass_fields__)
    assert len(refused) > 30 and {a.dest for a in parser._actions} >= refused
    assert not [name for name in refused if re.search(rf"--{name}\b", text)]
    for kept in ("min_p", "repetition_penalty", "generation_kwargs", "loss_type", "max_completion_length"):
        assert f"--{kept} " in text, kept
