"""docs/envs.md works as written: its task file, its hand-played episode (the printed values are the comments'), and
its `trl-collm ppo --task letters.py:TASK` command (the offline tiny model)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

PAGE = (Path(__file__).resolve().parents[1] / "docs" / "envs.md").read_text()


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE, re.DOTALL)


def test_the_page_has_the_task_file_the_episode_and_the_command():
    task, episode = _blocks()
    assert "class LettersEnv(MultiAgentEnv)" in task and "TASK = TaskSpec(" in task
    assert "env.step(" in episode and "trl-collm ppo --task letters.py:TASK" in PAGE


def test_the_hand_played_episode_prints_what_its_comments_say():
    task, episode = _blocks()
    namespace: dict = {}
    exec(compile(task, "letters.py", "exec"), namespace)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(episode, "episode", "exec"), namespace)
    said = [line.split("# ", 1)[1].split(": ")[0].strip() for line in episode.splitlines() if "print(" in line]
    assert out.getvalue().splitlines() == said  # each print's output is the comment beside it
    assert namespace["TASK"].load_dataset("eval", limit=1)["topic"] == ["snow"]


def test_the_command_trains_the_task_from_its_file(tmp_path, monkeypatch, model_cache):
    from trl_collm.cli import main
    from trl_collm.team.saved import read_team_file

    (tmp_path / "letters.py").write_text(_blocks()[0])
    monkeypatch.chdir(tmp_path)
    command = next(line.strip() for line in PAGE.splitlines() if line.strip().startswith("trl-collm ppo --task"))
    argv = shlex.split(command)[1:]
    assert main(argv + ["--report_to", "none", "--plot", "false"]) == 0
    desc = read_team_file(str(tmp_path / "outputs" / "letters"))
    assert desc["agents"] == ["alice", "bob"] and desc["num_turns"] == 2 and desc["task"]["ref"] == "letters.py:TASK"
