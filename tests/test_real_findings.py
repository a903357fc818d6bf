"""benchmarks/research/real_findings.py without the model: level pass rates from hand-made episodes, the learning-rate
choice, and a table built from partial results that says which cells are partial; method_intervals.py's bootstrap
interval on a difference of methods (a known difference, one that must include 0, a fixed seed)."""

from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "research"))
import method_intervals  # noqa: E402
import real_findings  # noqa: E402


def test_writing_summary_rates():
    eps = [
        dict(total=3.0, level1=1.0, level2=1.0, level3=1.0, words=[20, 60]),
        dict(total=1.5, level1=1.0, level2=0.0, level3=0.0, words=[40, 70]),  # ratio 1.75: level 2 missed
        dict(total=0.75, level1=0.75, level2=0.0, level3=0.0, words=[10, 90]),
        dict(total=2.6, level1=1.0, level2=1.0, level3=0.6, words=[30, 90]),
    ]
    out = real_findings.summarize("writing-summary", eps, 3.0)
    assert out["episodes"] == 4
    assert out["return_mean"] == pytest.approx((3.0 + 1.5 + 0.75 + 2.6) / 4)
    assert out["score_pct"] == pytest.approx(100 * 7.85 / 4 / 3)
    assert out["length_pass"] == 0.75 and out["ratio_pass"] == 0.5
    assert out["style_mean"] == pytest.approx(0.4) and out["style_pass"] == 0.25
    assert out["words_mean"] == [25.0, 77.5]


def test_code_rates():
    eps = [
        dict(total=4.0, definitions=1.0, syntax=0.5, tests=2.0, bonus=0.5, all_tests=True, turns=1),
        dict(total=0.5, definitions=0.5, syntax=0.0, tests=0.0, bonus=0.0, all_tests=False, turns=2),
        dict(total=2.0, definitions=1.0, syntax=0.5, tests=0.5, bonus=0.0, all_tests=False, turns=2),
    ]
    out = real_findings.summarize("code-humaneval", eps, 4.0)
    assert out["return_mean"] == pytest.approx(6.5 / 3)
    assert out["definitions_pass"] == pytest.approx(2 / 3) and out["syntax_pass"] == pytest.approx(2 / 3)
    assert out["tests_mean"] == pytest.approx((1.0 + 0.0 + 0.25) / 3)  # points / 2 = fraction of tests passed
    assert out["all_tests_pass"] == pytest.approx(1 / 3) and out["bonus_pass"] == pytest.approx(1 / 3)


def _run(method, seed, lr, curve, ret, steps=None):
    ev = real_findings.summarize(
        "writing-summary", [dict(total=ret, level1=1.0, level2=0.0, level3=0.0, words=[20, 30])], 3.0
    )
    return dict(
        task="writing-summary",
        method=method,
        seed=seed,
        lr=lr,
        budget=16,
        batch=4,
        response_length=96,
        env_steps=steps or curve[-1][0],
        curve=curve,
        eval=dict(ev, prompt_form="chat"),
    )


