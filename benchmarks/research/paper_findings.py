"""The paper's findings at small scale: CC vs DC vs MC on a dense single-turn task and a sparse 4-turn task.

Tiny random-init models (offline), equal environment-step budgets (one env step = one joint action scored by the
environment), several seeds. Writes per-run curves to a JSON file, a PNG per task (mean and min-max band over
seeds), and prints a table with the final return and the environment steps each method needs to reach 80% of the
best final return.

    python benchmarks/research/paper_findings.py                       # both tasks, 3 seeds (~20-30 min on 2 CPU cores)
    python benchmarks/research/paper_findings.py --smoke               # seconds: tiny budgets, 1 seed
    python benchmarks/research/paper_findings.py --tasks coord-penalty --seeds 0 1 2 3 4
    python benchmarks/research/paper_findings.py --lrs 3e-3 1e-2 3e-2 --mc-lrs 1e-2 3e-2 1e-1 --reuse --jobs 2
                                                              # learning-rate sweep; adds a "tuned per method" table

With several learning rates, every method is run at each of its rates and the report adds a table where each method
uses the rate with its best mean final return over the seeds (chosen on the same seeds it is reported on, for every
method alike). --reuse keeps the runs already in --out (same task, method, seed, learning rate, budget and batch).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
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


DEFAULT_LR = 1e-2  # the equal rate of the first report (runs saved without an "lr" field used it)


def run_one(task_name: str, method: str, seed: int, budget: int, batch: int, lr: float = DEFAULT_LR) -> dict:
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
        output_dir=f"/tmp/trl_collm_findings/{task_name}-{method}-{seed}-{lr:g}",
        agent_names=task.agent_names,
        num_turns=turns,
        learning_rate=lr,
        response_length=2,
        temperature=1.0,
        logging_steps=10**6,
        save_strategy="no",
        report_to=[],
        num_sample_generations=0,
        use_cpu=True,
        bf16=False,
        seed=seed,
        disable_tqdm=True,
    )
    if method == "mc":
        # G samples per prompt; per_branch keeps a 4-turn prompt at G x T env steps (a tree would cost G + ... + G^T).
        group = 4
        args = MultiAgentMCConfig(
            **common,
            num_generations=group,
            expansion="per_branch",
            per_device_train_batch_size=batch // group,
            total_episodes=max(1, budget // (turns * group)),
        )
        trainer_cls = MultiAgentMCTrainer
    else:
        args = MultiAgentPPOConfig(
            **common,
            critic_type="centralized" if method == "cc" else "decentralized",
            kl_coef=0.0,
            num_ppo_epochs=2,
            per_device_train_batch_size=batch,
            total_episodes=max(1, budget // turns),
        )
        trainer_cls = MultiAgentPPOTrainer
    trainer = trainer_cls(
        args=args,
        model=tiny_model_dir("tiny-qwen2"),
        train_dataset=task.load_dataset("train"),
        env=task.make_env(**options),
    )
    t0 = time.time()
    trainer.train()
    steps, curve = 0, []
    for m in trainer._metrics_history:
        # env steps of the iteration: MC counts its nodes; PPO plays batch episodes of objective/turns turns each
        steps += m["mc/nodes"] if "mc/nodes" in m else args.per_device_train_batch_size * m["objective/turns"]
        curve.append((steps, m["objective/scores"]))
    return dict(
        task=task_name,
        method=method,
        seed=seed,
        lr=lr,
        budget=budget,
        batch=batch,
        curve=curve,
        seconds=time.time() - t0,
    )


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


COLOURS = dict(zip(METHODS, ("tab:blue", "tab:orange", "tab:green")))


@contextlib.contextmanager
def saved_figure(path, size, title, xlabel, ylabel):
    """Yields the axes of a new figure; on exit labels it, adds grid and legend, and saves it to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size)
    yield ax
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_seed_band(ax, runs, method):
    """One method's learning curves over seeds: the mean of each seed's moving mean (window 5) and its min-max band."""
    curves = [r["curve"] for r in runs]
    length = min(len(c) for c in curves)
    xs = [curves[0][i][0] for i in range(length)]
    smooth = [
        [sum(v for _, v in c[max(0, i - 4) : i + 1]) / len(c[max(0, i - 4) : i + 1]) for i in range(length)]
        for c in curves
    ]
    mean = [sum(s[i] for s in smooth) / len(smooth) for i in range(length)]
    lo = [min(s[i] for s in smooth) for i in range(length)]
    hi = [max(s[i] for s in smooth) for i in range(length)]
    label = f"{method.upper()}, lr {runs[0]['lr']:g} ({len(runs)} seeds)"
    ax.plot(xs, mean, color=COLOURS[method], label=label)
    ax.fill_between(xs, lo, hi, color=COLOURS[method], alpha=0.2)


