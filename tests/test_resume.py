"""Resume and checkpoints: a run killed (SIGKILL) and resumed gives the same metrics as an uninterrupted one; a kill
during a save leaves the previous checkpoint usable; report_to=tensorboard writes event files."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trl_collm.trainers import checkpoints
from trl_collm.trainers.console import is_wall_clock

from hang_guard import HANG_GUARD_S

SCRIPT = Path(__file__).parent / "scripts" / "train_for_resume.py"


def _run(out, *extra, env):
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(out), *extra], env=env, capture_output=True, text=True, timeout=HANG_GUARD_S
    )


@pytest.fixture
def child_env(qwen_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", CI="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return env  # TRL_COLLM_CACHE is set by the session fixture behind qwen_path: the children reuse the built model


def _comparable(history):
    return [{k: v for k, v in m.items() if not is_wall_clock(k)} for m in history]  # wall-clock figures differ


def test_killed_and_resumed_run_matches_uninterrupted_run(tmp_path, child_env):
    straight = tmp_path / "straight"
    result = _run(straight, env=child_env)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = json.loads((straight / "metrics.json").read_text())
    assert len(expected) == 5

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(killed), "--hold_after_save", "2"],  # it stops after checkpoint-2
        env=child_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    marker = killed / "checkpoint-2" / checkpoints.MARKER
    deadline = time.monotonic() + HANG_GUARD_S  # a hang guard: the run holds after checkpoint-2 until killed
    while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert marker.exists(), "the run never wrote checkpoint-2"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=HANG_GUARD_S)
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "metrics.json").exists()
    assert not (killed / "checkpoint-5").exists()

    resumed = _run(killed, "--resume", env=child_env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got = json.loads((killed / "metrics.json").read_text())
    assert [m["episode"] for m in got] == [m["episode"] for m in expected]
    for a, b in zip(_comparable(got), _comparable(expected)):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key
    # save_total_limit=3 keeps the three newest checkpoints
    assert sorted(p.name for p in killed.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-4", "checkpoint-5"]


def test_kill_during_save_leaves_previous_checkpoint_usable(
    tmp_path, qwen_path, prompts_dataset, make_config, monkeypatch
):
    from trl_collm import MultiAgentPPOTrainer

    args = make_config(tmp_path, agent_names=["a", "b"], save_strategy="steps", save_steps=1, total_episodes=8)
    reward = lambda prompts, completions, **k: [1.0] * len(prompts)  # noqa: E731
    trainer = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=reward)
    real_save = torch.save
    calls = {"n": 0}

    def crashing_save(obj, path, *a, **kw):
        if str(path).endswith(checkpoints.STATE_FILE):
            calls["n"] += 1
            if calls["n"] == 2:  # die in the middle of writing the second checkpoint
                raise KeyboardInterrupt("killed while saving")
        return real_save(obj, path, *a, **kw)

    monkeypatch.setattr(torch, "save", crashing_save)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    out = Path(args.output_dir)
    assert (out / "checkpoint-1" / checkpoints.MARKER).exists()
    assert (out / "checkpoint-2.tmp").exists() and not (out / "checkpoint-2").exists()
    assert checkpoints.complete_checkpoints(str(out)) == [str(out / "checkpoint-1")]
    monkeypatch.setattr(torch, "save", real_save)
    trainer2 = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=reward)
    trainer2.train(resume_from_checkpoint=True)
    assert trainer2.state.global_step == 2
    assert len(trainer2._metrics_history) == 2
    with pytest.raises(ValueError, match="resume_from_checkpoint"):
        trainer2.train(resume_from_checkpoint=str(out / "checkpoint-2.tmp"))


def test_report_to_tensorboard_writes_event_files(tmp_path, child_env):
    pytest.importorskip("tensorboard")
    out = tmp_path / "tb-run"
    result = _run(out, "--report_to", "tensorboard", "--iterations", "2", env=child_env)
    assert result.returncode == 0, result.stderr[-3000:]
    events = list(out.rglob("events.out.tfevents*"))
    assert events, list(out.rglob("*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert any(t.endswith("objective/scores") for t in tags), tags
    assert any(t.endswith("alice/objective/scores") for t in tags), tags