def test_rates_chosen_on_the_sweep_seed_and_partial_cells_labelled(tmp_path):
    runs = [
        _run("cc", 0, 1e-3, [(8, 0.5), (16, 1.5)], 1.4),
        _run("cc", 0, 3e-4, [(8, 0.5), (16, 0.9)], 0.9),
        _run("cc", 1, 1e-3, [(8, 0.4), (16, 1.1)], 1.2),
        _run("cc", 1, 3e-4, [(8, 0.4), (16, 2.9)], 2.9),  # not the sweep seed: must not decide the rate
        _run("mc", 0, 1e-3, [(8, 0.5)], 0.6, steps=8),  # cut short: half the budget
    ]
    assert real_findings.choose_rates(runs, ("cc", "dc", "mc"), 0) == {"cc": 1e-3, "mc": 1e-3}
    task_dir = tmp_path / "writing-summary"
    task_dir.mkdir()
    s = real_findings.settings("writing-summary", budget=16, batch=4)
    s["seeds"] = (0, 1)
    for r in runs:
        with open(real_findings.run_path(str(tmp_path), r["task"], r["method"], r["seed"], r["lr"], s), "w") as f:
            json.dump(r, f)
    other = dict(runs[0], batch=8, seed=1)  # another batch size: a different experiment, left out of this table
    with open(real_findings.run_path(str(tmp_path), "writing-summary", "cc", 1, 1e-3, dict(s, batch=8)), "w") as f:
        json.dump(other, f)
    dc = dict(_run("dc", 0, 1e-3, [(4, 0.5), (8, 0.7)], 0.0), partial=True)  # a run stopped after 2 iterations
    dc.pop("eval")
    with open(
        real_findings.partial_path(real_findings.run_path(str(tmp_path), "writing-summary", "dc", 0, 1e-3, s)), "w"
    ) as f:
        json.dump(dc, f)
    start = dict(_run("cc", 0, 0, [(0, 0)], 0.5)["eval"])
    with open(real_findings.start_path(str(tmp_path), "writing-summary", s), "w") as f:
        json.dump(start, f)
    text = real_findings.report("writing-summary", str(tmp_path), str(tmp_path / "fig"), s, 0)
    # completeness is against the target (3 seeds, 128 env steps, 2 rates), whatever this call ran
    cc = "CC: lr 0.001 chosen of [0.0003, 0.001] (target [0.001, 0.003]), 2/3 seeds, [16] env steps (target 128)"
    assert cc + " - PARTIAL" in text
    dc = "DC: no finished run - MISSING; unfinished (training curve so far, no held-out scores): seed 0 lr 0.001 at 8"
    assert dc in text
    mc = "MC: lr 0.001 chosen of [0.001] (target [0.001, 0.003]), 1/3 seeds, [8] env steps (target 128) - PARTIAL"
    assert mc in text
    blob = json.loads(pathlib.Path(real_findings.table_paths(str(tmp_path), "", "writing-summary", s)[0]).read_text())
    cc = next(r for r in blob["table"]["rows"] if r["method"] == "cc")
    assert cc["seeds"] == 2 and cc["cols"][0][0] == pytest.approx((1.4 + 1.2) / 2)  # the chosen rate's seeds only
    assert "| starting model |" in text and "| 95.2 |" in text  # the paper's CC TLDR figure beside ours
    assert os.path.exists(real_findings.table_paths("", str(tmp_path / "fig"), "writing-summary", s)[1])
    # a call that trains one method (`--methods mc`) rewrites the same JSON: it must stay the whole table
    text = real_findings.report("writing-summary", str(tmp_path), str(tmp_path / "fig"), dict(s, methods=("mc",)), 0)
    assert "- CC: lr 0.001 chosen of [0.0003, 0.001]" in text and "- DC: no finished run - MISSING" in text
    blob = json.loads(pathlib.Path(real_findings.table_paths(str(tmp_path), "", "writing-summary", s)[0]).read_text())
    assert {"cc", "mc"} <= {r["method"] for r in blob["table"]["rows"]}
    # a table of another size (here the batch-8 run) gets files of its own: this one's JSON and figure stay as they are
    json_path, png_path = real_findings.table_paths(str(tmp_path), str(tmp_path / "fig"), "writing-summary", s)
    before = pathlib.Path(json_path).read_bytes(), pathlib.Path(png_path).read_bytes()
    real_findings.report("writing-summary", str(tmp_path), str(tmp_path / "fig"), dict(s, batch=8), 0)
    assert (pathlib.Path(json_path).read_bytes(), pathlib.Path(png_path).read_bytes()) == before
    json8, png8 = real_findings.table_paths(str(tmp_path), str(tmp_path / "fig"), "writing-summary", dict(s, batch=8))
    assert json8 != json_path and png8 != png_path and "-bs8-" in json8
    assert [(r["method"], r["seed"], r["batch"]) for r in json.loads(pathlib.Path(json8).read_text())["runs"]] == [
        ("cc", 1, 8)
    ]


