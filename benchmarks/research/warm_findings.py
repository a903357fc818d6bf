"""The paper's findings from a warm start: CC vs DC vs MC on building-str (StrBuild, 2 builders, 4 turns: the paper's
headline task) and on writing-tags (a small conditional writing task of ours), from tiny models fine-tuned with
trl.SFTTrainer on a noisy expert's transcripts (`trl_collm.warmstart`).

Every method trains from the same warm-start folder at the same environment-step budget (one env step = one joint
action scored by the env: a building episode is 4 steps; an MC prompt expanded per branch is G x 4). The learning rate
is chosen per method the same way for all, as paper_findings.py does: each method runs at each of its rates on the
sweep seed, the rate with the best final training return is kept, and the other seeds run at that rate. After
training, every team plays the task's eval rows (sampled at temperature 1, a fixed seed) for the table's scores; the
warm start is scored the same way (the "raw model" row of the paper's Table 1).

    python benchmarks/research/warm_findings.py --jobs 2                  # both tasks, 3 seeds (see docs/warm_start.md)
    python benchmarks/research/warm_findings.py --smoke                 # toy warm starts and budgets, 1 seed (~1-3 min)
    python benchmarks/research/warm_findings.py --tasks writing-tags --reuse

Writes OUT_DIR/warm_findings_<task>.json (every run's curve and scores, the warm start's scores, the table),
PREFIX_<task>_curves.png (mean and min-max band
over seeds), PREFIX_building-str_renders.png (the warm start and each method's sweep-seed team on the same targets)
and prints the tables.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from method_intervals import seed_spread
from paper_findings import final, plot_seed_band, saved_figure, steps_to  # one implementation of each measure

METHODS = ("cc", "dc", "mc")
RENDER_TARGETS = ("ICML", "LI")
EVAL_SEED = 1234
# The paper's Table 1 (second-hand, ../shared/paper.md): StrBuild IoU % and Adj % (Adj: lower is better).
PAPER_STRBUILD = {"warm": (36.6, 0.9), "mc": (50.6, 13.3), "dc": (44.6, 7.6), "cc": (68.5, 7.3)}
TASKS = {
    # (the warm start's recipe: trl_collm.warmstart.RECIPES) RL: env-step budget, PPO episodes (MC: samples) per
    # iteration, max new tokens; eval: repeats of every eval row
    "building-str": dict(
        budget=128,
        batch=8,
        response_length=48,
        repeats=1,
        lrs=(1e-3, 3e-3),
        mc_lrs=(1e-3, 3e-3, 1e-2),
        describe="StrBuild, 2 builders, 4 turns (dense per-turn reward)",
    ),
    "writing-tags": dict(
        budget=1024,
        batch=16,
        response_length=16,  # the longest tags are 11 tokens, + EOS
        repeats=8,
        lrs=(3e-4, 1e-3, 3e-3),  # 3e-4 too: 1e-3 was every method's best of the building grid here
        mc_lrs=(3e-4, 1e-3, 3e-3, 1e-2),
        describe="2 taggers, 1 turn, the right tag depends on the post",
    ),
}
SMOKE = dict(episodes=6, epochs=1.0, budget=8, batch=4, repeats=1)


def settings(task: str, smoke: bool, budget: int | None = None) -> dict:
    s = dict(TASKS[task])
    if smoke:
        s.update(SMOKE, response_length=min(s["response_length"], 12))
    if budget is not None:
        s["budget"] = int(budget)
    return s


def warm_config(task: str, smoke: bool):
    from trl_collm.warmstart import WarmStartConfig

    return WarmStartConfig.for_task(task, **(dict(episodes=SMOKE["episodes"], epochs=SMOKE["epochs"]) if smoke else {}))


def _task(name):
    if name == "writing-tags":
        import trl_collm.tasks.tags  # noqa: F401  (registers the task)
    from trl_collm.tasks import get_task

    return get_task(name)


def evaluate(task_name, model, s, **kwargs) -> dict:
    from trl_collm.warmstart import evaluate_building, evaluate_tags

    rows = list(_task(task_name).load_dataset("eval"))
    fn = evaluate_building if task_name == "building-str" else evaluate_tags
    return fn(
        model if isinstance(model, str) else None,
        rows,
        repeats=s["repeats"],
        seed=EVAL_SEED,
        task=task_name,
        max_new_tokens=s["response_length"],
        **kwargs,
    )


def method_config(method: str, task, s: dict, lr: float, seed: int, output_dir: str, **extra):
    """(config, trainer class) of one method on an equal env-step budget (`s`: budget, batch, response_length): PPO
    (CC / DC: 1 epoch, no KL) or MC (G = 4, per_branch, so a T-turn prompt costs G x T env steps). Shared with
    real_findings.py and bench_workload.py, so all three train the methods the same way; `extra` overrides settings
    that are not the method (checkpointing, the compute dtype, a benchmark's stop token)."""
    from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer, MultiAgentPPOConfig, MultiAgentPPOTrainer

    turns = task.num_turns
    common = dict(
        output_dir=output_dir,
        agent_names=task.agent_names,
        num_turns=turns,
        learning_rate=lr,
        response_length=s["response_length"],
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
    common.update(extra)
    if method == "mc":
        group = 4
        return MultiAgentMCConfig(
            **common,
            num_generations=group,
            expansion="per_branch",
            per_device_train_batch_size=max(1, s["batch"] // group),
            total_episodes=max(1, s["budget"] // (turns * group)),
        ), MultiAgentMCTrainer
    return MultiAgentPPOConfig(
        **common,
        critic_type="centralized" if method == "cc" else "decentralized",
        kl_coef=0.0,
        num_ppo_epochs=1,
        per_device_train_batch_size=s["batch"],
        total_episodes=max(1, s["budget"] // turns),
    ), MultiAgentPPOTrainer


def run_one(
    task_name: str,
    warm: str,
    method: str,
    seed: int,
    lr: float,
    smoke: bool,
    render_dir: str | None,
    budget: int | None = None,
) -> dict:
    """One training run in this process: the curve (env steps -> mean training return) and the final team's scores."""
    import torch

    torch.set_num_threads(1)
    s = settings(task_name, smoke, budget)
    task = _task(task_name)
    args, trainer_cls = method_config(
        method, task, s, lr, seed, f"/tmp/trl_collm_warm_findings/{task_name}-{method}-{seed}-{lr:g}"
    )
    trainer = trainer_cls(args=args, model=warm, train_dataset=task.load_dataset("train"), env=task.make_env())
    t0 = time.time()
    trainer.train()
    seconds = time.time() - t0
    steps, curve, critic_ev = 0, [], []
    for m in trainer._metrics_history:
        steps += m["mc/nodes"] if "mc/nodes" in m else args.per_device_train_batch_size * m["objective/turns"]
        curve.append((steps, m["objective/scores"]))
        # how much of the return's variance the critic(s) explain, per iteration (PPO only; mean over critics)
        ev = [v for k, v in m.items() if k.endswith("/critic/explained_variance")]
        if ev:
            critic_ev.append((steps, sum(ev) / len(ev)))
    team = trainer.team.eval()
    scores = evaluate(task_name, team, s, team=team)
    if render_dir:
        render(team, render_dir, f"{method}-seed{seed}-lr{lr:g}-b{s['budget']}", s["response_length"])
    return dict(
        task=task_name,
        method=method,
        seed=seed,
        lr=lr,
        budget=s["budget"],
        batch=s["batch"],
        smoke=smoke,
        curve=curve,
        critic_ev=critic_ev,
        eval=scores,
        seconds=seconds,
    )


def render(team_or_path, folder, tag, max_new_tokens) -> list[str]:
    """One PNG per render target: the team's final StrBuild world at the eval seed (missing cells dashed)."""
    from trl_collm.warmstart import replay_building, rollout_team

    rows = [{"target": t, "kind": "str"} for t in RENDER_TARGETS]
    is_path = isinstance(team_or_path, str)
    _, roll = rollout_team(
        team_or_path if is_path else None,
        rows,
        seed=EVAL_SEED,
        max_new_tokens=max_new_tokens,
        team=None if is_path else team_or_path,
    )
    os.makedirs(folder, exist_ok=True)
    return [
        env.render_png(os.path.join(folder, f"{tag}-{row['target']}.png"))
        for row, env in zip(rows, replay_building(rows, roll))
    ]


def combine_renders(folder, tags, labels, path):
    """Rows = teams, columns = targets, from the per-run PNGs of `render`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(tags), len(RENDER_TARGETS), figsize=(5.0 * len(RENDER_TARGETS), 2.2 * len(tags)), squeeze=False
    )
    for i, (tag, label) in enumerate(zip(tags, labels)):
        for j, target in enumerate(RENDER_TARGETS):
            ax = axes[i][j]
            ax.axis("off")
            png = os.path.join(folder, f"{tag}-{target}.png")
            if os.path.exists(png):
                ax.imshow(plt.imread(png))
            if j == 0:
                ax.set_title(label, loc="left", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(results, task_name, path, warm_return):
    with saved_figure(
        path,
        (6.5, 3.8),
        f"{task_name} from a warm start\n{TASKS[task_name]['describe']}",
        "environment steps",
        "training return (moving mean of 5)",
    ) as ax:
        for method in METHODS:
            runs = [r for r in results if r["method"] == method]
            if not runs:
                continue
            plot_seed_band(ax, runs, method)
        ax.axhline(warm_return, color="grey", ls="--", lw=1, label="warm start (eval)")


def _stats(values):
    return sum(values) / len(values), min(values), max(values)


# (column name, eval key or function, decimals)
COLUMNS = {
    "building-str": [
        ("IoU %", "iou_pct", 1),
        ("Adj %", "adj_pct", 1),
        ("return (max 2)", "return_mean", 3),
        ("valid lines", "valid_rate", 2),
    ],
    "writing-tags": [
        ("return (max 2)", "return_mean", 3),
        ("forum tag right", lambda e: e["own_tag_rate"]["forum"], 2),
        ("subject tag right", lambda e: e["own_tag_rate"]["subject"], 2),
        ("both right", "perfect_rate", 2),
        ("teammate's tag (mean of both)", lambda e: sum(e["teammate_tag_rate"].values()) / 2, 2),
    ],
}


def kept_runs(saved: list[dict], reuse: bool, methods, smoke: bool, budget: int) -> list[dict]:
    """The saved runs a call keeps: all with --reuse; without it, all but those it runs again (its methods at its
    size). A call that trains one method must not drop the others' runs from the JSON it rewrites."""
    if reuse:
        return list(saved)
    return [r for r in saved if not (r["method"] in methods and bool(r["smoke"]) == smoke and r["budget"] == budget)]


def other_sizes(saved: list[dict], path: str, task: str, budget: int, smoke: bool) -> str | None:
    """Why this call must not write `path`: it holds runs of another size, whose table and figure this call's would
    replace (one table per file); None when it may. The message names the way out."""
    sizes = sorted({(r["budget"], bool(r["smoke"])) for r in saved} - {(budget, smoke)})
    if not sizes:
        return None
    held = ", ".join(f"budget {b}" + (" (smoke)" if sm else "") for b, sm in sizes)
    return (
        f"{path} holds {task} runs at {held}; this call's budget {budget} would replace that table and its figure. "
        f"Give this size a folder and prefix of its own (--out-dir docs/data/warm_findings_{budget} --png-prefix "
        f"docs/warm_findings_{budget}), or remove the file"
    )


def choose_rates(runs, methods, sweep_seed) -> dict:
    """Per method, the rate with the best final training return on the sweep seed (among the rates run so far)."""
    chosen = {}
    for m in methods:
        score = {r["lr"]: final(r["curve"]) for r in runs if r["method"] == m and r["seed"] == sweep_seed}
        if score:
            chosen[m] = max(score, key=score.get)
    return chosen


def table_runs(results: list[dict], task_name: str, smoke: bool, budget: int, sweep_seed: int):
    """Every method's runs of this task and size at its chosen rate (`choose_rates`), whichever call ran them:
    (chosen rates, runs)."""
    same = [r for r in results if r["task"] == task_name and bool(r["smoke"]) == smoke and r["budget"] == budget]
    chosen = choose_rates(same, METHODS, sweep_seed)
    return chosen, [r for r in same if r["lr"] == chosen.get(r["method"])]


def _value(e, key):
    return key(e) if callable(key) else e[key]


def table(results, task_name, warm_eval, columns=None):
    """Per method: the eval columns (mean, min, max over seeds) and env steps to 80%.

    Steps to 80%: the first env-step count at which a run's moving mean (5 iterations) of the training return reaches
    start + 0.8 * (best - start), where start = the mean training return of the first 5 iterations over all runs
    (the warm start, as the trainers sample it) and best = the best method's mean final training return (mean of
    the last 5 iterations)."""
    finals = {m: [final(r["curve"]) for r in results if r["method"] == m] for m in METHODS}
    finals = {m: v for m, v in finals.items() if v}
    best = max(sum(v) / len(v) for v in finals.values())
    starts = [sum(v for _, v in r["curve"][:5]) / len(r["curve"][:5]) for r in results]
    start = sum(starts) / len(starts)
    level = start + 0.8 * (best - start)
    cols = columns or COLUMNS[task_name]
    rows = [
        dict(
            method="warm",
            seeds=1,
            lr=None,
            reach=None,
            train_final=None,
            cols=[(_value(warm_eval, k),) * 3 for _, k, _ in cols],
        )
    ]
    for m in finals:
        runs = [r for r in results if r["method"] == m]
        rows.append(
            dict(
                method=m,
                seeds=len(runs),
                lr=runs[0]["lr"],
                train_final=_stats(finals[m]),
                reach=[steps_to(r["curve"], level) for r in runs],
                cols=[_stats([_value(r["eval"], k) for r in runs]) for _, k, _ in cols],
                # the between-seed spread: sample SD of each column and of the final training return
                sd=[seed_spread([_value(r["eval"], k) for r in runs])["sd"] for _, k, _ in cols],
                train_sd=seed_spread(finals[m])["sd"],
            )
        )
    return dict(task=task_name, start=start, best=best, level=level, columns=[c for c, _, _ in cols], rows=rows)


def format_table(t, columns=None, start_name="warm start (SFT)", extra=None, sd_columns=0) -> str:
    """Markdown of `table`'s result. `extra`: (header, method -> cell) for a last column (default: the paper's
    StrBuild figures on building-str); the start row's method is "warm". `sd_columns`: how many of the first eval
    columns (and, when any, the final training return) also show the sample SD over seeds: "mean (SD s; min to
    max)"."""
    cols = columns or COLUMNS[t["task"]]
    if extra is None and t["task"] == "building-str":
        extra = ("paper IoU / Adj", lambda m: "{} / {}".format(*PAPER_STRBUILD[m]))
    head = ["method", "lr", "seeds"] + t["columns"] + ["train return (final)", "env steps to 80%"]
    head += [extra[0]] if extra else []
    lines = [
        f"steps to 80%: level {t['level']:.3f} = start {t['start']:.3f} + 0.8 x (best final {t['best']:.3f} - start)",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]

    def fmt(r, x, d, sd=None):
        if r["seeds"] == 1:
            return f"{x[0]:.{d}f}"
        spread = f"SD {sd:.{d}f}; " if sd is not None else ""
        return f"{x[0]:.{d}f} ({spread}{x[1]:.{d}f} to {x[2]:.{d}f})"

    for r in t["rows"]:
        if r["reach"] is None:
            reach = "-"
        else:
            got = [x for x in r["reach"] if x is not None]
            reach = f"{sum(got) / len(got):.0f} ({len(got)}/{len(r['reach'])} seeds)" if got else "not reached"
        name = start_name if r["method"] == "warm" else r["method"].upper()
        cells = [name, "-" if r["lr"] is None else f"{r['lr']:g}", str(r["seeds"])]
        sds = [sd if i < sd_columns else None for i, sd in enumerate(r.get("sd") or [None] * len(r["cols"]))]
        cells += [fmt(r, x, d, sd) for x, (_, _, d), sd in zip(r["cols"], cols, sds)]
        train_sd = r.get("train_sd") if sd_columns else None
        cells += ["-" if r["train_final"] is None else fmt(r, r["train_final"], 3, train_sd), reach]
        if extra:
            cells.append(extra[1](r["method"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--lrs", nargs="+", type=float, default=None, help="learning rates of CC and DC (default per task)")
    p.add_argument(
        "--mc-lrs",
        nargs="+",
        type=float,
        default=None,
        help="learning rates of MC (default per task: CC's grid reaching 3x higher, as MC's tuned rates on the "
        "matrix games were; here MC's best was CC's)",
    )
    p.add_argument("--sweep-seed", type=int, default=0, help="the seed every rate runs on; the others use the best")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (separate processes, one CPU thread each)")
    p.add_argument(
        "--reuse",
        action="store_true",
        help="keep every run already in the JSON (without: this call's methods at its size run again; the other "
        "methods' runs stay)",
    )
    p.add_argument("--warm-root", default="/tmp/trl_collm_warm", help="warm-start folders: ROOT/<task>[-smoke]")
    p.add_argument(
        "--out-dir", default=None, help="JSON per task: OUT_DIR/warm_findings_<task>.json (default docs/data)"
    )
    p.add_argument(
        "--png-prefix", default=None, help="figures go to PREFIX_<task>_curves.png, ... (default docs/warm_findings)"
    )
    p.add_argument("--smoke", action="store_true", help="toy warm starts and budgets, sweep seed only")
    p.add_argument("--budget", type=int, default=None, help="env steps per run (default per task; part of a run's key)")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="no new runs: tables and figures from the runs in the JSON (with --reuse), missing seeds left out",
    )
    p.add_argument("--child", nargs=5, metavar=("TASK", "METHOD", "SEED", "LR", "RENDER_DIR"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.smoke:
        a.seeds = [a.sweep_seed]
        a.out_dir, a.png_prefix = a.out_dir or "/tmp/warm_findings_smoke", a.png_prefix or "/tmp/warm_findings_smoke"
    a.out_dir, a.png_prefix = a.out_dir or "docs/data", a.png_prefix or "docs/warm_findings"

    def warm_dir(task):
        return os.path.join(a.warm_root, task + ("-smoke" if a.smoke else ""))

    renders = "/tmp/trl_collm_warm_renders" + ("-smoke" if a.smoke else "")  # per-run PNGs; docs get the combined one
    if a.child:
        task_name, method, seed, lr, render_dir = a.child
        row = run_one(
            task_name,
            warm_dir(task_name),
            method,
            int(seed),
            float(lr),
            a.smoke,
            None if render_dir == "-" else render_dir,
            a.budget,
        )
        print(json.dumps(row))
        return
    if a.jobs < 1:
        p.error("--jobs must be at least 1")
    from trl_collm.warmstart import make_warm_start

    blob, results = {}, []

    def out_of(task_name):
        return os.path.join(a.out_dir, f"warm_findings_{task_name}.json")

    def save():
        os.makedirs(a.out_dir, exist_ok=True)
        for task_name, part in blob.items():  # after every run: an interrupted sweep keeps what it did (--reuse)
            mine = dict(part, runs=[r for r in results if r["task"] == task_name])
            with open(out_of(task_name), "w") as f:
                json.dump(mine, f)

    def key(r):
        return r["task"], r["method"], int(r["seed"]), float(r["lr"]), bool(r["smoke"]), r["budget"]

    def launch(job):
        task_name, method, seed, lr = job
        s = settings(task_name, a.smoke, a.budget)
        done = [r for r in results if key(r) == (task_name, method, seed, lr, a.smoke, s["budget"])]
        if done:
            return done[0]
        if a.report_only:
            return None
        render_dir = renders if task_name == "building-str" and seed == a.sweep_seed else "-"
        cmd = (
            [
                sys.executable,
                os.path.abspath(__file__),
                "--child",
                task_name,
                method,
                str(seed),
                repr(lr),
                render_dir,
                "--warm-root",
                a.warm_root,
            ]
            + (["--smoke"] if a.smoke else [])
            + (["--budget", str(a.budget)] if a.budget else [])
        )
        out = subprocess.run(
            cmd, check=False, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1")
        )
        if out.returncode != 0:
            raise RuntimeError(f"run {task_name}/{method}/seed {seed}/lr {lr:g} failed:\n{out.stderr[-3000:]}")
        row = json.loads(out.stdout.strip().splitlines()[-1])
        results.append(row)
        save()
        print(
            f"  {task_name} {method} seed {seed} lr {lr:g}: train final {final(row['curve']):.3f}, "
            f"eval return {row['eval']['return_mean']:.3f} ({row['seconds']:.0f}s)",
            flush=True,
        )
        return row

    for task_name in a.tasks:
        s = settings(task_name, a.smoke, a.budget)
        blob[task_name] = {"warm_config": str(warm_config(task_name, a.smoke))}
        saved = {}
        if os.path.exists(out_of(task_name)):
            with open(out_of(task_name)) as f:
                saved = json.load(f)
            clash = other_sizes(saved.get("runs", []), out_of(task_name), task_name, s["budget"], a.smoke)
            if clash:
                p.error(clash)
            results += kept_runs(saved.get("runs", []), a.reuse, a.methods, a.smoke, s["budget"])
        t0 = time.time()
        warm = make_warm_start(warm_dir(task_name), warm_config(task_name, a.smoke), progress=not a.smoke)
        print(f"{task_name}: warm start {warm} ({time.time() - t0:.0f}s)", flush=True)
        if a.reuse and saved.get("warm") and saved.get("warm_config") == blob[task_name]["warm_config"]:
            warm_eval = saved["warm"]  # the same warm start, scored with the same seed: no need to play it again
        else:
            warm_eval = evaluate(task_name, warm, s)
        blob[task_name]["warm"] = warm_eval
        if task_name == "building-str" and not os.path.exists(os.path.join(renders, f"warm-{RENDER_TARGETS[0]}.png")):
            render(warm, renders, "warm", s["response_length"])
        print(
            f"{task_name}: warm start eval {json.dumps({k: v for k, v in warm_eval.items() if k != 'per_target'})}",
            flush=True,
        )
        lrs = {m: list(a.lrs or s["lrs"]) for m in a.methods}
        if "mc" in lrs:
            lrs["mc"] = list(a.mc_lrs or s["mc_lrs"])
        # 1) the sweep seed at every rate (methods interleaved so machine-load drifts hit them alike)
        sweep = [
            (task_name, m, a.sweep_seed, lr)
            for i in range(max(map(len, lrs.values())))
            for m in a.methods
            for lr in lrs[m][i : i + 1]
        ]
        with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
            rows = [r for r in pool.map(launch, sweep) if r is not None]
        chosen = choose_rates(rows, a.methods, a.sweep_seed)
        for m in chosen:
            score = {r["lr"]: final(r["curve"]) for r in rows if r["method"] == m}
            print(
                f"{task_name} {m.upper()}: final training return by lr "
                + ", ".join(f"{lr:g}: {v:.3f}" for lr, v in sorted(score.items()))
                + f" -> {chosen[m]:g}",
                flush=True,
            )
        # 2) the other seeds at each method's chosen rate
        rest = [(task_name, m, seed, chosen[m]) for seed in a.seeds if seed != a.sweep_seed for m in chosen]
        with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
            rows += [r for r in pool.map(launch, rest) if r is not None]
        # The table and its figure: every method in the file, not only this call's (kept_runs).
        chosen_all, mine = table_runs(results, task_name, a.smoke, s["budget"], a.sweep_seed)
        t = table(mine, task_name, warm_eval)
        t.update(
            chosen=chosen_all,
            seeds=a.seeds,
            sweep_seed=a.sweep_seed,
            lrs=lrs,
            warm_config=str(warm_config(task_name, a.smoke)),
        )
        blob[task_name]["table"] = t
        save()
        print(f"\n== {task_name}: each method at its best learning rate ==\n{format_table(t)}\n", flush=True)
        try:
            plot_curves(mine, task_name, f"{a.png_prefix}_{task_name}_curves.png", warm_eval["return_mean"])
            if task_name == "building-str":
                order = [m for m in ("mc", "dc", "cc") if m in chosen]
                combine_renders(
                    renders,
                    ["warm"] + [f"{m}-seed{a.sweep_seed}-lr{chosen[m]:g}-b{s['budget']}" for m in order],
                    ["warm start"] + [f"{m.upper()} (seed {a.sweep_seed})" for m in order],
                    f"{a.png_prefix}_{task_name}_renders.png",
                )
        except ImportError:
            pass
    print(f"wrote {', '.join(out_of(t) for t in a.tasks)} and the figures {a.png_prefix}_*.png")


if __name__ == "__main__":
    main()
