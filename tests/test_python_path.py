"""A run started from Python is treated as the CLI's (issue 47, part 2): torch's threads picked by the same rule
(`hardware.pick_cpu_threads`, overridable), progress with an ETA from the first iteration, sampled texts kept in
output_dir/samples.jsonl instead of the console, and no library noise the user cannot act on (DeepSpeed's
accelerator line, weight-loading / writing bars, transformers' FutureWarnings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trl_collm import hardware

from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys, torch
from peft import LoraConfig
from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer
from trl_collm.tasks import get_task
from trl_collm.testing import tiny_model_dir

task = get_task("coord-penalty")
args = MultiAgentPPOConfig(
    output_dir=sys.argv[1], agent_names=task.agent_names, per_device_train_batch_size=4, total_episodes=16,
    response_length=2, logging_steps=2, save_strategy="no", report_to=[], num_sample_generations=2, use_cpu=True,
    bf16=False, seed=0,
)
trainer = MultiAgentPPOTrainer(
    args=args, model=tiny_model_dir("tiny-qwen2"), train_dataset=task.load_dataset("train", limit=8),
    eval_dataset=task.load_dataset("eval", limit=2), env=task.make_env(),
    peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
)
trainer.train()
trainer.save_model()
print("THREADS", torch.get_num_threads())
"""


def test_a_python_run_picks_threads_shows_progress_and_keeps_the_console_clean(tmp_path, model_cache, qwen_path):
    """The tiny model is built first (qwen_path): its one-time build is the testing factory's, not the run's."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "TRL_COLLM_THREADS")}
    env.update(TRL_COLLM_CACHE=str(model_cache), PYTHONPATH=str(ROOT), PYTHONWARNINGS="default")
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(script), str(out)], capture_output=True, text=True, env=env, timeout=HANG_GUARD_S
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = proc.stdout + proc.stderr
    assert "THREADS 1" in proc.stdout  # the CLI's rule: one thread on CPU
    lines = proc.stdout.splitlines()
    # iteration 1 is not a log step (logging_steps=2): its progress line, with the pace and an ETA, comes first
    assert lines[0].startswith("iteration 1/4 (25%) | ") and " ETA " in lines[0], proc.stdout
    assert any(line.startswith("iteration 2/4 (50%)") and "objective/scores" in line for line in lines)
    for noise in ("Setting accelerator to CPU", "Loading weights", "Writing model shards", "FutureWarning"):
        assert noise not in text, (noise, text[-3000:])
    assert "-- episode" not in text  # the sampled texts are not printed ...
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {s["iteration"] for s in samples} == {2, 4} and all("turn" in s for s in samples)  # ... but kept


@pytest.fixture
def threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(hardware.THREADS_ENV, raising=False)
    monkeypatch.setattr(hardware, "_chosen_threads", None)
    yield monkeypatch
    torch.set_num_threads(before)


def test_the_thread_rule_and_its_overrides(threads):
    threads.setattr(hardware, "_torch_default_threads", lambda: {4})  # torch's default on this "machine": 4
    torch.set_num_threads(4)
    assert hardware.pick_cpu_threads(None, on_cpu=True, keep_user_count=True) == 1  # the default: one thread
    assert torch.get_num_threads() == 1
    assert hardware.pick_cpu_threads(None, on_cpu=True, keep_user_count=True) is None  # chosen already: stands
    torch.set_num_threads(3)  # the user's own torch.set_num_threads (not torch's default)
    assert hardware.pick_cpu_threads(None, on_cpu=True, keep_user_count=True) is None and torch.get_num_threads() == 3
    torch.set_num_threads(4)
    assert hardware.pick_cpu_threads(None, on_cpu=False, keep_user_count=True) is None  # GPU: torch's choice
    threads.setenv(hardware.THREADS_ENV, "2")
    assert hardware.pick_cpu_threads(None, on_cpu=True, keep_user_count=True) == 2 and torch.get_num_threads() == 2
    threads.setenv(hardware.THREADS_ENV, "torch")
    torch.set_num_threads(4)
    assert hardware.pick_cpu_threads(None, on_cpu=True, keep_user_count=True) is None and torch.get_num_threads() == 4
    threads.setenv(hardware.THREADS_ENV, "many")
    refused = "TRL_COLLM_THREADS='many': give a thread count >= 1, 'auto' for the idle cores, or 'torch'"
    with pytest.raises(ValueError, match=refused):
        hardware.pick_cpu_threads(None, on_cpu=True)
    threads.delenv(hardware.THREADS_ENV)
    threads.setenv("OMP_NUM_THREADS", "4")
    assert hardware.pick_cpu_threads(None, on_cpu=True, keep_user_count=True) is None and torch.get_num_threads() == 4


def test_the_trainer_applies_the_rule_when_it_is_built(threads, tmp_path, make_config, prompts_dataset, qwen_path):
    from test_numerics import ok_reward

    from trl_collm import MultiAgentPPOTrainer

    threads.setattr(hardware, "_torch_default_threads", lambda: {torch.get_num_threads(), 3})
    torch.set_num_threads(3)
    MultiAgentPPOTrainer(
        args=make_config(tmp_path), model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward
    )
    assert torch.get_num_threads() == 1
    torch.set_num_threads(2)
    threads.setattr(hardware, "_torch_default_threads", lambda: {3})
    MultiAgentPPOTrainer(
        args=make_config(tmp_path), model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward
    )
    assert torch.get_num_threads() == 2  # the user's own count stands


def test_on_a_terminal_a_bar_runs_from_the_first_iteration(
    monkeypatch, capsys, tmp_path, make_config, prompts_dataset, qwen_path
):
    from test_numerics import ok_reward

    from trl_collm import MultiAgentPPOTrainer
    from trl_collm.trainers import progress

    monkeypatch.setattr(progress, "_interactive", lambda: True)
    args = make_config(tmp_path, logging_steps=1, disable_tqdm=False)
    MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward).train()
    captured = capsys.readouterr()
    assert "training: 100%" in captured.err and "2/2" in captured.err, captured.err  # tqdm's bar, with its rate
    assert captured.out.startswith("objective/scores ")  # the log lines, written above the bar (it shows progress)