def test_code_levels_take_each_episodes_last_attempt():
    """Episode 0 ends at turn 1 (max score), episode 1 plays both turns: its turn-2 levels are the ones that count."""
    from types import SimpleNamespace

    def info(score, levels, passed, total):
        return dict(score=score, levels=levels, tests_passed=passed, tests_total=total)

    full = dict(definitions=1.0, syntax=0.5, tests=2.0, bonus=0.5)
    roll = SimpleNamespace(
        num_episodes=2,
        agent_names=["aux", "main"],
        turns=[
            {"aux": SimpleNamespace(episode_ids=torch.tensor([0, 1]))},
            {"aux": SimpleNamespace(episode_ids=torch.tensor([1]))},
        ],
        infos=[
            [info(4.0, full, 3, 3), info(0.5, dict(definitions=0.5), 0, 0)],
            [info(1.5, dict(definitions=1.0, syntax=0.5), 0, 3)],
        ],
    )
    eps = real_findings.code_levels(roll)
    assert [e["total"] for e in eps] == [4.0, 1.5] and [e["turns"] for e in eps] == [1, 2]
    assert eps[0]["all_tests"] and not eps[1]["all_tests"]
    assert eps[1]["definitions"] == 1.0 and eps[1]["syntax"] == 0.5 and eps[1]["tests"] == 0.0


def test_resampled_starting_model_gives_the_held_out_noise_line(tmp_path):
    """The starting model played at other sampling seeds: the report states each seed's return and the range (the
    change a trained team must beat), and a table with only the main seed's file states none."""
    s = real_findings.settings("writing-summary", budget=16, batch=4)
    (tmp_path / "writing-summary").mkdir()

    def save(eval_seed, ret, l1):
        ev = real_findings.summarize(
            "writing-summary", [dict(total=ret, level1=l1, level2=0.0, level3=0.0, words=[20, 30])], 3.0
        )
        with open(real_findings.start_path(str(tmp_path), "writing-summary", s, eval_seed), "w") as f:
            json.dump(dict(ev, eval_seed=eval_seed, prompt_form="chat"), f)

    save(real_findings.EVAL_SEED, 0.7, 1.0)
    assert real_findings.resample_line(str(tmp_path), "writing-summary", s)[0] == ""
    save(1236, 0.5, 0.0)
    save(1235, 0.6, 1.0)
    assert real_findings.start_path(str(tmp_path), "writing-summary", s, 1235).endswith(
        "start-t96-eallx1-evalseed1235.json"
    )
    line, rows = real_findings.resample_line(str(tmp_path), "writing-summary", s)
    assert [r["eval_seed"] for r in rows] == [1234, 1235, 1236]
    assert line == (
        "starting model re-sampled at eval seeds [1234, 1235, 1236]: return 0.700, 0.600, 0.500 (range 0.200); "
        "L1 length pass 1.00, 1.00, 0.00"
    )
    text = real_findings.report("writing-summary", str(tmp_path), str(tmp_path / "fig"), s, 0)
    assert line in text
    blob = json.loads(pathlib.Path(real_findings.table_paths(str(tmp_path), "", "writing-summary", s)[0]).read_text())
    assert [r["eval_seed"] for r in blob["start_resampled"]] == [1234, 1235, 1236]


def test_training_drift_compares_first_and_last_iterations_per_method():
    runs = [
        _run("cc", 0, 1e-3, [(8, 0.5), (16, 0.7), (24, 0.9), (32, 1.1)], 1.0),  # 0.6 -> 1.0
        _run("cc", 1, 1e-3, [(8, 0.8), (16, 0.8), (24, 0.6), (32, 0.6)], 1.0),  # 0.8 -> 0.6
        _run("mc", 0, 1e-3, [(8, 0.5), (16, 0.5)], 1.0),  # too short for 2 + 2 iterations: left out
    ]
    line = real_findings.training_drift(runs, ("cc", "dc", "mc"))
    assert line == "training return, first 2 -> last 2 iterations: CC 0.700 -> 0.800 (up in 1/2 runs)"
    assert real_findings.training_drift(runs[2:], ("mc",)) == ""


