"""MultiAgentMCTrainer with one agent against TRL's GRPOTrainer: same task, model, reward, G, completion length,
prompts per step, learning rate and beta = 0, side by side, alternating runs.

    python benchmarks/compare/vs_trl/mc_vs_grpo.py                          # tiny model, 3 rounds, CPU
    python benchmarks/compare/vs_trl/mc_vs_grpo.py --size small --rounds 2 --json docs/data/vs_trl_mc_grpo_cpu.json

Each run is a fresh process (`--side ours|ours-plain|trl`), so its peak RSS is its own. Both sides sample G
completions of exactly --completion-length tokens per prompt (a stop token that is never sampled), reward them with
the same function (the share of the letter "e" in the text), normalise within the group by mean and std, and take one
optimizer step per batch (AdamW, the same learning rate, no KL, no reference model). Ours runs its default
`loss_type="reinforce"` (on-policy: one forward + backward per completion, no old log-probs), which is the arithmetic
of GRPO with `num_iterations=1` (TRL then reuses the detached current log-probs instead of an old-policy pass); the
loss normalisations differ (ours: sum over tokens, mean over completions; TRL's default `loss_type`: its own), which
changes the gradient's scale, not the work. `ours-plain` is ours with `share_prompt_prefix=False`.

Reported per side: completions/s over `train()` (median over rounds), peak RSS, and the mean reward per step
(learning curve, averaged over rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))  # benchmarks/compare/<this folder>
PROMPTS = [
    f"Write {w} words about the {t}:" for w in ("three", "five", "seven", "ten") for t in ("sea", "tree", "cat", "city")
]


def reward_text(text: str) -> float:
    return text.count("e") / max(1, len(text))


def run_side(a) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer

    from trl_collm.testing import tiny_model_dir

    torch.set_num_threads(a.threads)
    path = tiny_model_dir(f"{a.size}-qwen2", size=a.size) if a.size != "tiny" else tiny_model_dir("tiny-qwen2")
    tok = AutoTokenizer.from_pretrained(path)
    never = len(tok)  # a token id the model never samples: every completion runs to the full length
    data = Dataset.from_dict({"prompt": (PROMPTS * (1 + a.prompts * a.steps // len(PROMPTS)))[: a.prompts * a.steps]})
    out = tempfile.mkdtemp(prefix=f"vs-trl-{a.side}-")
    common = {
        "output_dir": out,
        "learning_rate": a.lr,
        "temperature": 1.0,
        "top_p": 1.0,
        "use_cpu": True,
        "bf16": False,
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 1,
        "seed": a.seed,
        "disable_tqdm": True,
        "weight_decay": 0.0,
    }
    torch.manual_seed(a.seed)
    if a.side == "trl":
        from trl import GRPOConfig, GRPOTrainer

        def reward(prompts, completions, **kwargs):
            return [reward_text(c) for c in completions]

        args = GRPOConfig(
            num_generations=a.group,
            per_device_train_batch_size=a.prompts * a.group,
            max_completion_length=a.completion_length,
            beta=0.0,
            max_steps=a.steps,
            generation_kwargs={"eos_token_id": never},
            gradient_checkpointing=False,  # TRL turns it on by default; ours does not checkpoint
            **common,
        )
        trainer = GRPOTrainer(model=path, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok)
    else:
        from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer

        def reward(prompts, completions, **kwargs):
            return [reward_text(c[0]) for c in completions]

        args = MultiAgentMCConfig(
            num_agents=1,
            num_generations=a.group,
            per_device_train_batch_size=a.prompts,
            response_length=a.completion_length,
            beta=0.0,
            scale_advantages=True,
            total_episodes=a.prompts * a.steps,
            stop_token_id=never,
            share_prompt_prefix=a.side != "ours-plain",
            **common,
        )
        trainer = MultiAgentMCTrainer(args=args, model=path, reward_funcs=reward, train_dataset=data)
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    if a.side == "trl":
        curve = [h["reward"] for h in trainer.state.log_history if "reward" in h]
        length = statistics.mean(
            h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h
        )
    else:
        curve = [h["objective/scores"] for h in trainer._metrics_history]
        length = statistics.mean(h["response_length"] for h in trainer._metrics_history)
    # Both generate exactly --completion-length tokens (the stop token is never sampled); TRL's loss mask also ends at
    # the tokenizer's EOS when the model samples it mid-way (rarely), so its mean length can be slightly lower.
    assert length > 0.9 * a.completion_length, (
        f"{a.side}: completions averaged {length} tokens of {a.completion_length}"
    )
    completions = a.steps * a.prompts * a.group
    return {
        "side": a.side,
        "train_s": seconds,
        "completions": completions,
        "completions_per_s": completions / seconds,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "reward_curve": curve,
        "mean_completion_tokens": length,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", choices=["ours", "ours-plain", "trl"], default=None, help="(internal) run one side")
    p.add_argument("--sides", nargs="+", default=["ours", "trl", "ours-plain"])
    p.add_argument("--size", default="tiny")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--group", type=int, default=4, help="G: completions per prompt")
    p.add_argument("--completion-length", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if a.side:
        print(json.dumps(run_side(a)))
        return
    forwarded = [
        f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items() if k not in ("side", "sides", "rounds", "json")
    ]
    env = dict(
        os.environ,
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        WANDB_MODE="disabled",
    )
    runs: dict[str, list[dict]] = {s: [] for s in a.sides}
    for r in range(a.rounds):
        for side in a.sides if r % 2 == 0 else list(reversed(a.sides)):  # alternate who goes first
            proc = subprocess.run(
                [sys.executable, __file__, "--side", side, *forwarded],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                raise SystemExit(f"{side} failed:\n{proc.stderr[-4000:]}")
            runs[side].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"round {r} {side}: {runs[side][-1]['completions_per_s']:.1f} completions/s", flush=True)
    summary = {}
    for side, rs in runs.items():
        curves = [r["reward_curve"] for r in rs]
        summary[side] = {
            "completions_per_s": statistics.median(r["completions_per_s"] for r in rs),
            "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in rs),
            "reward_curve": [statistics.mean(c[i] for c in curves) for i in range(min(len(c) for c in curves))],
        }
    print(f"\n{'side':<11} {'completions/s':>13} {'x TRL':>6} {'peak RSS MiB':>12}  reward per step (mean of rounds)")
    base = summary.get("trl", {}).get("completions_per_s")
    for side, s in summary.items():
        ratio = f"{s['completions_per_s'] / base:.2f}" if base else "-"
        curve = " ".join(f"{v:.3f}" for v in s["reward_curve"])
        print(f"{side:<11} {s['completions_per_s']:>13.1f} {ratio:>6} {s['peak_rss_mib']:>12.0f}  {curve}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "summary": summary, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
