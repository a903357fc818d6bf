"""`trl-collm eval` / `play` while the episodes run (trl_collm/cli/evaluate.py, inference.play's batches): progress on
stderr (a tqdm bar on a terminal, a line every N plays elsewhere, nothing with --quiet), the results on stdout the
same as in one batch, and no library noise a user cannot act on (weight-loading bars, DeepSpeed's CPU line)."""

from __future__ import annotations

import io
import json

from test_cli_usability import _fake_team

from trl_collm.cli import main
from trl_collm.cli.evaluate import PlayProgress

RECORD = {"name": "coord-numbers", "ref": "coord-numbers", "options": {"num_agents": 2}, "dataset_source": None}


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_line_every_n_plays_without_a_terminal_with_its_pace_and_eta():
    out = io.StringIO()  # not a terminal
    progress = PlayProgress(10, every=4, stream=out)
    clock = _Clock()
    progress._clock, progress.start = clock, clock.now
    for _ in range(5):
        clock.now += 3.0  # 2 plays per 3 s
        progress(2)
    progress.close()
    assert out.getvalue().splitlines() == [
        "played 4/10 (40%) | 1.5 s/play | ETA 9s",
        "played 8/10 (80%) | 1.5 s/play | ETA 3s",
        "played 10/10 (100%) | 1.5 s/play | ETA 0s",
    ]
    quiet = io.StringIO()
    silent = PlayProgress(10, quiet=True, every=1, stream=quiet)
    silent(10)
    silent.close()
    assert quiet.getvalue() == ""


def test_a_bar_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    progress = PlayProgress(6, every=1, stream=term)
    assert progress.bar is not None
    progress(3)
    progress(3)
    progress.close()
    shown = term.getvalue()
    assert "playing" in shown and "6/6" in shown and "played" not in shown  # the bar, not the lines
    assert PlayProgress(6, quiet=True, stream=Terminal()).bar is None


def test_eval_shows_progress_on_stderr_and_nothing_a_user_cannot_act_on(tmp_path, capsys, qwen_path):
    team = _fake_team(tmp_path / "team", qwen_path, ["agent_1", "agent_2"], response_length=2, task=RECORD)
    capsys.readouterr()
    assert main(["play", "--team_dir", str(team), "--limit", "4", "--batch_size", "4"]) == 0
    whole = capsys.readouterr().out
    argv = ["play", "--team_dir", str(team), "--limit", "4", "--batch_size", "1", "--progress_every", "2"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert [line.split(" |")[0] for line in lines] == ["played 2/4 (50%)", "played 4/4 (100%)"], captured.err
    # batches of one row play the same greedy episodes, numbered in order, as one batch of four
    assert captured.out == whole and "=== episode 3 " in whole
    assert json.loads(whole.strip().splitlines()[-1])["episodes"] == 4
    assert main(["eval", "--team_dir", str(team), "--limit", "2", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_eval_refuses_a_batch_below_one(tmp_path, capsys, qwen_path):
    team = _fake_team(tmp_path / "team", qwen_path, ["agent_1", "agent_2"], response_length=2, task=RECORD)
    capsys.readouterr()
    assert main(["eval", "--team_dir", str(team), "--batch_size", "0"]) == 2
    assert "--batch_size 0: give a number >= 1" in capsys.readouterr().err


def test_load_team_from_python_shows_no_weight_loading_bars(tmp_path, capsys, qwen_path, monkeypatch):
    from trl_collm.inference import load_team

    team_dir = _fake_team(tmp_path / "team", qwen_path, ["agent_1", "agent_2"], response_length=2, task=RECORD)
    capsys.readouterr()
    load_team(str(team_dir))
    assert "Loading weights" not in capsys.readouterr().err
    monkeypatch.setenv("TRL_COLLM_VERBOSE", "1")  # the bars this hides (the check above has something to miss)
    load_team(str(team_dir))
    assert "Loading weights" in capsys.readouterr().err