def test_paired_change_is_measured_play_by_play_and_judged_against_the_noise():
    def ev(totals, level1s, seed=1234, rows=("a", "b", "c", "d")):
        plays = [dict(total=t, level1=v, row=r) for t, v, r in zip(totals, level1s, rows)]
        return dict(plays=plays, eval_seed=seed, return_mean=sum(totals) / len(totals))

    before = ev([0.5, 1.0, 0.0, 1.5], [0.5, 1.0, 0.0, 1.0])
    after = ev([1.5, 2.0, 1.0, 2.5], [1.0, 1.0, 1.0, 1.0])  # every play +1.0: SE 0
    c = real_findings.paired_change(after, before)
    assert c["plays"] == 4 and c["return_change"] == pytest.approx(1.0) and c["return_se"] == pytest.approx(0.0)
    assert c["level1_before"] == 0.5 and c["level1_after"] == 1.0 and c["level1_change"] == pytest.approx(0.5)
    # diffs 1,0,1,0 of level-1 passes: mean 0.5, sample sd sqrt(1/3), SE sqrt(1/3)/2
    assert c["level1_se"] == pytest.approx((1 / 3) ** 0.5 / 2)
    mixed = ev([1.5, 0.0, 0.0, 1.5], [1.0, 0.0, 0.0, 1.0])  # diffs +1, -1, 0, 0: mean 0, SE sqrt(2/3)/2
    m = real_findings.paired_change(mixed, before)
    assert m["return_change"] == pytest.approx(0.0) and m["return_se"] == pytest.approx((2 / 3) ** 0.5 / 2)
    # Not paired: another sampling seed, other rows, or no per-play records.
    assert real_findings.paired_change(ev([1.0] * 4, [1.0] * 4, seed=7), before) is None
    assert real_findings.paired_change(ev([1.0] * 4, [1.0] * 4, rows="wxyz"), before) is None
    assert real_findings.paired_change(dict(return_mean=1.0), before) is None

    run = dict(method="mc", seed=0, lr=3e-3, env_steps=128, eval=after)
    wide = [dict(return_mean=0.7), dict(return_mean=1.9)]  # a re-sampling range of 1.2 > the +1.0 change
    (line,) = real_findings.paired_lines([run], before, [dict(return_mean=0.7), dict(return_mean=0.8)])
    assert "paired +1.000" in line and "beyond noise" in line and "NOT" not in line and "+50 +- 29 points" in line
    (line,) = real_findings.paired_lines([run], before, wide)
    assert "NOT beyond noise" in line
    (line,) = real_findings.paired_lines([dict(run, eval=mixed)], before, [])
    assert "NOT beyond noise" in line and "not measured" in line


def test_rates_are_chosen_from_runs_of_this_tables_size_only(tmp_path):
    """A finished run of another budget (an earlier table's, kept in the same folder) must not choose a rate: the
    sweep then has none for that method, rather than running its other seeds at the old table's rate."""
    s = real_findings.settings("writing-summary", budget=16, batch=4)
    (tmp_path / "writing-summary").mkdir()
    old = dict(_run("cc", 0, 1e-3, [(8, 0.5), (16, 1.5)], 1.4), budget=8)
    mine = _run("mc", 0, 3e-3, [(8, 0.5), (16, 0.9)], 0.9)
    for r in (old, mine):
        size = dict(s, budget=r["budget"])
        with open(real_findings.run_path(str(tmp_path), r["task"], r["method"], 0, r["lr"], size), "w") as f:
            json.dump(r, f)
    assert len(real_findings.load_runs(str(tmp_path), "writing-summary")) == 2
    runs = real_findings.sweep_runs(str(tmp_path), "writing-summary", s)
    assert real_findings.choose_rates(runs, ("cc", "mc"), 0) == {"mc": 3e-3}


# ------------------------------------------------------------------------------------------- spread and intervals


def test_bootstrap_finds_a_known_difference():
    """Two methods whose every play differs by 1.0 on average (the same spread of plays around it): the difference
    is 1.0 and its interval holds it, well away from 0."""
    a = [[0.8, 1.2, 0.9, 1.1] * 5, [0.7, 1.3, 1.0, 1.0] * 5, [0.9, 1.1, 0.8, 1.2] * 5]
    b = [[x - 1.0 for x in run] for run in a]
    row = method_intervals.bootstrap_difference(a, b, resamples=2000)
    assert row["difference"] == pytest.approx(1.0)
    assert 0.8 < row["low"] < 1.0 < row["high"] < 1.2
    # no noise at all: the interval is the point
    flat = method_intervals.bootstrap_difference([[1.0, 1.0]] * 3, [[0.25, 0.25]] * 2, resamples=500)
    assert (flat["difference"], flat["low"], flat["high"]) == pytest.approx((0.75, 0.75, 0.75))


