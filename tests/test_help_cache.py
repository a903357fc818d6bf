"""The kept option names and `--help` texts (trl_collm/cli, `precheck.kept_names` / `kept_help_text`) are checked
when read: a damaged file (null, a number, a dict, a string, an empty list, an empty text) is never trusted; the
parser is built instead and the file kept again."""

from __future__ import annotations

import json

import pytest

from trl_collm import cli
from trl_collm.cli import UsageError
from trl_collm.cli.precheck import kept_help_text, kept_names, names_file, precheck


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
