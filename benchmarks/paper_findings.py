"""The paper's findings at small scale: CC vs DC vs MC on a dense single-turn task and a sparse 4-turn task.

Tiny random-init models (offline), equal environment-step budgets (one env step = one joint action scored by the
environment), several seeds. Writes per-run curves to a JSON file, a PNG per task (mean and min-max band over
seeds), and prints a table with the final return and the environment steps each method needs to reach 80% of the
best final return.

    python benchmarks/paper_findings.py                       # both tasks, 3 seeds (~20-30 min on 2 CPU cores)
    python benchmarks/paper_findings.py --smoke               # seconds: tiny budgets, 1 seed
    python benchmarks/paper_findings.py --tasks coord-penalty --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TASKS = {
    # name: (task options, env-step budget, description)
    "coord-penalty": ({}, 2048, "dense, 1 turn"),
    "coord-repeated": ({"turns": 4, "sparse": True}, 4096, "sparse, 4 turns"),
}
METHODS = ("cc", "dc", "mc")


def run_one(task_name: str, method: str, seed: int, budget: int, batch: int) -> dict:
    """One training run in this process; returns its curve (env steps -> mean episode return)."""
    import torch

    torch.set_num_threads(1)
    from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer, MultiAgentPPOConfig, MultiAgentPPOTrainer
    from trl_collm.tasks import get_task
    from trl_collm.testing import tiny_model_dir

    task = get_task(task_name)
    options = TASKS[task_name][0]
    turns = options.get("turns", task.num_turns)
    common = dict(
        output_dir=f"/tmp/trl_collm_findings/{task_name}-{method}-{seed}", agent_names=task.agent_names, num_turns=turns,
        learning_rate=1e-2, response_length=2, temperature=1.0, logging_steps=10**6, save_strategy="no", report_to=[],
        num_sample_generations=0, use_cpu=True, bf16=False, seed=seed, disable_tqdm=True,
    )
    if method == "mc":
        # G samples per prompt; per_branch keeps a 4-turn prompt at G x T env steps (a tree would cost G + ... + G^T).
        group = 4
        args = MultiAgentMCConfig(**common, num_generations=group, expansion="per_branch", per_device_train_batch_size=batch // group,
                                  total_episodes=max(1, budget // (turns * group)))
        trainer_cls = MultiAgentMCTrainer
    else:
        args = MultiAgentPPOConfig(**common, critic_type="centralized" if method == "cc" else "decentralized", kl_coef=0.0,
                                   num_ppo_epochs=2, per_device_train_batch_size=batch, total_episodes=max(1, budget // turns))
        trainer_cls = MultiAgentPPOTrainer
    trainer = trainer_cls(args=args, model=tiny_model_dir("tiny-qwen2"), train_dataset=task.load_dataset("train"),
                          env=task.make_env(**options))
    t0 = time.time()
    trainer.train()
    steps, curve = 0, []
    for m in trainer._metrics_history:
        # env steps of the iteration: MC counts its nodes; PPO plays batch episodes of objective/turns turns each
        steps += m["mc/nodes"] if "mc/nodes" in m else args.per_device_train_batch_size * m["objective/turns"]
        curve.append((steps, m["objective/scores"]))
    return dict(task=task_name, method=method, seed=seed, curve=curve, seconds=time.time() - t0)


def steps_to(curve, level, window=5):
    """First env-step count at which the moving mean (over `window` iterations) reaches `level`."""
    for i in range(len(curve)):
        chunk = [v for _, v in curve[max(0, i - window + 1) : i + 1]]
        if sum(chunk) / len(chunk) >= level:
            return curve[i][0]
    return None


def final(curve, window=5):
    tail = [v for _, v in curve[-window:]]
    return sum(tail) / len(tail)


def plot(results, task_name, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for method, colour in zip(METHODS, ("tab:blue", "tab:orange", "tab:green")):
        runs = [r["curve"] for r in results if r["task"] == task_name and r["method"] == method]
        if not runs:
            continue
        length = min(len(c) for c in runs)
        xs = [runs[0][i][0] for i in range(length)]
        smooth = [[sum(v for _, v in c[max(0, i - 4) : i + 1]) / len(c[max(0, i - 4) : i + 1]) for i in range(length)] for c in runs]
        mean = [sum(s[i] for s in smooth) / len(smooth) for i in range(length)]
        lo = [min(s[i] for s in smooth) for i in range(length)]
        hi = [max(s[i] for s in smooth) for i in range(length)]
        ax.plot(xs, mean, color=colour, label=f"{method.upper()} ({len(runs)} seeds)")
        ax.fill_between(xs, lo, hi, color=colour, alpha=0.2)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("mean episode return (moving mean of 5)")
    ax.set_title(f"{task_name}: {TASKS[task_name][2]}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--batch", type=int, default=16, help="episodes (PPO) or samples (MC: batch/G prompts x G) per iteration")
    p.add_argument("--budget-scale", type=float, default=1.0, help="multiply every task's env-step budget")
    p.add_argument("--out", default="docs/data/paper_findings.json")
    p.add_argument("--png-prefix", default="docs/paper_findings")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--child", nargs=3, metavar=("TASK", "METHOD", "SEED"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.smoke:
        a.seeds, a.budget_scale, a.out, a.png_prefix = [0], 1 / 32, "/tmp/paper_findings_smoke.json", "/tmp/paper_findings_smoke"
    if a.child:
        budget = int(TASKS[a.child[0]][1] * a.budget_scale)
        print(json.dumps(run_one(a.child[0], a.child[1], int(a.child[2]), budget, a.batch)))
        return
    from trl_collm.testing import tiny_model_dir

    tiny_model_dir("tiny-qwen2")
    results = []
    # Interleave methods within each seed so machine load drifts affect them alike.
    for task_name in a.tasks:
        for seed in a.seeds:
            for method in a.methods:
                cmd = [sys.executable, __file__, "--child", task_name, method, str(seed), "--batch", str(a.batch),
                       "--budget-scale", str(a.budget_scale)]
                out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
                if out.returncode != 0:
                    print(out.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"run {task_name}/{method}/{seed} failed")
                row = json.loads(out.stdout.strip().splitlines()[-1])
                results.append(row)
                print(f"  {task_name:15s} {method} seed {seed}: final {final(row['curve']):.3f} ({row['seconds']:.0f}s)", flush=True)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(results, f)
    print(f"\n{'task':15s} {'method':6s} {'final (mean / min / max over seeds)':38s} {'env steps to 80% of best final':32s}")
    for task_name in a.tasks:
        finals = {m: [final(r["curve"]) for r in results if r["task"] == task_name and r["method"] == m] for m in a.methods}
        best = max(sum(v) / len(v) for v in finals.values() if v)
        # "80% of the best final return", measured from where training starts (returns can be negative here):
        # the level start + 0.8 * (best - start), start = the mean return of the first iterations over all runs.
        starts = [sum(v for _, v in r["curve"][:5]) / len(r["curve"][:5]) for r in results if r["task"] == task_name]
        start = sum(starts) / len(starts)
        level = start + 0.8 * (best - start)
        print(f"{task_name}: start {start:.3f}, best final {best:.3f}, 80% level {level:.3f}")
        for m in a.methods:
            runs = [r for r in results if r["task"] == task_name and r["method"] == m]
            reach = [steps_to(r["curve"], level) for r in runs]
            reached = [x for x in reach if x is not None]
            reach_txt = (f"{sum(reached) / len(reached):.0f} (mean of {len(reached)}/{len(reach)} seeds that reached it)"
                         if reached else "not reached")
            f = finals[m]
            print(f"{task_name:15s} {m.upper():6s} {sum(f) / len(f):6.3f} / {min(f):6.3f} / {max(f):6.3f}{'':17s} {reach_txt}")
        try:
            plot(results, task_name, f"{a.png_prefix}_{task_name}.png")
        except ImportError:
            pass


if __name__ == "__main__":
    main()
