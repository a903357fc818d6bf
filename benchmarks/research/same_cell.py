"""One table cell run twice, on two codes, CPUs or dtypes: do the two sets of seeds differ beyond seed noise?

A real-model run's outcome moves a lot with its random draws (docs/real_findings.md: one seed of one method moved by
up to 0.7 of held-out return between two codes), so "the same cell, re-run" is compared as two groups of seeds, never
seed by seed. For one method of one task at one rate, each side gathers its finished runs from one or more folders
(the layout `real_findings.py --out-dir` writes), and this prints each seed's held-out return, each side's mean and
SD over seeds, the difference of the means with method_intervals' bootstrap interval (seeds drawn within each side,
plays within each run, each play paired with the starting model's play of the same row where the run files hold
them) and its exact permutation test on the seed means.

    # the 1-turn CC cell: the original table's code (46af5d3) against the 2-turn study's (e04adbc), 5 seeds each
    python benchmarks/research/same_cell.py --task writing-summary --method cc \\
        --first docs/data/real_findings docs/data/real_findings_code_check/46af5d3 \\
        --second docs/data/real_findings_rerun docs/data/real_findings_code_check/e04adbc
    # MC in float32 on an AVX2 CPU against bf16 on an avx512_bf16 one
    python benchmarks/research/same_cell.py --task writing-summary --method mc \\
        --first docs/data/real_findings_fp32 --second docs/data/real_findings --compute fp32 bf16

Both sides must pair against the same starting model (its plays equal row by row) for the play-level bootstrap; where
they do not, the interval is over seeds only and the output says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from method_intervals import (  # noqa: E402
    bootstrap_difference,
    method_samples,
    play_changes,
    seed_permutation,
    seed_spread,
)
from real_findings import TASKS, settings, start_path, sweep_runs  # noqa: E402


def gather(dirs: list[str], task: str, method: str, lr: float, compute: str) -> tuple[list[dict], dict | None]:
    """The finished runs of `method` at `lr` in `dirs` (one per seed) and the first starting model found there."""
    s = settings(task, compute=compute)
    runs, start, seen = [], None, {}
    for d in dirs:
        if not os.path.isdir(os.path.join(d, task)):
            raise SystemExit(f"error: {d} has no {task}/ folder of run files (a real_findings.py --out-dir)")
        for r in sweep_runs(d, task, s):
            if r["method"] != method or abs(r["lr"] - lr) > 1e-12:
                continue
            if r["seed"] in seen:
                raise SystemExit(
                    f"error: {method} seed {r['seed']} at lr {lr:g} is in both {seen[r['seed']]} and {d}: "
                    "give each seed's run in one folder only"
                )
            seen[r["seed"]] = d
            runs.append(r)
        path = start_path(d, task, s)
        if start is None and os.path.exists(path):
            with open(path) as f:
                start = json.load(f)
    return sorted(runs, key=lambda r: r["seed"]), start


def compare(first: list[dict], second: list[dict], start_first: dict | None, start_second: dict | None) -> dict:
    """Both sides' seeds and spreads, the difference of their means, its bootstrap interval and permutation test."""
    a = [r["eval"]["return_mean"] for r in first]
    b = [r["eval"]["return_mean"] for r in second]
    # the plays pair across the two sides only when both sides' starting models played the same rows alike
    start_gap = play_changes(start_first, start_second) if start_first else None
    same_start = start_gap is not None and not any(start_gap)
    samples_a, paired_a = method_samples(first, start_first)
    samples_b, paired_b = method_samples(second, start_second)
    paired = same_start and paired_a and paired_b
    if not paired:  # both sides as whole-run values, so they are resampled alike
        samples_a, samples_b = [[v] for v in a], [[v] for v in b]
    over = "seeds and plays, each play paired with the starting model's" if paired else "seeds only"
    boot = bootstrap_difference(samples_a, samples_b)
    return dict(
        first=dict(seed_spread(a), seeds=[r["seed"] for r in first], returns=a),
        second=dict(seed_spread(b), seeds=[r["seed"] for r in second], returns=b),
        difference=boot["difference"],
        low=boot["low"],
        high=boot["high"],
        over=over,
        permutation=seed_permutation(a, b),
    )


def lines(result: dict, names: tuple[str, str]) -> list[str]:
    out = []
    for side, name in zip(("first", "second"), names):
        r = result[side]
        each = ", ".join(f"seed {s} {v:.3f}" for s, v in zip(r["seeds"], r["returns"]))
        sd = "-" if r["sd"] is None else f"{r['sd']:.3f}"
        out.append(f"{name}: {len(r['seeds'])} seeds, mean {r['mean']:.3f} (SD {sd}); {each}")
    p = result["permutation"]
    out.append(
        f"first - second = {result['difference']:+.3f} [95 % interval {result['low']:+.3f}, {result['high']:+.3f}] "
        f"(bootstrap over {result['over']}); seed means alone: permutation p = {p['p']:.3f} over {p['splits']} splits, "
        f"the smallest these seeds allow {p['floor']:.3f}"
    )
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True, choices=list(TASKS))
    p.add_argument("--method", required=True, choices=("cc", "dc", "mc"))
    p.add_argument("--lr", type=float, default=3e-3, help="the rate of the runs compared (default 3e-3)")
    p.add_argument("--first", nargs="+", required=True, help="folders of the first side's run files")
    p.add_argument("--second", nargs="+", required=True, help="folders of the second side's run files")
    p.add_argument(
        "--compute",
        nargs="+",
        default=["bf16"],
        choices=("fp32", "bf16"),
        help="training dtype of both sides, or of each",
    )
    a = p.parse_args(argv)
    if len(a.compute) > 2:
        p.error("--compute takes one dtype for both sides or one per side")
    computes = a.compute * 2 if len(a.compute) == 1 else a.compute
    first, start_first = gather(a.first, a.task, a.method, a.lr, computes[0])
    second, start_second = gather(a.second, a.task, a.method, a.lr, computes[1])
    for runs, dirs in ((first, a.first), (second, a.second)):
        if not runs:
            p.error(f"no finished {a.method} run at lr {a.lr:g} ({a.task}) in {' '.join(dirs)}")
    result = compare(first, second, start_first, start_second)
    print(f"{a.task}, {a.method.upper()} at lr {a.lr:g}: held-out return per seed")
    for line in lines(result, (f"first ({' + '.join(a.first)})", f"second ({' + '.join(a.second)})")):
        print(line)
    return result


if __name__ == "__main__":
    main()
