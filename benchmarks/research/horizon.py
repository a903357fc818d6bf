"""The 1-turn and the 2-turn writing tables side by side (issue 46): does the horizon change how the methods compare?

writing-summary (1 turn) and writing-revise (a draft, then a revision, paid at the end only) are scored by the same
levels, so their returns share one scale (max 3). For each method and task, at the rate each table chose
(`choose_rates`, the tables' own rule): the held-out return after training (mean over seeds and its SD), the change
against the starting model paired play by play (mean over seeds), and the sample efficiency: the env steps at which
a run's training return (moving mean over 5 iterations, as the tables' "env steps to 80 %") first reaches one
common `--level`, the same level for both tasks. The held-out plays are made once, after training, so the training
return is the only measure along the way; an env step is one joint action (a 2-turn episode is 2).

    python benchmarks/research/horizon.py                     # both tables from docs/data/real_findings
    python benchmarks/research/horizon.py --one-turn-dir ~/.cache/trl-collm/rerun1 --level 1.0

It prints a Markdown table and writes its JSON (docs/data/real_findings/horizon-<size tags>.json) and a figure of
both tasks' training curves (docs/real_findings_horizon-<size tags>.png; solid 1 turn, dashed 2 turns).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from method_intervals import seed_spread  # noqa: E402
from paper_findings import plot_seed_band, saved_figure, steps_to  # noqa: E402
from real_findings import paired_change, settings, size_tag, start_path, sweep_runs  # noqa: E402
from warm_findings import choose_rates  # noqa: E402

TASKS = (("writing-summary", "1 turn"), ("writing-revise", "2 turns"))
METHODS = ("cc", "dc", "mc")


def cells(out_dir: str, task: str, compute: str, level: float, sweep_seed: int = 0) -> dict:
    """Per method of `task`'s table in `out_dir`: its chosen rate, seeds, held-out return (mean, SD over seeds),
    paired change (mean over seeds), and env steps to `level` per seed (None: not reached); plus the start."""
    s = settings(task, compute=compute)
    runs = sweep_runs(out_dir, task, s)
    chosen = choose_rates(runs, METHODS, sweep_seed)
    path = start_path(out_dir, task, s)
    start = json.load(open(path)) if os.path.exists(path) else None
    out = dict(task=task, size=size_tag(s), start=None if start is None else start["return_mean"], methods={})
    for m, lr in chosen.items():
        got = sorted((r for r in runs if r["method"] == m and r["lr"] == lr), key=lambda r: r["seed"])
        held = seed_spread([r["eval"]["return_mean"] for r in got])
        changes = [c["return_change"] for r in got if start for c in [paired_change(r["eval"], start)] if c]
        out["methods"][m] = dict(
            lr=lr,
            seeds=[r["seed"] for r in got],
            budget=max(r["env_steps"] for r in got),
            heldout=held["mean"],
            heldout_sd=held["sd"],
            change=sum(changes) / len(changes) if changes else None,
            steps_to_level=[steps_to(r["curve"], level) for r in got],
            runs=got,
        )
    return out


def _reach(steps: list[int | None]) -> str:
    got = [x for x in steps if x is not None]
    return f"{sum(got) / len(got):.0f} ({len(got)}/{len(steps)} seeds)" if got else f"not reached (0/{len(steps)})"


def format_table(tables: list[dict], labels: list[str], level: float) -> str:
    head = ["method"]
    for label in labels:
        head += [f"{label}: seeds", f"{label}: held-out (SD)", f"{label}: change", f"{label}: env steps to {level:g}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    start = ["starting model"]
    for t in tables:
        start += ["-", "-" if t["start"] is None else f"{t['start']:.3f}", "-", "-"]
    lines.append("| " + " | ".join(start) + " |")
    for m in METHODS:
        row = [m.upper()]
        for t in tables:
            c = t["methods"].get(m)
            if c is None:
                row += ["-", "-", "-", "-"]
                continue
            sd = "" if c["heldout_sd"] is None else f" ({c['heldout_sd']:.3f})"
            change = "-" if c["change"] is None else f"{c['change']:+.3f}"
            seeds = f"{len(c['seeds'])} (lr {c['lr']:g})"
            row += [seeds, f"{c['heldout']:.3f}{sd}", change, _reach(c["steps_to_level"])]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot(tables: list[dict], labels: list[str], level: float, path: str) -> None:
    with saved_figure(
        path,
        (7.0, 4.2),
        "writing: training return, 1 turn (solid) and 2 turns (dashed)\n"
        "line: mean over seeds of moving means (5 iterations); band: min-max",
        "environment steps (a 2-turn episode is 2)",
        "training return (max 3)",
    ) as ax:
        for t, label, style in zip(tables, labels, ("-", "--")):
            for m, c in t["methods"].items():
                plot_seed_band(ax, c["runs"], m)
                line = ax.get_lines()[-1]
                line.set_linestyle(style)
                line.set_label(f"{label}: {line.get_label()}")
        ax.axhline(level, color="grey", ls=":", lw=1, label=f"level {level:g} (env steps to it in the table)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--one-turn-dir", default="docs/data/real_findings", help="writing-summary's run files")
    p.add_argument("--two-turn-dir", default="docs/data/real_findings", help="writing-revise's run files")
    p.add_argument("--compute", default="bf16", choices=("fp32", "bf16"), help="the tables' training dtype")
    p.add_argument("--level", type=float, default=1.0, help="the training return both tasks' runs are timed to")
    p.add_argument("--out-dir", default="docs/data/real_findings", help="where the JSON goes")
    p.add_argument("--png-prefix", default="docs/real_findings", help="the figure's path prefix")
    a = p.parse_args()
    dirs = (a.one_turn_dir, a.two_turn_dir)
    tables = [cells(d, task, a.compute, a.level) for d, (task, _) in zip(dirs, TASKS)]
    labels = [label for _, label in TASKS]
    for d, t in zip(dirs, tables):
        print(f"{t['task']} ({t['size']}): {len(t['methods'])} methods with finished runs, from {d}")
    print(format_table(tables, labels, a.level))
    tag = "-".join(t["size"] for t in tables)
    os.makedirs(os.path.dirname(a.png_prefix) or ".", exist_ok=True)
    plot(tables, labels, a.level, f"{a.png_prefix}_horizon-{tag}.png")
    for t in tables:
        for c in t["methods"].values():
            c["runs"] = [f"{r['method']}-seed{r['seed']}" for r in c["runs"]]
    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, f"horizon-{tag}.json"), "w") as f:
        json.dump(dict(level=a.level, dirs=dirs, tables=tables), f, indent=1)


if __name__ == "__main__":
    main()