def plot(results, task_name, path, title_extra=""):
    """Mean and min-max band over seeds of each method's runs in `results` (one learning rate per method)."""
    with saved_figure(
        path,
        (6.5, 3.8),
        f"{task_name}: {TASKS[task_name][2]}{title_extra}",
        "environment steps",
        "mean episode return (moving mean of 5)",
    ) as ax:
        for method in METHODS:
            runs = [r for r in results if r["task"] == task_name and r["method"] == method]
            if not runs:
                continue
            plot_seed_band(ax, runs, method)


def plot_lr(results, task_name, lrs, path):
    """Final return against the learning rate, per method (mean and min-max over seeds)."""
    with saved_figure(
        path,
        (5.5, 3.6),
        f"{task_name}: {TASKS[task_name][2]}",
        "learning rate",
        "final return (mean, min-max over seeds)",
    ) as ax:
        for method in METHODS:
            xs, mean, lo, hi = [], [], [], []
            for lr in sorted(lrs.get(method, [])):
                f = [
                    final(r["curve"])
                    for r in results
                    if r["task"] == task_name and r["method"] == method and r["lr"] == lr
                ]
                if f:
                    xs.append(lr), mean.append(sum(f) / len(f)), lo.append(min(f)), hi.append(max(f))
            if xs:
                ax.errorbar(
                    xs,
                    mean,
                    yerr=[[m - low for m, low in zip(mean, lo)], [h - m for m, h in zip(mean, hi)]],
                    color=COLOURS[method],
                    marker="o",
                    capsize=3,
                    label=method.upper(),
                )
        ax.set_xscale("log")


def _key(r) -> tuple:
    # Runs saved before the sweep existed carry no lr / budget / batch: they used 1e-2, the full budget and 16.
    return (
        r["task"],
        r["method"],
        int(r["seed"]),
        float(r.get("lr", DEFAULT_LR)),
        int(r.get("budget", TASKS[r["task"]][1])),
        int(r.get("batch", 16)),
    )


