"""examples/smollm2_team.py keeps what it finished (its held-out plays, a checkpoint per iteration, the team right
after training): stopped mid-training or during its final plays, the same command picks up there instead of
training again from scratch. Run on the offline tiny model (the example's hidden `--model tiny`), really stopped
(SIGKILL) at a line it prints."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]


def _command(out) -> list[str]:
    example = str(ROOT / "examples" / "smollm2_team.py")
    sizes = ["--iterations", "3", "--posts", "1", "--eval-posts", "2", "--response-length", "4", "--dtype", "float32"]
    return [sys.executable, example, *sizes, "--model", "tiny", "--output-dir", str(out)]


def _env(cache) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return dict(env, TRL_COLLM_CACHE=str(cache), PYTHONPATH=str(ROOT))


def _run_until(cmd, env, marker: str) -> str:
    """Run until a stdout line starts with `marker`, then kill it (a user's stop, with no chance to clean up)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith(marker):
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait(timeout=HANG_GUARD_S)
    assert seen and seen[-1].startswith(marker), "".join(seen)[-3000:]
    return "".join(seen)


def _run(cmd, env) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_a_stopped_example_picks_up_where_it_was(tmp_path, model_cache):
    from trl_collm.team.saved import load_team

    out, env = tmp_path / "team", _env(model_cache)
    cmd = _command(out)
    first = _run_until(cmd, env, "iteration 2:")  # stopped in training, checkpoint-1 complete
    assert "before training: held-out team score" in first
    kept = json.loads((out / "example_run.json").read_text())["plays"]
    assert set(kept) == {"before", "before, greedy"} and len(kept["before"]) == 2

    second = _run_until(cmd, env, "saved the trained team")  # resumed, trained to the end, stopped at the final plays
    assert "before: read from" in second and "before, greedy: read from" in second
    resumed = re.search(r"resuming from .*checkpoint-(\d+)", second)
    assert resumed and int(resumed.group(1)) in (1, 2), second
    assert "iteration 1:" not in second and "iteration 3:" in second, second
    assert len(load_team(str(out)).names) == 2  # the trained team, saved before the final plays

    third = _run(cmd, env)  # nothing left to train: the final plays only
    assert re.search(r"resuming from .*checkpoint-3", third), third
    assert not re.search(r"^iteration \d+:", third, re.M), third
    assert len(re.findall(r"held-out team score", third)) == 3
    assert set(json.loads((out / "example_run.json").read_text())["plays"]) == {
        "before",
        "before, greedy",
        "after",
        "after, greedy",
    }


def test_other_settings_into_the_same_output_dir_are_refused_and_fresh_starts_over(tmp_path, model_cache):
    out, env = tmp_path / "team", _env(model_cache)
    (out).mkdir()
    (out / "example_run.json").write_text(json.dumps({"settings": {"iterations": 99}, "plays": {}}))
    proc = subprocess.run(_command(out), capture_output=True, text=True, env=env, cwd=ROOT, timeout=HANG_GUARD_S)
    refusal = re.search(r"holds a run with other settings \(([^)]*)\).*pass --fresh", proc.stderr)
    assert proc.returncode != 0 and refusal and "iterations" in refusal.group(1), proc.stderr[-2000:]
    text = _run([*_command(out), "--fresh"], env)
    assert "read from" not in text and "iteration 3:" in text
