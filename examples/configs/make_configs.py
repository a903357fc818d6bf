"""Write every example config: examples/configs/<task>/{cc,dc,mc}-{gpu,cpu}.yaml, from the one table below.

    python examples/configs/make_configs.py          # rewrites the YAML files next to this script
    python examples/configs/make_configs.py --check  # exits 1 if a committed file differs from what it would write

Each YAML is a TrlParser config for `trl-collm ppo` (cc, dc) or `trl-collm mc` (mc): its keys are fields of
`TaskArguments` (trl_collm/cli/common.py), of `MultiAgentPPOConfig` / `MultiAgentMCConfig` (trl_collm/trainers/
ppo_config.py, mc_config.py) and of TRL's `ModelConfig`. Command-line flags override the file.

- GPU files: a real base model in bf16 with LoRA (rank 16 on all linear layers), so the team is one adapter per
  agent on one shared base and the critic is one more adapter plus a value head (`critic_placement:
  shared_base_adapter`); the paper's update rules (`preset: collm` for cc/dc, `preset: magrpo` for mc).
- CPU files: the offline tiny random-init model (`model_name_or_path: tiny`), small batches, few episodes and rows:
  a smoke run of about a minute on 2 cores (for the 1-turn coord games, the larger learning rate of the quickstart;
  raise --total_episodes to let the team learn).
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

ALGOS = {
    "cc": "CoLLM-CC: PPO-style actors with one centralized critic over all agents' prompts",
    "dc": "CoLLM-DC: PPO-style actors, one decentralized critic per agent (each sees its own prompt only)",
    "mc": "Monte-Carlo, critic-free (MAGRPO-style): group-mean baseline over num_generations samples",
}

LEARN_NOTE = "a short run: pass --total_episodes 1024 (examples/quickstart.py's length) to train the team longer"

# One row per registered task. gpu: base model, response_length and the per-device batch; cpu: the smoke settings.
# `turns` is the task's number of turns (TaskSpec.num_turns), written explicitly into every file.
TASKS = {
    "writing-summary": dict(
        turns=1,
        model="Qwen/Qwen3-1.7B",
        gpu_len=256,
        gpu_batch=8,
        gpu_episodes=4096,
        cpu=dict(response_length=8, train_limit=8, eval_limit=4, batch=4, episodes=8, mc_batch=2, mc_episodes=4),
    ),
    "writing-intro": dict(
        turns=1,
        model="Qwen/Qwen3-1.7B",
        gpu_len=256,
        gpu_batch=8,
        gpu_episodes=4096,
        cpu=dict(response_length=8, train_limit=8, eval_limit=4, batch=4, episodes=8, mc_batch=2, mc_episodes=4),
    ),
    "writing-revise": dict(  # ours: writing-summary over 2 turns, paid at the end (issue 28's multi-turn task)
        turns=2,
        model="Qwen/Qwen3-1.7B",
        gpu_len=256,
        gpu_batch=8,
        gpu_episodes=4096,
        cpu=dict(response_length=8, train_limit=8, eval_limit=4, batch=4, episodes=8, mc_batch=2, mc_episodes=4),
    ),
    "writing-tags": dict(  # ours, a small conditional task (docs/warm_start.md); best from a warm start
        turns=1,
        model="Qwen/Qwen3-1.7B",
        gpu_len=16,
        gpu_batch=16,
        gpu_episodes=4096,
        cpu=dict(response_length=8, train_limit=8, eval_limit=4, batch=4, episodes=8, mc_batch=2, mc_episodes=4),
    ),
    "code-humaneval": dict(
        turns=2,
        model="Qwen/Qwen2.5-Coder-3B",
        gpu_len=384,
        gpu_batch=4,
        gpu_episodes=1056,
        cpu=dict(response_length=16, train_limit=4, eval_limit=2, batch=2, episodes=4, mc_batch=1, mc_episodes=2),
    ),
    "building-str": dict(
        turns=4,
        model="Qwen/Qwen3-4B-Instruct-2507",
        gpu_len=256,
        gpu_batch=4,
        gpu_episodes=1000,
        # I, C, M, L: the one-letter targets have the shortest prompts (~630 tiny-model tokens per builder; the
        # centralized critic reads both builders' prompts plus feedback, under the tiny model's 2048 positions).
        cpu=dict(
            response_length=8,
            train_limit=2,
            eval_limit=2,
            batch=2,
            episodes=2,
            mc_batch=1,
            mc_episodes=1,
            task_options='{"max_listed": 4}',
            dataset_source="I,L",
        ),
        mc_gpu=dict(expansion="per_branch"),
        mc_cpu=dict(expansion="per_branch"),
    ),
    "building-house": dict(
        turns=4,
        model="Qwen/Qwen3-4B-Instruct-2507",
        gpu_len=256,
        gpu_batch=4,
        gpu_episodes=600,
        # The hut and the tower are the smallest blueprints (~950 and ~1080 tiny-model tokens); shorter feedback lists
        # keep later turns short.
        cpu=dict(
            response_length=8,
            train_limit=2,
            eval_limit=2,
            batch=2,
            episodes=2,
            mc_batch=1,
            mc_episodes=1,
            task_options='{"max_listed": 4}',
            dataset_source="hut,tower",
        ),
        mc_gpu=dict(expansion="per_branch"),
        mc_cpu=dict(expansion="per_branch"),
    ),
    "coord-climbing": dict(
        turns=1,
        model="Qwen/Qwen3-0.6B",
        gpu_len=8,
        gpu_batch=32,
        gpu_episodes=4096,
        cpu=dict(
            response_length=2,
            train_limit=64,
            eval_limit=16,
            batch=16,
            episodes=256,
            mc_batch=8,
            mc_episodes=64,
            learn=True,
            note=LEARN_NOTE,
        ),
    ),
    "coord-penalty": dict(
        turns=1,
        model="Qwen/Qwen3-0.6B",
        gpu_len=8,
        gpu_batch=32,
        gpu_episodes=4096,
        cpu=dict(
            response_length=2,
            train_limit=64,
            eval_limit=16,
            batch=16,
            episodes=256,
            mc_batch=8,
            mc_episodes=64,
            learn=True,
            note=LEARN_NOTE,
        ),
    ),
    "coord-numbers": dict(
        turns=1,
        model="Qwen/Qwen3-0.6B",
        gpu_len=8,
        gpu_batch=32,
        gpu_episodes=4096,
        cpu=dict(
            response_length=2,
            train_limit=64,
            eval_limit=16,
            batch=16,
            episodes=256,
            mc_batch=8,
            mc_episodes=64,
            learn=True,
            note=LEARN_NOTE,
        ),
    ),
    "coord-repeated": dict(
        turns=4,
        model="Qwen/Qwen3-0.6B",
        gpu_len=8,
        gpu_batch=16,
        gpu_episodes=2048,
        cpu=dict(
            response_length=2,
            train_limit=16,
            eval_limit=8,
            batch=8,
            episodes=16,
            mc_batch=2,
            mc_episodes=4,
            learn=True,
            note="a short run (the sparse 4-turn game needs far more episodes to learn)",
        ),
        # G^T = 256 leaves per prompt in tree mode is cheap at 8 tokens on the GPU; per_branch keeps the CPU run short.
        mc_cpu=dict(expansion="per_branch"),
    ),
}


def _value(v) -> str:
    """One YAML scalar, quoted only where YAML would read it as something else (e.g. "no" -> 'no')."""
    import yaml

    if isinstance(v, float) and v != 0 and abs(v) < 1e-3:
        return f"{v:.1e}".replace("e-0", "e-")
    text = yaml.safe_dump(v, default_flow_style=True, width=10_000)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def _emit(header: list[str], items: list[tuple]) -> str:
    lines = [f"# {h}" if h else "#" for h in header]
    for item in items:
        if item is None:
            lines.append("")
            continue
        key, value, *comment = item
        text = _value(value)
        line = f"{key}: {text}"
        if comment:
            line = f"{line:33s} # {comment[0]}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def gpu_config(task: str, row: dict, algo: str) -> str:
    items = [
        ("task", task),
        ("output_dir", f"outputs/{task}-{algo}"),
        None,
        ("model_name_or_path", row["model"]),
        ("use_peft", True, "one LoRA adapter per agent on one shared base"),
        ("lora_r", 16),
        ("lora_alpha", 32),
        ("lora_dropout", 0.0),
        ("lora_target_modules", "all-linear"),
        ("bf16", True),
        None,
        ("num_turns", row["turns"]),
        ("response_length", row["gpu_len"]),
    ]
    if algo in ("cc", "dc"):
        items += [
            ("preset", "collm", "the paper's update rule (docs/algorithm.md)"),
            ("critic_type", "centralized" if algo == "cc" else "decentralized"),
        ]
        if algo == "cc":
            items.append(("centralized_value", "team", "one value for the team, as the reference"))
        items += [
            ("critic_placement", "shared_base_adapter", "the critic = one more adapter + a value head"),
            ("per_device_train_batch_size", row["gpu_batch"]),
            ("total_episodes", row["gpu_episodes"]),
        ]
    else:
        items += [
            ("preset", "magrpo", "MAGRPO's update rule (docs/algorithm.md)"),
            ("num_generations", 4),
        ]
        for k, v in row.get("mc_gpu", {}).items():
            items.append((k, v, "G*T generations per prompt instead of G^T (4 turns)"))
        items += [
            (
                "per_device_train_batch_size",
                max(1, row["gpu_batch"] // 4),
                "prompts; each gives num_generations samples",
            ),
            ("total_episodes", max(1, row["gpu_episodes"] // 4)),
        ]
    items += [
        None,
        ("logging_steps", 1),
        ("save_strategy", "steps"),
        ("save_steps", 100),
        ("report_to", "tensorboard"),
        ("seed", 0),
    ]
    header = [
        f"{task} / {algo} on one GPU: {ALGOS[algo]}.",
        f"Base {row['model']} in bf16, LoRA r16 on all linear layers.",
        f"trl-collm {'ppo' if algo != 'mc' else 'mc'} --config examples/configs/{task}/{algo}-gpu.yaml",
        "Logs to TensorBoard: pip install 'trl-collm[tensorboard]' (or pass --report_to none).",
    ]
    return _emit(header, items)


def cpu_config(task: str, row: dict, algo: str) -> str:
    c = row["cpu"]
    learn = c.get("learn", False)
    items = [
        ("task", task),
    ]
    if c.get("task_options"):
        items.append(("task_options", c["task_options"], "shorter feedback lists: prompts stay short"))
    if c.get("dataset_source"):
        items.append(("dataset_source", c["dataset_source"], "the targets with the shortest prompts"))
    items += [
        ("train_limit", c["train_limit"]),
        ("eval_limit", c["eval_limit"]),
        ("output_dir", f"outputs/{task}-{algo}"),
        None,
        ("model_name_or_path", "tiny", "the offline tiny-model factory (no download)"),
        ("use_cpu", True),
        ("bf16", False),
        None,
        ("num_turns", row["turns"]),
        ("response_length", c["response_length"]),
        ("temperature", 1.0),
    ]
    if algo in ("cc", "dc"):
        items += [
            ("critic_type", "centralized" if algo == "cc" else "decentralized"),
            ("learning_rate", 1e-2 if learn else 1e-3),
            ("num_ppo_epochs", 2 if learn else 1),
            ("kl_coef", 0.0),
            ("per_device_train_batch_size", c["batch"]),
            ("total_episodes", c["episodes"]),
        ]
    else:
        items += [
            ("learning_rate", 1e-2 if learn else 1e-3),
            ("num_generations", 4 if learn else 2),
        ]
        for k, v in row.get("mc_cpu", {}).items():
            items.append((k, v, "G*T generations per prompt instead of G^T"))
        items += [
            ("per_device_train_batch_size", c["mc_batch"], "prompts; each gives num_generations samples"),
            ("total_episodes", c["mc_episodes"]),
        ]
    items += [
        None,
        ("logging_steps", 1 if not learn else 4),
        ("save_strategy", "no"),
        ("report_to", "none"),
        ("num_sample_generations", 0),
        ("seed", 0),
    ]
    what = (
        c.get("note") or "learns the game"
        if learn
        else "a smoke run (mechanics only: a random tiny model cannot do the task)"
    )
    header = [
        f"{task} / {algo}, offline on CPU: {ALGOS[algo]}.",
        f"Tiny random-init agents, about a minute on 2 cores; {what}.",
        f"trl-collm {'ppo' if algo != 'mc' else 'mc'} --config examples/configs/{task}/{algo}-cpu.yaml",
    ]
    return _emit(header, items)


def all_configs() -> dict[str, str]:
    """relative path -> YAML text, for every task x algorithm x device."""
    out = {}
    for task, row in TASKS.items():
        for algo in ALGOS:
            out[f"{task}/{algo}-gpu.yaml"] = gpu_config(task, row, algo)
            out[f"{task}/{algo}-cpu.yaml"] = cpu_config(task, row, algo)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="compare with the files on disk instead of writing")
    p.add_argument("--dir", default=HERE)
    a = p.parse_args(argv)
    stale = []
    for rel, text in all_configs().items():
        path = os.path.join(a.dir, rel)
        if a.check:
            if not os.path.isfile(path) or open(path).read() != text:
                stale.append(rel)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    if a.check and stale:
        print("out of date (run python examples/configs/make_configs.py):\n  " + "\n  ".join(stale))
        return 1
    print(f"{'checked' if a.check else 'wrote'} {len(all_configs())} configs under {a.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
