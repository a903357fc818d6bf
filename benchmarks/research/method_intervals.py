"""How sure a table is that one method beats another: the between-seed spread of each method's held-out return, and
a bootstrap interval on the difference of two methods' held-out returns.

The interval resamples both sources of noise a table has: the seeds (a method's runs, drawn with replacement within
the method) and the plays (each drawn run's held-out plays, drawn with replacement within the run). Where the run
files hold per-play scores paired with the starting model's plays (the same rows at the same sampling seed), a
play's value is its change against the starting model's play of the same row, so a row's own difficulty leaves the
noise; the starting model's return is common to both methods, so the difference of the mean changes is the
difference of the held-out returns. Where a run file holds no per-play scores, each run is one value (its held-out
return) and the interval is over seeds only; the line says so.

Percentile interval, RESAMPLES draws from numpy's default generator at a fixed seed (BOOTSTRAP_SEED): the same run
files give the same interval, digit for digit. With 3 seeds a method has only 10 distinct seed draws, and a
bootstrap over n values understates their spread by about a factor sqrt((n - 1) / n): read the interval as a
guide to how far apart the methods are, not as an exact 95 % coverage.

Beside it, a check that leaves the plays out and cannot understate the seeds: an exact permutation test on the seed
means (each run one value, its held-out return; every way of splitting the pooled runs into two groups of the
methods' sizes, `seed_permutation`). With 3 seeds against 3 there are 20 splits, so its two-sided p is never below
0.10: a table of 3 seeds a method cannot pass it at 0.05, and the line prints that floor beside the p.
"""

from __future__ import annotations

import itertools

RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
LEVEL = 0.95


def seed_spread(values: list[float]) -> dict:
    """Mean, sample standard deviation over seeds (None for one seed), min and max of one method's values."""
    n = len(values)
    mean = sum(values) / n
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5 if n > 1 else None
    return dict(seeds=n, mean=mean, sd=sd, min=min(values), max=max(values))


def play_changes(after: dict, before: dict | None) -> list[float] | None:
    """Per play, the trained team's score minus the starting model's on the same row at the same sampling seed; None
    when the two evaluations are not paired (no per-play records, other rows, another sampling seed)."""
    if not before:
        return None
    a, b = after.get("plays"), before.get("plays")
    if not a or not b or len(a) != len(b) or after.get("eval_seed") != before.get("eval_seed"):
        return None
    if [p["row"] for p in a] != [p["row"] for p in b]:
        return None
    return [x["total"] - y["total"] for x, y in zip(a, b)]


def _method_draws(rng, runs: list[list[float]], resamples: int):
    """Per bootstrap draw, one method's mean over `len(runs)` runs drawn with replacement, each run's value the mean
    of its plays drawn with replacement (a run of one value is a run without plays to draw)."""
    import numpy as np

    k = len(runs)
    picks = rng.integers(0, k, size=(resamples, k))  # which run fills each seed slot
    total = np.zeros(resamples)
    for slot in range(k):
        for j, plays in enumerate(runs):
            rows = np.flatnonzero(picks[:, slot] == j)
            values = np.asarray(plays, dtype=float)
            drawn = rng.integers(0, len(values), size=(len(rows), len(values)))
            total[rows] += values[drawn].mean(axis=1)
    return total / k


def bootstrap_difference(
    a: list[list[float]],
    b: list[list[float]],
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = LEVEL,
) -> dict:
    """The difference mean(a) - mean(b) and its percentile bootstrap interval. `a`, `b`: one list per run (seed) of
    the method, holding that run's per-play values (a list of one value where plays are not stored); a method's
    mean is the mean over its runs of each run's mean."""
    import numpy as np

    if not a or not b or any(len(r) == 0 for r in (*a, *b)):
        raise ValueError("each method needs at least one run with at least one value")

    def mean(runs):
        return sum(sum(r) / len(r) for r in runs) / len(runs)

    rng = np.random.default_rng(seed)
    diffs = _method_draws(rng, a, resamples) - _method_draws(rng, b, resamples)
    low, high = np.quantile(diffs, [(1 - level) / 2, 1 - (1 - level) / 2])
    return dict(difference=mean(a) - mean(b), low=float(low), high=float(high), level=level)


def method_samples(runs: list[dict], start: dict | None) -> tuple[list[list[float]], bool]:
    """One method's runs as bootstrap input: (per-run lists of paired per-play changes, True) when every run is paired
    with the starting model play by play, else (per-run [held-out return], False)."""
    changes = [play_changes(r["eval"], start) for r in runs]
    if all(c is not None for c in changes):
        return changes, True
    return [[r["eval"]["return_mean"]] for r in runs], False


