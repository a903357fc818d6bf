"""Drop-in check: a script shaped like TRL's `examples/scripts/ppo/ppo.py` (ours: `examples/ppo.py`, whose only
trl-collm line is the import) runs with TRL PPO's command-line flags, offline, on tiny models saved to disk.

Each case runs the script in a subprocess (as a user would), then checks the saved policy, the logged metric names
and the `generate_completions()` printout.
"""

from __future__ import annotations

import glob
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
SCRIPT = REPO / "examples" / "ppo.py"

TRAIN_PROMPTS = [
    "The team works together",
    "Agent one writes",
    "def aux(x): return",
    "Two agents are",
    "The critic gives",
    "Hello world",
    "Question: what is",
    "The reward is",
    "A good team",
    "Each agent sees",
]
TEST_PROMPTS = ["The planner writes", "Write a short story", "one plus one is"]

# The metric names TRL's last PPOTrainer logged (every one of them must appear in the log).
TRL_PPO_METRICS = [
    "eps",
    "objective/kl",
    "objective/entropy",
    "objective/non_score_reward",
    "objective/rlhf_reward",
    "objective/scores",
    "policy/approxkl_avg",
    "policy/clipfrac_avg",
    "loss/policy_avg",
    "loss/value_avg",
    "val/clipfrac_avg",
    "policy/entropy_avg",
    "val/ratio",
    "val/ratio_var",
    "val/num_eos_tokens",
    "lr",
    "episode",
]

LORA_FLAGS = ["--use_peft", "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj"]


def _make_assets(root, family=None):
    from trl_collm.testing import save_tiny_model

    sft = save_tiny_model(root, "sft", kind="causal_lm", seed=0, family=family)
    rm = save_tiny_model(root, "reward", kind="value", seed=1, family=family)
    data = root / "data"
    data.mkdir()
    for split, prompts in (("train", TRAIN_PROMPTS), ("test", TEST_PROMPTS)):
        with open(data / f"{split}.jsonl", "w") as f:
            for p in prompts:
                f.write(json.dumps({"prompt": p}) + "\n")
    return {"root": root, "sft": sft, "reward": rm, "data": str(data)}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """An SFT policy folder, a reward/value model folder and a local dataset folder (train.jsonl / test.jsonl)."""
    return _make_assets(tmp_path_factory.mktemp("dropin"))


def _run_script(assets, output_dir: Path, extra: list[str]) -> subprocess.CompletedProcess:
    # TRL PPO's flags, unchanged (the last PPOTrainer's docs and tests used the same set).
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--dataset_name",
        assets["data"],
        "--dataset_test_split",
        "test",
        "--output_dir",
        str(output_dir),
        "--learning_rate",
        "3e-6",
        "--per_device_train_batch_size",
        "2",
        "--gradient_accumulation_steps",
        "1",
        "--total_episodes",
        "8",
        "--num_ppo_epochs",
        "1",
        "--num_mini_batches",
        "1",
        "--local_rollout_forward_batch_size",
        "4",
        "--response_length",
        "8",
        "--missing_eos_penalty",
        "1.0",
        "--stop_token",
        "eos",
        "--sft_model_path",
        assets["sft"],
        "--reward_model_path",
        assets["reward"],
        "--model_name_or_path",
        assets["sft"],
        "--use_cpu",
        "--bf16",
        "False",
        "--report_to",
        "none",
        "--num_sample_generations",
        "0",
        "--save_strategy",  # the last iteration's checkpoint carries trainer_state.json: every logged key
        "steps",
        "--save_steps",
        "4",
        "--logging_steps",
        "1",
        *extra,
    ]
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        CI="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",  # tiny models: one thread is fastest and avoids contention with parallel tests
        HF_DATASETS_CACHE=str(assets["root"] / "datasets-cache"),
    )
    return subprocess.run(
        cmd, cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=HANG_GUARD_S
    )


def _check_log(log: str, output_dir: Path):
    """TRL PPO's metric names in every logged iteration (trainer_state.json's log_history, as transformers writes it),
    one console line per iteration, and the completions printed after training."""
    (state,) = glob.glob(str(output_dir / "checkpoint-*" / "trainer_state.json"))
    history = [h for h in json.loads(Path(state).read_text())["log_history"] if "objective/kl" in h]
    # total_episodes / (per_device_train_batch_size * grad_acc * num_mini_batches) = 8 / 2 = 4 logged iterations.
    assert len(history) == 4, history
    missing = [m for m in TRL_PPO_METRICS if any(m not in h for h in history)]
    assert not missing, f"TRL PPO metric names missing from the logs: {missing}\n{history[-1]}"
    assert len(re.findall(r"^iteration [1-4]/4 ", log, flags=re.M)) == 4, log[-4000:]  # the console line
    # generate_completions() ran on the eval (test) split after training: one printed episode per test prompt.
    completions = re.findall(r"^-- episode \d+ turn 0 reward", log, flags=re.M)
    assert len(completions) == len(TEST_PROMPTS), log[-4000:]