def report(results, task_name, methods, title):
    """Prints one table (final return, env steps to 80%) for `results`, one learning rate per method; returns rows."""
    finals = {m: [final(r["curve"]) for r in results if r["task"] == task_name and r["method"] == m] for m in methods}
    finals = {m: v for m, v in finals.items() if v}
    if not finals:
        return []
    best = max(sum(v) / len(v) for v in finals.values())
    # "80% of the best final return", measured from where training starts (returns can be negative here):
    # the level start + 0.8 * (best - start), start = the mean return of the first iterations over all runs.
    starts = [sum(v for _, v in r["curve"][:5]) / len(r["curve"][:5]) for r in results if r["task"] == task_name]
    start = sum(starts) / len(starts)
    level = start + 0.8 * (best - start)
    print(f"\n{title}\n{task_name}: start {start:.3f}, best final {best:.3f}, 80% level {level:.3f}")
    print(
        f"{'task':15s} {'method':6s} {'lr':>7s} {'final (mean / min / max over seeds)':38s} env steps to 80% of "
        "best final"
    )
    rows = []
    for m in finals:
        runs = [r for r in results if r["task"] == task_name and r["method"] == m]
        reach = [steps_to(r["curve"], level) for r in runs]
        reached = [x for x in reach if x is not None]
        reach_txt = (
            f"{sum(reached) / len(reached):.0f} (mean of {len(reached)}/{len(reach)} seeds that reached it)"
            if reached
            else "not reached"
        )
        f = finals[m]
        lr = runs[0].get("lr", DEFAULT_LR)
        print(
            f"{task_name:15s} {m.upper():6s} {lr:7.0e} {sum(f) / len(f):6.3f} / {min(f):6.3f} / "
            f"{max(f):6.3f}{'':17s} {reach_txt}"
        )
        rows.append(
            dict(
                task=task_name,
                method=m,
                lr=lr,
                final_mean=sum(f) / len(f),
                final_min=min(f),
                final_max=max(f),
                reach=reached,
                seeds=len(reach),
                level=level,
            )
        )
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument(
        "--lrs",
        nargs="+",
        type=float,
        default=[DEFAULT_LR],
        help="learning rates of CC and DC (and MC unless --mc-lrs)",
    )
    p.add_argument("--mc-lrs", nargs="+", type=float, default=None, help="learning rates of MC (default: --lrs)")
    p.add_argument(
        "--batch", type=int, default=16, help="episodes (PPO) or samples (MC: batch/G prompts x G) per iteration"
    )
    p.add_argument("--budget-scale", type=float, default=1.0, help="multiply every task's env-step budget")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (one CPU thread each)")
    p.add_argument("--reuse", action="store_true", help="keep the runs already in --out instead of running them again")
    p.add_argument(
        "--out", default=None, help="JSON of every run (default docs/data/paper_findings.json; /tmp for --smoke)"
    )
    p.add_argument("--png-prefix", default=None, help="plots go to PREFIX_<task>.png (default docs/paper_findings)")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--child", nargs=4, metavar=("TASK", "METHOD", "SEED", "LR"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.smoke:
        a.seeds, a.budget_scale = [0], 1 / 32
        a.out, a.png_prefix = a.out or "/tmp/paper_findings_smoke.json", a.png_prefix or "/tmp/paper_findings_smoke"
    a.out, a.png_prefix = a.out or "docs/data/paper_findings.json", a.png_prefix or "docs/paper_findings"
    if a.child:
        budget = int(TASKS[a.child[0]][1] * a.budget_scale)
        print(json.dumps(run_one(a.child[0], a.child[1], int(a.child[2]), budget, a.batch, float(a.child[3]))))
        return
    if a.jobs < 1:
        p.error("--jobs must be at least 1")
    from trl_collm.testing import tiny_model_dir

    tiny_model_dir("tiny-qwen2")
    lrs = {m: (a.mc_lrs or a.lrs) if m == "mc" else a.lrs for m in a.methods}
    # Interleave methods within each seed so machine load drifts affect them alike.
    plan = [
        (t, m, seed, lr)
        for t in a.tasks
        for seed in a.seeds
        for lr in sorted({x for v in lrs.values() for x in v})
        for m in a.methods
        if lr in lrs[m]
    ]
    key_of = lambda x: (x[0], x[1], x[2], x[3], int(TASKS[x[0]][1] * a.budget_scale), a.batch)  # noqa: E731
    results = []
    if os.path.exists(a.out):
        # Runs of other settings in the file are always kept; without --reuse the planned ones are run again.
        with open(a.out) as f:
            results = json.load(f)
        if not a.reuse:
            planned = {key_of(x) for x in plan}
            results = [r for r in results if _key(r) not in planned]
    done = {_key(r) for r in results}
    plan = [x for x in plan if key_of(x) not in done]
    print(f"{len(plan)} runs to do ({len(results)} other runs kept in {a.out})", flush=True)

    def launch(job):
        task_name, method, seed, lr = job
        cmd = [
            sys.executable,
            __file__,
            "--child",
            task_name,
            method,
            str(seed),
            repr(lr),
            "--batch",
            str(a.batch),
            "--budget-scale",
            str(a.budget_scale),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if out.returncode != 0:
            raise RuntimeError(f"run {task_name}/{method}/seed {seed}/lr {lr:g} failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        for row in pool.map(launch, plan):
            results.append(row)
            with open(a.out, "w") as f:  # after every run: an interrupted sweep keeps what it did (see --reuse)
                json.dump(results, f)
            print(
                f"  {row['task']:15s} {row['method']} seed {row['seed']} lr {row['lr']:g}: final "
                f"{final(row['curve']):.3f} "
                f"({row['seconds']:.0f}s)",
                flush=True,
            )

    budget_of = {t: int(TASKS[t][1] * a.budget_scale) for t in a.tasks}
    mine = [
        r
        for r in results
        if r["task"] in a.tasks
        and r["method"] in a.methods
        and int(r["seed"]) in a.seeds
        and _key(r)[4] == budget_of[r["task"]]
        and _key(r)[5] == a.batch
    ]
    for r in mine:
        r.setdefault("lr", DEFAULT_LR)
    common_lrs = sorted(set.intersection(*(set(v) for v in lrs.values())))
    for task_name in a.tasks:
        for lr in common_lrs:
            equal = [r for r in mine if r["task"] == task_name and r["lr"] == lr]
            report(equal, task_name, a.methods, f"== equal learning rate {lr:g} ==")
            if lr == (DEFAULT_LR if DEFAULT_LR in common_lrs else common_lrs[0]):
                try:
                    plot(equal, task_name, f"{a.png_prefix}_{task_name}.png", f", lr {lr:g} for all")
                except ImportError:
                    pass
        if any(len(v) > 1 for v in lrs.values()):
            chosen = {}
            for m in a.methods:
                score = {
                    lr: [
                        final(r["curve"]) for r in mine if r["task"] == task_name and r["method"] == m and r["lr"] == lr
                    ]
                    for lr in lrs[m]
                }
                score = {lr: sum(v) / len(v) for lr, v in score.items() if v}
                if score:
                    chosen[m] = max(score, key=score.get)
                    print(
                        f"{task_name} {m.upper()}: mean final by lr "
                        + ", ".join(f"{lr:g}: {v:.3f}" for lr, v in sorted(score.items()))
                    )
            tuned = [r for r in mine if r["task"] == task_name and chosen.get(r["method"]) == r["lr"]]
            report(tuned, task_name, a.methods, "== each method at its best learning rate ==")
            try:
                plot(tuned, task_name, f"{a.png_prefix}_{task_name}_tuned.png", ", each method at its best lr")
                plot_lr(mine, task_name, lrs, f"{a.png_prefix}_{task_name}_lr.png")
            except ImportError:
                pass


if __name__ == "__main__":
    main()