def test_bootstrap_draws_the_seeds():
    """Seeds only (one value a run): method a's two seeds 1 and 3 give means 1, 2, 3 with chances 1/4, 1/2, 1/4,
    so the 95 % interval of a - b (b a single 0) runs from 1 to 3."""
    row = method_intervals.bootstrap_difference([[1.0], [3.0]], [[0.0]], resamples=4000)
    assert row["difference"] == pytest.approx(2.0)
    assert (row["low"], row["high"]) == pytest.approx((1.0, 3.0))


def test_bootstrap_interval_includes_zero_when_the_methods_are_alike():
    same = [[0.0, 1.0, 0.5, 2.0, 0.0, 1.5], [1.0, 0.0, 2.0, 0.5, 1.5, 0.0], [0.5, 0.5, 1.0, 1.0, 0.0, 2.0]]
    row = method_intervals.bootstrap_difference(same, same[::-1], resamples=2000)
    assert row["difference"] == pytest.approx(0.0, abs=1e-12)
    assert row["low"] < 0 < row["high"] and row["high"] - row["low"] > 0.3


def test_bootstrap_is_fixed_by_its_seed():
    a, b = [[0.3, 1.2, 0.8], [1.5, 0.2, 0.9]], [[0.1, 0.4, 0.6], [0.9, 0.0, 0.2]]
    one = method_intervals.bootstrap_difference(a, b, resamples=1000, seed=7)
    assert method_intervals.bootstrap_difference(a, b, resamples=1000, seed=7) == one
    other = method_intervals.bootstrap_difference(a, b, resamples=1000, seed=8)
    assert other["difference"] == one["difference"] and (other["low"], other["high"]) != (one["low"], one["high"])


def test_seed_permutation_counts_the_splits_by_hand():
    """Three seeds each, every run of a above every run of b: of the 20 splits only the observed one and its mirror
    are as far apart, p = 2/20, the floor 3 vs 3 allows. [1, 2] against [0]: the splits {1,2}|{0}, {1,0}|{2} and
    {2,0}|{1} differ by 1.5, -1.5 and 0, so p = 2/3 with a floor of 1/3. Two groups of the same values: p = 1."""
    row = method_intervals.seed_permutation([1.2, 1.3, 1.4], [0.7, 0.8, 0.9])
    assert row == dict(p=pytest.approx(0.1), floor=pytest.approx(0.1), splits=20)
    row = method_intervals.seed_permutation([1.0, 2.0], [0.0])
    assert row == dict(p=pytest.approx(2 / 3), floor=pytest.approx(1 / 3), splits=3)
    assert method_intervals.seed_permutation([0.5, 1.0], [1.0, 0.5])["p"] == pytest.approx(1.0)
    # the 2-turn table's seeds (CC 1.253, 1.276, 0.907 against MC 0.999, 0.685, 0.919; gap 0.278): as far apart are
    # the observed split, the two that trade CC's 0.907 for MC's 0.999 or 0.919 (gaps 0.339, 0.286), and the three
    # mirrors: 6 of 20
    row = method_intervals.seed_permutation([1.253, 1.276, 0.907], [0.999, 0.685, 0.919])
    assert row["p"] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="at least one run"):
        method_intervals.seed_permutation([], [1.0])


def _play_run(method, seed, totals, rows=None, eval_seed=1234):
    rows = rows or [f"r{i}" for i in range(len(totals))]
    plays = [dict(total=t, level1=1.0, row=r) for t, r in zip(totals, rows)]
    ev = dict(plays=plays, eval_seed=eval_seed, return_mean=sum(totals) / len(totals))
    return dict(method=method, seed=seed, lr=3e-3, env_steps=256, eval=ev)