def _changed(a: dict, b: dict, keys) -> int:
    return sum(not torch.equal(a[k].float(), b[k].float()) for k in keys)


def test_trl_ppo_script_full_finetune(assets, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    proc = _run_script(assets, out, [])
    assert proc.returncode == 0, proc.stdout[-6000:]
    _check_log(proc.stdout, out)

    # The policy is saved at the output_dir root, as TRL's save_model did, and reloads as a plain causal LM.
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file(), sorted(os.listdir(out))
    model = AutoModelForCausalLM.from_pretrained(out)
    sft = AutoModelForCausalLM.from_pretrained(assets["sft"])
    trained, initial = model.state_dict(), sft.state_dict()
    assert trained.keys() == initial.keys()
    assert _changed(trained, initial, initial.keys()) > 0, "PPO left every policy weight unchanged"
    # The file on disk is what changed, not just a reload artifact.
    assert (
        _changed(
            load_file(out / "model.safetensors"),
            load_file(Path(assets["sft"]) / "model.safetensors"),
            load_file(out / "model.safetensors").keys(),
        )
        > 0
    )


def test_trl_ppo_script_lora(assets, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    proc = _run_script(assets, out, LORA_FLAGS)
    assert proc.returncode == 0, proc.stdout[-6000:]
    _check_log(proc.stdout, out)

    # With PEFT the output_dir root holds the adapter (as TRL's PPO saved it), loadable on the SFT base.
    files = sorted(os.listdir(out))
    assert "adapter_config.json" in files, files
    assert {"adapter_model.safetensors", "adapter_model.bin"} & set(files), files
    with open(out / "adapter_config.json") as f:
        adapter_config = json.load(f)
    assert adapter_config["r"] == 4
    assert set(adapter_config["target_modules"]) == {"q_proj", "v_proj"}

    base = AutoModelForCausalLM.from_pretrained(assets["sft"])
    model = PeftModel.from_pretrained(base, out)
    lora_b = {k: v for k, v in model.state_dict().items() if "lora_B" in k}
    assert lora_b, "no LoRA weights were loaded"
    # LoRA B starts at zero: any non-zero entry means the adapter was trained and saved.
    assert any(v.abs().max() > 0 for v in lora_b.values()), "the saved adapter is untrained (lora_B all zero)"
    merged = model.merge_and_unload().state_dict()
    initial = AutoModelForCausalLM.from_pretrained(assets["sft"]).state_dict()
    changed = [k for k in initial if not torch.equal(merged[k], initial[k])]
    assert changed and all(("q_proj" in k or "v_proj" in k) for k in changed), changed


@pytest.mark.parametrize(
    "family,flags",
    [("qwen", []), ("neox", []), ("llama", []), ("llama", LORA_FLAGS)],
    ids=["qwen-pad-is-eos", "neox-no-pad", "llama-no-pad-no-spare-row", "llama-lora"],
)
def test_trl_ppo_script_with_real_tokenizer_shapes(tmp_path, family, flags):
    """TRL's script always adds a "[PAD]" token and passes that tokenizer as processing_class, without resizing any
    model: the policy, value and reward models must all be read through it. With the Llama shape the new pad id has
    no embedding row in any of the three models."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assets = _make_assets(tmp_path / "assets", family)
    base = AutoTokenizer.from_pretrained(assets["sft"])
    assert (base.pad_token_id == base.eos_token_id) if family == "qwen" else base.pad_token is None
    rows = AutoModelForCausalLM.from_pretrained(assets["sft"]).get_input_embeddings().num_embeddings
    assert (rows == len(base)) if family == "llama" else rows > len(base)  # where the script's [PAD] lands

    out = tmp_path / "out"
    proc = _run_script(assets, out, flags)
    assert proc.returncode == 0, proc.stdout[-6000:]
    _check_log(proc.stdout, out)
    saved = AutoTokenizer.from_pretrained(out)
    assert saved.pad_token == "[PAD]" and saved.pad_token_id == len(base)  # the script's tokenizer is what was saved