def seed_permutation(a: list[float], b: list[float]) -> dict:
    """Exact two-sided permutation test of mean(a) - mean(b) over seed-level values: p is the share of all splits of
    the pooled values into groups of len(a) and len(b) whose difference of means is at least as far from 0 as the
    observed one (the observed split included); `floor` is the smallest p these group sizes allow."""
    if not a or not b:
        raise ValueError("each method needs at least one run")
    pooled = [*a, *b]
    total = sum(pooled)
    observed = abs(sum(a) / len(a) - sum(b) / len(b))
    splits = extreme = 0
    for picked in itertools.combinations(range(len(pooled)), len(a)):
        in_a = sum(pooled[i] for i in picked)
        diff = abs(in_a / len(a) - (total - in_a) / len(b))
        splits += 1
        extreme += diff >= observed - 1e-12  # float sums of the same values in another order
    # the mirror image of the observed split (a and b swapped) is as extreme when the groups are the same size
    return dict(p=extreme / splits, floor=min(1.0, (2 if len(a) == len(b) else 1) / splits), splits=splits)


def difference_rows(runs: list[dict], start: dict | None, methods, seed: int = BOOTSTRAP_SEED) -> list[dict]:
    """Every pair of `methods` that has finished runs: the difference of their held-out returns and its bootstrap
    interval, and what was resampled."""
    have = [m for m in methods if any(r["method"] == m for r in runs)]
    out = []
    for first, second in itertools.combinations(have, 2):
        a, paired_a = method_samples([r for r in runs if r["method"] == first], start)
        b, paired_b = method_samples([r for r in runs if r["method"] == second], start)
        values_a = [r["eval"]["return_mean"] for r in runs if r["method"] == first]
        values_b = [r["eval"]["return_mean"] for r in runs if r["method"] == second]
        paired = paired_a and paired_b
        if not paired:  # both as whole-run values, so the two methods are resampled alike
            a, b = [[v] for v in values_a], [[v] for v in values_b]
        row = bootstrap_difference(a, b, seed=seed)
        row["seed_test"] = seed_permutation(values_a, values_b)
        row.update(a=first, b=second, seeds_a=len(a), seeds_b=len(b), over="seeds and plays" if paired else "seeds")
        out.append(row)
    return out


def difference_line(row: dict) -> str:
    """ "CC - MC = +0.38 [95 % interval +0.15, +0.61] (...)": the difference and what it was resampled over."""
    pct = f"{100 * row['level']:.0f} %"
    text = (
        f"{row['a'].upper()} - {row['b'].upper()} = {row['difference']:+.2f} "
        f"[{pct} interval {row['low']:+.2f}, {row['high']:+.2f}]"
    )
    if row["over"] == "seeds":
        what = "bootstrap over seeds only: the run files hold no per-play scores"
    else:
        what = "bootstrap over seeds and plays, each play paired with the starting model's"
    notes = [f"{row['seeds_a']} vs {row['seeds_b']} seeds", what]
    few = [m.upper() for m, n in ((row["a"], row["seeds_a"]), (row["b"], row["seeds_b"])) if n < 2]
    if few:
        notes.append(f"{' and '.join(few)}: one seed, so no seed spread in the interval")
    if row["low"] <= 0 <= row["high"]:
        notes.append("the interval includes 0")
    test = row.get("seed_test")
    if test and row["seeds_a"] > 1 and row["seeds_b"] > 1:
        notes.append(
            f"seed means alone: permutation p = {test['p']:.2f}, the smallest these seeds allow {test['floor']:.2f}"
        )
    return f"{text} ({'; '.join(notes)})"


def difference_lines(runs: list[dict], start: dict | None, methods, seed: int = BOOTSTRAP_SEED) -> tuple[list, list]:
    """(lines, rows): each pair's difference line, headed by what the interval is; no lines for fewer than 2
    methods."""
    rows = difference_rows(runs, start, methods, seed)
    if not rows:
        return [], rows
    head = (
        f"held-out return, difference of methods ({RESAMPLES:,} bootstrap draws, seed {seed}, percentile interval; "
        "seeds drawn within each method, plays within each run where the run files store them):"
    )
    return [head, *(f"- {difference_line(r)}" for r in rows)], rows