def test_difference_lines_pair_plays_with_the_start_or_say_they_fall_back_to_seeds():
    start = _play_run("start", 0, [0.5, 0.0, 1.0, 0.5])["eval"]
    runs = [_play_run("cc", s, [1.5 + 0.1 * s, 1.0, 2.0, 1.5]) for s in range(3)]
    runs += [_play_run("mc", s, [1.0, 0.5 + 0.1 * s, 1.5, 1.0]) for s in range(3)]
    lines, rows = method_intervals.difference_lines(runs, start, ("cc", "dc", "mc"))
    assert len(rows) == 1 and rows[0]["over"] == "seeds and plays"  # DC has no run: no pair
    assert rows[0]["difference"] == pytest.approx(0.5)
    assert lines[1].startswith("- CC - MC = +0.50 [95 % interval ")
    assert "3 vs 3 seeds; bootstrap over seeds and plays" in lines[1]
    assert "seed means alone: permutation p = 0.10, the smallest these seeds allow 0.10" in lines[1]
    # the same runs without per-play scores: one value a run, and the line says so
    bare = [dict(r, eval=dict(return_mean=r["eval"]["return_mean"])) for r in runs]
    lines, rows = method_intervals.difference_lines(bare, start, ("cc", "mc"))
    assert rows[0]["over"] == "seeds" and "seeds only: the run files hold no per-play scores" in lines[1]
    assert rows[0]["difference"] == pytest.approx(0.5)
    # one seed of a method: said, since the seed spread is then not in the interval
    lines, _ = method_intervals.difference_lines(runs[:1] + runs[3:], start, ("cc", "mc"))
    assert "1 vs 3 seeds" in lines[1] and "CC: one seed, so no seed spread in the interval" in lines[1]
    assert "permutation" not in lines[1]  # one seed: no seed-level test to make
    assert method_intervals.difference_lines(runs[:3], start, ("cc", "mc")) == ([], [])


def test_seed_spread():
    s = method_intervals.seed_spread([1.0, 2.0, 3.0])
    assert s == dict(seeds=3, mean=2.0, sd=pytest.approx(1.0), min=1.0, max=3.0)
    assert method_intervals.seed_spread([1.5])["sd"] is None


def test_revise_table_is_partial_with_its_spread_and_intervals_and_a_second_rate_is_chosen_by_the_rule(tmp_path):
    """writing-revise with a few runs: cells PARTIAL, the return cell with its SD over seeds, the CC - MC interval
    marked partial; a 1e-3 sweep on seed 0 (`--lrs 3e-3 1e-3`) is chosen when its final training return is higher."""
    s = real_findings.settings("writing-revise", compute="bf16")
    task_dir = tmp_path / "writing-revise"
    task_dir.mkdir()
    n = 6
    start = dict(real_findings.summarize("writing-revise", [_episode(0.5)] * n, 3.0), prompt_form="chat")
    start.update(plays=_play_run("start", 0, [0.5] * n)["eval"]["plays"], eval_seed=1234)
    with open(real_findings.start_path(str(tmp_path), "writing-revise", s), "w") as f:
        json.dump(start, f)

    def save(method, seed, lr, curve, totals):
        run = _play_run(method, seed, totals)
        ev = real_findings.summarize("writing-revise", [_episode(t) for t in totals], 3.0)
        run.update(task="writing-revise", lr=lr, budget=256, batch=8, response_length=96, compute="bf16", curve=curve)
        run["eval"] = dict(ev, plays=run["eval"]["plays"], eval_seed=1234, prompt_form="chat")
        with open(real_findings.run_path(str(tmp_path), "writing-revise", method, seed, lr, s), "w") as f:
            json.dump(run, f)

    up, flat = [(16 * i, 0.5 + 0.05 * i) for i in range(1, 17)], [(16 * i, 0.6) for i in range(1, 17)]
    save("cc", 0, 3e-3, up, [1.5, 1.0, 2.0, 1.5, 1.0, 1.0])
    save("cc", 1, 3e-3, up, [1.0, 1.5, 1.5, 1.0, 2.0, 1.0])
    save("mc", 0, 3e-3, flat, [1.0, 0.5, 1.0, 0.5, 1.0, 0.5])
    text = real_findings.report("writing-revise", str(tmp_path), str(tmp_path / "fig"), s, 0)
    cc = "- CC: lr 0.003 chosen of [0.003] (target [0.001, 0.003]), 2/3 seeds, [256] env steps (target 256) - PARTIAL"
    assert cc in text
    assert "- DC: no finished run - MISSING" in text
    assert "| CC | 0.003 | 2 | 1.333 (SD 0.000; 1.333 to 1.333)" in text  # both seeds return 1.333
    assert "PARTIAL table, intervals from the runs finished so far" in text
    assert "- CC - MC = +0.58 [95 % interval " in text and "2 vs 1 seeds" in text
    assert os.path.exists(real_findings.heldout_path(str(tmp_path / "fig"), "writing-revise", s))
    blob = json.loads(pathlib.Path(real_findings.table_paths(str(tmp_path), "", "writing-revise", s)[0]).read_text())
    assert blob["differences"][0]["a"] == "cc" and blob["differences"][0]["b"] == "mc"
    # the next step of the rule: 1e-3 on seed 0 for each method, the better final training return kept
    save("mc", 0, 1e-3, up, [1.5] * n)
    save("cc", 0, 1e-3, flat, [0.5] * n)
    swept = dict(s, lrs=(3e-3, 1e-3))
    runs = real_findings.sweep_runs(str(tmp_path), "writing-revise", swept)
    assert real_findings.choose_rates(runs, ("cc", "dc", "mc"), 0) == {"cc": 3e-3, "mc": 1e-3}
    text = real_findings.report("writing-revise", str(tmp_path), str(tmp_path / "fig"), swept, 0)
    assert "- MC: lr 0.001 chosen of [0.001, 0.003] (target [0.001, 0.003]), 1/3 seeds" in text


