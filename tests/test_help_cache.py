"""The kept option names and `--help` texts (trl_collm/cli, `precheck.kept_names` / `kept_help_text`) are checked
when read: a damaged file (null, a number, a dict, a string, an empty list, an empty text) is never trusted; the
parser is built instead and the file kept again."""

from __future__ import annotations

import json

import pytest

from trl_collm import cli
from trl_collm.cli import UsageError
from trl_collm.cli.precheck import kept_help_text, kept_names, kept_options, names_file, options_file, precheck


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """This user's cache in a fresh folder, the shipped texts out of the way."""
    monkeypatch.setenv("TRL_COLLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TRL_COLLM_NO_SHIPPED_HELP", "1")
    return tmp_path


@pytest.fixture(scope="module")
def ppo_parser():
    return cli._train_parser("ppo", cli._config_cls("ppo"))


def _write(path: str, text: str) -> None:
    import os

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _config(tmp_path, **keys) -> str:
    path = tmp_path / "run.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in keys.items()))
    return str(path)


@pytest.mark.parametrize("content", ["null", "7", '{"task": 1}', '"task output_dir"', "[]", '["task", 3]'])
def test_a_damaged_names_file_is_not_trusted_and_a_parser_build_keeps_it_again(cache, ppo_parser, content):
    for kind in ("ppo", "mc"):
        _write(names_file(cli._help_file(kind)), content)
    assert kept_names(cli._help_file("ppo")) is None
    valid = _config(cache, task="coord-penalty", learning_rate=0.1, output_dir=str(cache / "out"))
    precheck("ppo", ["--config", valid], cli._help_file)  # valid keys: no crash, not "not an option"
    cli._keep_both("ppo", ppo_parser)  # what the parser build of `trl-collm ppo` does next
    names = kept_names(cli._help_file("ppo"))
    assert names is not None and {"learning_rate", "task", "num_ppo_epochs"} <= names
    assert kept_names(cli._help_file("mc")) is not None  # the twin's damaged file is kept again too
    typo = _config(cache, task="coord-penalty", learnin_rate=0.1)
    with pytest.raises(UsageError, match="`learnin_rate` is not an option of trl-collm ppo"):
        precheck("ppo", ["--config", typo], cli._help_file)  # the kept names are used again


@pytest.mark.parametrize("content", ["", "\n", "usage: trl-collm ppo [-h]\n", "usage: trl-collm mc [-h] --task"])
def test_a_damaged_help_text_is_rebuilt_and_printed(cache, capsys, content):
    path = cli._help_file("ppo")
    _write(path, content)
    assert kept_help_text(path, "ppo") is None
    cli._print_help("ppo")
    out = capsys.readouterr().out
    assert out.startswith("usage: trl-collm ppo ") and "--learning_rate" in out and "--num_ppo_epochs" in out
    assert kept_help_text(path, "ppo") == out  # kept again


def test_the_kept_files_of_a_parser_build_are_read_back(cache, ppo_parser):
    cli._keep_parser("ppo", ppo_parser)
    path = cli._help_file("ppo")
    assert kept_help_text(path, "ppo") == ppo_parser.format_help()
    with open(names_file(path)) as f:
        assert kept_names(path) == set(json.load(f)) == {a.dest for a in ppo_parser._actions} - {"help"}


# Mistakes whose message the flag check (precheck.check_flags) must say in the parser's own words
SAME_WORDS = [
    ["ppo", "--learning_rate"],
    ["ppo", "--agent_names"],
    ["mc", "--num_generations", "abc"],
    ["ppo", "--use_cpu", "maybe"],
    ["ppo", "--lr_scheduler_type", "foo"],
    ["mc", "--loss_type", "foo"],
    ["ppo", "--policy_loss_type=clip"],
]


def _said(capsys, argv) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


def test_the_flag_check_says_what_the_parser_says_without_building_it(cache, capsys, monkeypatch):
    """Each mistake is said first by the parser (nothing kept yet), then, from what that build kept, by the flag check
    before any parser is built: the same line."""
    by_parser = [_said(capsys, argv) for argv in SAME_WORDS]
    assert all(kept_options(cli._help_file(k)) is not None for k in ("ppo", "mc"))

    def no_parser(*a, **k):
        raise AssertionError("the parser was built")

    monkeypatch.setattr(cli.options, "_train_parser", no_parser)  # where every build looks it up
    assert [_said(capsys, argv) for argv in SAME_WORDS] == by_parser
    assert "expected one argument" in by_parser[0] and "invalid choice: 'foo'" in by_parser[4]
    assert "`loss_type`='foo' is not valid" in by_parser[5]
    # unknown flags: the nearest name, or the other trainer's option
    assert _said(capsys, ["ppo", "--learning_rte", "1"]).endswith(
        "--learning_rte is not an option; did you mean --learning_rate? (trl-collm ppo --help lists the options)"
    )
    assert "--kl_coef is not an option of trl-collm mc but of trl-collm ppo" in _said(capsys, ["mc", "--kl_coef", "1"])
    # MC's GRPO loss types that are not here: left to the config, which names the nearest
    monkeypatch.undo()
    assert "the nearest is loss_type='dapo'" in _said(capsys, ["mc", "--loss_type", "cispo"])


def test_the_flag_check_lets_every_valid_spelling_through(cache, ppo_parser):
    cli._keep_both("ppo", ppo_parser)
    valid = [
        ["--learning-rate=1e-3", "--use_cpu", "--bf16", "false", "--seed", "-1", "--agent_names", "a", "b"],
        ["--no_plot", "--lr_scheduler_type", "cosine", "--task", "coord-penalty", "--num_ppo_epochs=2"],
        ["--learn", "1e-3"],  # an abbreviation: argparse takes it (and says whether it is unique)
        ["--centralized_value", "team", "--report_to", "none", "--dataset_source", "I,L"],
    ]
    for argv in valid:
        precheck("ppo", argv, cli._help_file)


@pytest.mark.parametrize("content", ["null", "[]", '{"options": {}}', '{"options": {"--task": 3}}'])
def test_a_damaged_options_file_is_not_trusted(cache, ppo_parser, content):

    cli._keep_both("ppo", ppo_parser)
    _write(options_file(cli._help_file("ppo")), content)
    assert kept_options(cli._help_file("ppo")) is None
    precheck("ppo", ["--bad_flag", "1"], cli._help_file)  # left to the parser
    cli._keep_both("ppo", ppo_parser)
    with pytest.raises(UsageError, match="--bad_flag is not an option"):
        precheck("ppo", ["--bad_flag", "1"], cli._help_file)
