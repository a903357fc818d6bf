"""An output_dir is one run's (trainers/output_dir.py, trainers/checkpoints.py): one run at a time, writable before
training, nothing deleted before the checks that can fail, and a second run never silently overwrites the checkpoints
of a first."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest
from test_numerics import _trained_checkpoint, ok_reward  # one run that leaves a checkpoint

from trl_collm import MultiAgentPPOTrainer
from trl_collm.trainers import checkpoints

from hang_guard import HANG_GUARD_S

# ---------------------------------------------------------------------------------------------------------------
# one run per output_dir, writable before training, nothing deleted before the checks
# ---------------------------------------------------------------------------------------------------------------


def _trainer(args, qwen_path, prompts_dataset, **kw):
    from trl_collm import MultiAgentPPOTrainer

    return MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward, **kw)


def _holder_process(out) -> subprocess.Popen:
    """Another process holding output_dir's lock, as a running training would."""
    code = (
        "import sys, time; from trl_collm.trainers.output_dir import OutputDirLock; "
        f"OutputDirLock({str(out)!r}).acquire(); print('held', flush=True); time.sleep({2 * HANG_GUARD_S})"
    )
    os.makedirs(out, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_run_into_a_busy_output_dir_is_refused_then_a_crashed_holder_is_taken_over(
    tmp_path, make_config, prompts_dataset, qwen_path
):
    from trl_collm.trainers.output_dir import LOCK_FILE

    out = tmp_path / "out"
    holder = _holder_process(out)
    try:
        tr = _trainer(make_config(tmp_path, save_strategy="steps", save_steps=1), qwen_path, prompts_dataset)
        with pytest.raises(
            RuntimeError, match=rf"in use by another run \(pid {holder.pid} on host {socket.gethostname()}"
        ):
            tr.train()
        assert not checkpoints.complete_checkpoints(str(out))
    finally:
        holder.send_signal(signal.SIGKILL)  # a crash: the lock file stays behind
        holder.wait(timeout=HANG_GUARD_S)
    assert (out / LOCK_FILE).exists()
    tr.train()  # the holder's pid is dead on this host: a stale lock, taken over
    assert [os.path.basename(p) for p in checkpoints.complete_checkpoints(str(out))] == ["checkpoint-1", "checkpoint-2"]
    assert not (out / LOCK_FILE).exists()  # released at the end of the run


def test_two_runs_at_once_in_one_process_and_a_lock_from_another_host(
    tmp_path, make_config, prompts_dataset, qwen_path
):
    from transformers import TrainerCallback

    from trl_collm.trainers.output_dir import LOCK_FILE

    second = _trainer(make_config(tmp_path), qwen_path, prompts_dataset)
    refused = []

    class StartAnotherRun(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            with pytest.raises(RuntimeError, match=rf"in use by another run \(pid {os.getpid()} on host"):
                second.train()
            refused.append(state.global_step)

    first = _trainer(make_config(tmp_path), qwen_path, prompts_dataset, callbacks=[StartAnotherRun()])
    first.train()
    assert refused == [1, 2]
    lock = tmp_path / "out" / LOCK_FILE
    lock.write_text(json.dumps({"pid": 1, "host": "some-other-host"}))  # cannot be checked from here: never stale
    with pytest.raises(RuntimeError, match=r"pid 1 on host some-other-host.*delete .*\.trl_collm\.lock"):
        second.train()
    assert lock.exists()


@pytest.mark.parametrize("where", ["a file", "under a file", "in /proc"])
def test_unwritable_output_dir_fails_before_training(
    tmp_path, make_config, prompts_dataset, qwen_path, monkeypatch, where
):
    import trl_collm.trainers.base as base

    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    out = str({"a file": blocker, "under a file": blocker / "out", "in /proc": "/proc/trl_collm_out"}[where])
    message = re.escape(f"output_dir {out!r} is not a writable folder")
    # at construction, before any model is loaded
    with monkeypatch.context() as m:
        m.setattr(base, "build_team", lambda *a, **k: pytest.fail("the team was built before output_dir was checked"))
        with pytest.raises(PermissionError, match=message):
            _trainer(make_config(tmp_path, output_dir=out), qwen_path, prompts_dataset)
    # and again when train() starts (the folder may have changed since)
    tr = _trainer(make_config(tmp_path, save_strategy="steps", save_steps=1), qwen_path, prompts_dataset)
    tr.args.output_dir = out
    tr.training_iteration = lambda rows: pytest.fail("training started before output_dir was checked")
    with pytest.raises(PermissionError, match=message):
        tr.train()
    assert blocker.read_text() == "not a folder"


def test_overwrite_output_dir_deletes_nothing_when_a_check_fails(tmp_path, make_config, prompts_dataset, qwen_path):
    out = tmp_path / "out"
    _trainer(make_config(tmp_path, save_strategy="steps", save_steps=1), qwen_path, prompts_dataset).train()
    before = checkpoints.complete_checkpoints(str(out))
    assert len(before) == 2
    too_big = make_config(tmp_path, overwrite_output_dir=True, per_device_train_batch_size=len(prompts_dataset) + 1)
    with pytest.raises(ValueError, match="`train_dataset` has .* rows but one rollout batch"):
        _trainer(too_big, qwen_path, prompts_dataset).train()
    assert checkpoints.complete_checkpoints(str(out)) == before  # the old run is still resumable


# ---------------------------------------------------------------------------------------------------------------
# 4. a second run never clobbers a first
# ---------------------------------------------------------------------------------------------------------------


def test_second_run_refuses_to_overwrite_checkpoints(tmp_path, make_config, prompts_dataset, qwen_path):
    args, ck = _trained_checkpoint(tmp_path, make_config, prompts_dataset, qwen_path)
    before = os.path.getmtime(os.path.join(ck, checkpoints.STATE_FILE))
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    with pytest.raises(ValueError, match=r"resume_from_checkpoint.*overwrite_output_dir"):
        tr.train()
    assert os.path.getmtime(os.path.join(ck, checkpoints.STATE_FILE)) == before


def test_second_run_with_overwrite_output_dir_starts_over(tmp_path, make_config, prompts_dataset, qwen_path):
    args, ck = _trained_checkpoint(tmp_path, make_config, prompts_dataset, qwen_path, total_episodes=12)
    assert os.path.basename(ck) == "checkpoint-3"
    args2 = make_config(tmp_path, num_agents=2, save_strategy="steps", save_steps=1, overwrite_output_dir=True)
    tr = MultiAgentPPOTrainer(args=args2, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    tr.train()
    names = [os.path.basename(p) for p in checkpoints.complete_checkpoints(str(tmp_path / "out"))]
    assert names == ["checkpoint-1", "checkpoint-2"]  # the old run's checkpoint-3 cannot be resumed by mistake


def test_resume_true_continues(tmp_path, make_config, prompts_dataset, qwen_path):
    args, ck = _trained_checkpoint(tmp_path, make_config, prompts_dataset, qwen_path)
    args2 = make_config(tmp_path, num_agents=2, save_strategy="steps", save_steps=1, total_episodes=12)
    tr = MultiAgentPPOTrainer(args=args2, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    tr.train(resume_from_checkpoint=True)
    assert tr.state.global_step == 3