def _episode(total):
    return dict(total=total, level1=1.0 if total >= 1.0 else 0.5, level2=0.0, level3=0.0, words=[20, 70])


def test_horizon_puts_both_writing_tables_side_by_side_with_env_steps_to_one_level(tmp_path):
    """benchmarks/research/horizon.py: per method and task, the chosen rate's seeds, held-out return (mean, SD over
    seeds), paired change, and the env steps at which each seed's moving mean (5 iterations) first reaches the level."""
    import horizon

    n = 4
    for task, budget in (("writing-summary", 128), ("writing-revise", 256)):
        s = real_findings.settings(task, compute="bf16")
        (tmp_path / task).mkdir()
        start = dict(real_findings.summarize(task, [_episode(0.5)] * n, 3.0), prompt_form="chat")
        start.update(plays=_play_run("start", 0, [0.5] * n)["eval"]["plays"], eval_seed=1234)
        with open(real_findings.start_path(str(tmp_path), task, s), "w") as f:
            json.dump(start, f)
        step = budget // 16
        for seed, (rise, totals) in enumerate([(0.1, [1.5, 1.0, 1.0, 1.5]), (0.05, [1.0, 1.0, 1.0, 1.0])]):
            run = _play_run("cc", seed, totals)
            run.update(task=task, lr=3e-3, budget=budget, batch=8, response_length=96, compute="bf16")
            run["curve"] = [(step * i, 0.5 + rise * i) for i in range(1, 17)]
            ev = real_findings.summarize(task, [_episode(t) for t in totals], 3.0)
            run["eval"] = dict(ev, plays=run["eval"]["plays"], eval_seed=1234, prompt_form="chat")
            with open(real_findings.run_path(str(tmp_path), task, "cc", seed, 3e-3, s), "w") as f:
                json.dump(run, f)
    tables = [horizon.cells(str(tmp_path), task, "bf16", level=1.0) for task, _ in horizon.TASKS]
    one, two = (t["methods"]["cc"] for t in tables)
    # moving mean of 0.5 + r*i over the last 5 iterations reaches 1.0: r = 0.1 at i = 7 (mean of i 3..7 = 5 -> 1.0),
    # r = 0.05 at i = 12 (mean of i 8..12 = 10 -> 1.0); env steps = i x the task's steps per iteration
    assert one["steps_to_level"] == [7 * 8, 12 * 8] and two["steps_to_level"] == [7 * 16, 12 * 16]
    assert one["heldout"] == pytest.approx((1.25 + 1.0) / 2) and one["heldout_sd"] == pytest.approx(0.125 * 2**0.5)
    assert one["change"] == pytest.approx((0.75 + 0.5) / 2) and one["seeds"] == [0, 1]
    text = horizon.format_table(tables, ["1 turn", "2 turns"], 1.0)
    assert "| starting model | - | 0.500 | - | - | - | 0.500 | - | - |" in text
    cc = "| CC | 2 (lr 0.003) | 1.125 (0.177) | +0.625 | 76 (2/2 seeds) | 2 (lr 0.003) | 1.125 (0.177) | +0.625 | 152 "
    assert cc in text
    assert "| MC | - | - | - | - |" in text  # no runs: dashes, not a crash


