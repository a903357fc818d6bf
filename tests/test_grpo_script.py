"""TRL's own GRPO script (`trl/scripts/grpo.py` of the installed trl, read at test time: its text is TRL's) with its
two imports swapped for `MultiAgentMCConfig as GRPOConfig` / `MultiAgentMCTrainer as GRPOTrainer` trains one agent
with GRPO's flags, full model and LoRA, saves what GRPO saves and logs GRPO's metric names."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hang_guard import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["The team works together", "Agent one writes", "Two agents are", "Hello world"]

# what GRPOTrainer logs for these flags (its `_metrics` names, and transformers' loss / learning_rate)
GRPO_METRICS = [
    "num_tokens",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "completions/min_terminated_length",
    "completions/max_terminated_length",
    "rewards/length_reward/mean",
    "rewards/length_reward/std",
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "kl",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_mean",
    "clip_ratio/high_max",
    "clip_ratio/region_mean",
    "loss",
    "learning_rate",
]


def swapped_grpo_script() -> str:
    """The installed TRL's grpo.py with its GRPOTrainer / GRPOConfig imports taken from trl_collm instead."""
    import trl

    text = (Path(trl.__file__).parent / "scripts" / "grpo.py").read_text()
    for name, ours in (("GRPOTrainer", "MultiAgentMCTrainer"), ("GRPOConfig", "MultiAgentMCConfig")):
        pattern = re.compile(r"^([ \t]*)from trl import (.*)\b" + name + r", (.*)$", re.M)
        text, n = pattern.subn(
            lambda m: f"{m[1]}from trl import {m[2]}{m[3]}\n{m[1]}from trl_collm import {ours} as {name}", text
        )
        assert n == 1, f"trl's grpo.py no longer imports {name} in one line"
    return text


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from trl_collm.testing import save_tiny_model

    root = tmp_path_factory.mktemp("grpo-script")
    model = save_tiny_model(root, "sft", kind="causal_lm", seed=0)
    data = root / "data"
    data.mkdir()
    for split, prompts in (("train", PROMPTS * 2), ("test", PROMPTS[:1])):
        (data / f"{split}.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    (root / "my_rewards.py").write_text(
        "def length_reward(completions, **kwargs):\n    return [len(c) / 10 for c in completions]\n"
    )
    script = root / "grpo_team.py"
    script.write_text(swapped_grpo_script())
    return {"root": root, "model": model, "data": str(data), "script": script}


def _run(assets, out: Path, extra: list[str]) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        str(assets["script"]),
        "--dataset_name", assets["data"],
        "--model_name_or_path", assets["model"],
        "--output_dir", str(out),
        "--max_completion_length", "8",
        "--num_generations", "4",
        "--loss_type", "dapo",
        "--beta", "0.04",
        "--scale_rewards", "batch",
        "--reward_funcs", "my_rewards.length_reward",
        "--temperature", "0.9",
        "--use_cpu",
        "--report_to", "none",
        "--max_steps", "2",
        "--save_strategy", "steps",
        "--save_steps", "2",
        "--per_device_train_batch_size", "2",
        "--logging_steps", "1",
        "--learning_rate", "1e-3",
        *extra,
    ]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.update(OMP_NUM_THREADS="1", HF_DATASETS_CACHE=str(assets["root"] / "datasets-cache"), PYTHONPATH=str(REPO))
    return subprocess.run(
        cmd, cwd=str(assets["root"]), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=HANG_GUARD_S,
    )  # fmt: skip


def _check_logs(out: Path):
    history = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    steps = [h for h in history if "reward" in h]
    assert len(steps) == 2, history
    missing = [m for m in GRPO_METRICS if any(m not in h for h in steps)]
    assert not missing, f"GRPO's metric names missing: {missing}\n{steps[-1]}"
    # the reward is the function's, on one completion per sample (a list of one text would score 0.1)
    assert all(h["reward"] > 0.1 for h in steps), steps


def test_grpo_script_full_model(assets, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "out"
    proc = _run(assets, out, [])
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert "Training completed." in proc.stdout and "Model saved to" in proc.stdout
    _check_logs(out)
    trained = load_file(out / "model.safetensors")
    initial = load_file(Path(assets["model"]) / "model.safetensors")
    assert trained.keys() == initial.keys()
    assert any(not torch.equal(trained[k], initial[k]) for k in initial), "GRPO left every weight unchanged"
    assert (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file()


def test_grpo_script_lora(assets, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "out"
    proc = _run(assets, out, ["--use_peft", "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj"])
    assert proc.returncode == 0, proc.stdout[-6000:]
    _check_logs(out)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 4 and set(config["target_modules"]) == {"q_proj", "v_proj"}
    lora_b = {k: v for k, v in load_file(out / "adapter_model.safetensors").items() if "lora_B" in k}
    assert lora_b and any(float(v.abs().max()) > 0 for v in lora_b.values()), "the saved adapter is untrained"


def test_grpo_script_refuses_what_a_team_cannot_hold(assets, tmp_path):
    proc = _run(assets, tmp_path / "out", ["--importance_sampling_level", "sequence"])
    assert proc.returncode != 0
    (line,) = [ln for ln in proc.stdout.splitlines() if "importance_sampling_level" in ln and "Error" in ln]
    assert "ratios are per token" in line


def test_end_after_a_grpo_script_style_run(assets, tmp_path, monkeypatch):
    """TRL's script ends with `trainer.end()` (on transformers >= 5.18): after train() and save_model() it finishes
    the trackers through the accelerator, on the team trainer as on GRPOTrainer, and leaves the saved model whole."""
    import transformers
    from packaging.version import Version

    from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer
    from trl_collm.testing import CPU_RUN_SETTINGS

    script = swapped_grpo_script()
    if Version(transformers.__version__) >= Version("5.18.0"):
        assert "trainer.end()" in script  # else the script runs above never reach it
    args = MultiAgentMCConfig(
        **dict(CPU_RUN_SETTINGS, output_dir=str(tmp_path / "out")),
        max_completion_length=4,
        num_generations=2,
        per_device_train_batch_size=2,
        max_steps=1,
        loss_type="dapo",
    )
    trainer = MultiAgentMCTrainer(
        model=assets["model"],
        reward_funcs=lambda completions, **kw: [len(c) / 10 for c in completions],
        args=args,
        train_dataset=[{"prompt": p} for p in PROMPTS],
    )
    trainer.train()
    trainer.save_model(args.output_dir)
    ended = []
    original = trainer.accelerator.end_training
    monkeypatch.setattr(trainer.accelerator, "end_training", lambda: ended.append(True) or original())
    trainer.end()
    assert ended == [True]
    assert (tmp_path / "out" / "model.safetensors").is_file()