# ------------------------------------------------------------------------------- one cell on two codes (same_cell)


def _save_cell(root, method, seed, totals, start_totals=None, lr=3e-3):
    """A writing-summary run file (and, with `start_totals`, the starting model's) under `root`, as real_findings.py
    writes them."""
    import same_cell

    s = same_cell.settings("writing-summary", compute="bf16")
    os.makedirs(os.path.join(root, "writing-summary"), exist_ok=True)
    if start_totals is not None:
        start = _play_run("start", 0, start_totals)["eval"]
        with open(real_findings.start_path(str(root), "writing-summary", s), "w") as f:
            json.dump(start, f)
    run = _play_run(method, seed, totals)
    run.update(task="writing-summary", lr=lr, budget=128, env_steps=128, batch=8, response_length=96, compute="bf16")
    run["curve"] = [(8 * i, 0.5) for i in range(1, 17)]
    with open(real_findings.run_path(str(root), "writing-summary", method, seed, lr, s), "w") as f:
        json.dump(run, f)


def test_same_cell_compares_two_sets_of_seeds_gathered_from_several_folders(tmp_path, capsys):
    """Side one: seeds 0 and 1 in one folder, seed 2 in another (returns 1.5, 1.25, 1.0); side two: 0.75, 0.5, 1.0.
    Means 1.25 and 0.75, difference +0.5; of the 20 splits of the six values, those as far apart (|gap| >= 0.5) are
    the observed one, the one trading 1.0 for 1.0, and their mirrors: p = 4/20. Same start, so plays are drawn too; a
    seed given twice on one side is refused, and so is a side without runs."""
    import same_cell

    start = [0.5, 0.5, 0.5, 0.5]
    _save_cell(tmp_path / "a", "cc", 0, [1.5] * 4, start)
    _save_cell(tmp_path / "a", "cc", 1, [1.0, 1.5, 1.0, 1.5], start)
    _save_cell(tmp_path / "a2", "cc", 2, [1.0] * 4)
    _save_cell(tmp_path / "a2", "mc", 2, [0.0] * 4)  # another method: not gathered
    for seed, total in enumerate((0.75, 0.5, 1.0)):
        _save_cell(tmp_path / "b", "cc", seed, [total] * 4, start if seed == 0 else None)
    args = ["--task", "writing-summary", "--method", "cc", "--first", str(tmp_path / "a"), str(tmp_path / "a2")]
    result = same_cell.main([*args, "--second", str(tmp_path / "b")])
    assert result["first"]["seeds"] == [0, 1, 2] and result["first"]["mean"] == pytest.approx(1.25)
    assert result["second"]["returns"] == pytest.approx([0.75, 0.5, 1.0])
    assert result["difference"] == pytest.approx(0.5)
    assert result["permutation"] == dict(p=pytest.approx(0.2), floor=pytest.approx(0.1), splits=20)
    assert result["over"].startswith("seeds and plays") and result["low"] < 0.5 < result["high"]
    assert "first - second = +0.500 [95 % interval" in capsys.readouterr().out
    # another starting model on the second side: the plays do not pair, so seeds only
    _save_cell(tmp_path / "c", "cc", 0, [0.75] * 4, [0.0, 1.0, 0.5, 0.5])
    assert same_cell.main([*args, "--second", str(tmp_path / "c")])["over"] == "seeds only"
    _save_cell(tmp_path / "a2", "cc", 1, [1.0] * 4)
    with pytest.raises(SystemExit, match="cc seed 1 at lr 0.003 is in both"):
        same_cell.main([*args, "--second", str(tmp_path / "b")])
    with pytest.raises(SystemExit):
        same_cell.main(
            [
                "--task",
                "writing-summary",
                "--method",
                "dc",
                "--first",
                str(tmp_path / "b"),
                "--second",
                str(tmp_path / "b"),
            ]
        )
    assert "no finished dc run" in capsys.readouterr().err
