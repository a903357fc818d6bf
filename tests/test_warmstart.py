"""Warm starts (trl_collm/warmstart.py) and the findings script built on them (benchmarks/warm_findings.py), at toy size."""

import json
import os
import sys
from dataclasses import replace

import pytest

from trl_collm.tasks.building import parse_command
from trl_collm.warmstart import (
    WarmStartConfig,
    building_transcripts,
    evaluate_building,
    evaluate_tags,
    make_warm_start,
    tag_transcripts,
)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import warm_findings  # noqa: E402

# A small but learnable recipe: one-letter targets keep prompts short; a high rate learns the format in ~20 steps.
TOY = WarmStartConfig(task="building-str", episodes=8, letters="IL", max_letters=1, epochs=3.0, batch_size=4,
                      learning_rate=1e-2)


@pytest.fixture(scope="module")
def toy_warm(tmp_path_factory):
    return make_warm_start(tmp_path_factory.mktemp("warm") / "building", TOY, progress=False)


def test_building_transcripts_are_commands_with_the_planned_mistakes():
    cfg = replace(TOY, episodes=30, letters="ICML", max_letters=2)
    pairs = building_transcripts(cfg)
    assert len(pairs) == 30 * 2 * 4  # episodes x builders x turns (no early end)
    assert pairs == building_transcripts(cfg)  # seeded
    assert pairs != building_transcripts(replace(cfg, seed=1))
    lines = [line for p in pairs for line in p["completion"].splitlines()]
    parsed = [parse_command(line) for line in lines]
    assert all(not isinstance(c, str) and c.name == "setblock" for c in parsed)
    # each builder only uses its own palette; some lines leave the world (x or y past the prompt's bounds)
    for p in pairs:
        own = {"builder_a": {"red_wool", "blue_wool"}, "builder_b": {"yellow_wool", "green_wool"}}[p["agent"]]
        assert {parse_command(line).block for line in p["completion"].splitlines()} <= own
    assert any(c.lo[1] > 4 for c in parsed)  # y past the top of every string's world
    # the prompts are the env's own observations, feedback included from turn 2 on
    assert all("Reply with your commands only" in p["prompt"] for p in pairs)
    assert all(("Turn 1 result" in p["prompt"]) == (p["turn"] == 1) for p in pairs)


def test_tag_transcripts_mix_right_and_wrong_answers():
    cfg = WarmStartConfig(task="writing-tags", episodes=200)
    pairs = tag_transcripts(cfg, cfg.resolved_noise())
    right = []
    for p in pairs:
        forum, subject = p["prompt"].split("Tags: ")[1].split("\n")[0].split(" / ")
        right.append(p["completion"].strip() == (forum if p["agent"] == "forum" else subject))
    assert 0.3 < sum(right) / len(right) < 0.55  # own tag with probability 0.4 (plus a random tag that happens to be it)


def test_config_errors_name_the_argument():
    with pytest.raises(ValueError, match="no transcript generator"):
        WarmStartConfig(task="coord-penalty").fingerprint()
    with pytest.raises(ValueError, match="letters"):
        building_transcripts(replace(TOY, letters="I?"))
    with pytest.raises(TypeError):
        WarmStartConfig(noise={"skipp": 0.1}).fingerprint()


def test_warm_start_writes_a_loadable_folder_and_is_cached(toy_warm, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert AutoModelForCausalLM.from_pretrained(toy_warm).config.max_position_embeddings == 4096
    assert AutoTokenizer.from_pretrained(toy_warm).eos_token == "</s>"
    stamp = json.load(open(os.path.join(toy_warm, "warmstart_stamp.json")))
    assert stamp["fingerprint"] == TOY.fingerprint() and stamp["pairs"] == 8 * 2 * 4
    # same fingerprint: reused without training (SFTTrainer must not even be built)
    import trl

    monkeypatch.setattr(trl, "SFTTrainer", None)
    assert make_warm_start(toy_warm, TOY) == toy_warm
    assert TOY.fingerprint() != replace(TOY, seed=1).fingerprint()
    assert TOY.fingerprint() == replace(TOY, noise={"skip": 0.35}).fingerprint()  # spelled-out default, same start


def test_sft_model_writes_valid_commands_where_random_init_does_not(toy_warm, tmp_path):
    from trl_collm.testing import build_causal_lm, build_tokenizer
    from trl_collm.warmstart import DEFAULT_DIMS

    tok = build_tokenizer()
    build_causal_lm(tok, size="tiny", **DEFAULT_DIMS).save_pretrained(tmp_path / "rand")
    tok.save_pretrained(tmp_path / "rand")
    rows = [{"target": "I", "kind": "str"}, {"target": "L", "kind": "str"}]
    warm = evaluate_building(toy_warm, rows, repeats=2, seed=0, max_new_tokens=40)
    rand = evaluate_building(str(tmp_path / "rand"), rows, repeats=2, seed=0, max_new_tokens=40)
    assert rand["applied_per_agent_turn"] == 0 and rand["iou_pct"] == 0
    assert warm["applied_per_agent_turn"] >= 1.0  # at least one block placed per builder and turn, on average
    assert warm["iou_pct"] > 5 and warm["return_mean"] > rand["return_mean"]


def test_findings_table_and_figures(tmp_path):
    # Two methods, two seeds, hand-made curves: start 0 (first 5 points), best final 1.0 -> level 0.8.
    up = [(8 * i, min(1.0, 0.1 * i)) for i in range(1, 21)]
    flat = [(8 * i, 0.0) for i in range(1, 21)]
    ev = {"iou_pct": 50.0, "adj_pct": 10.0, "return_mean": 1.0, "valid_rate": 0.9}
    runs = [dict(method="cc", seed=s, lr=1e-3, curve=up, eval=ev) for s in (0, 1)]
    runs += [dict(method="mc", seed=s, lr=3e-3, curve=flat, eval=dict(ev, iou_pct=20.0 + 10 * s)) for s in (0, 1)]
    t = warm_findings.table(runs, "building-str", dict(ev, iou_pct=10.0))
    start = (0.1 + 0.2 + 0.3 + 0.4 + 0.5) / 5 / 2  # mean over the four runs of their first-5 means
    assert t["start"] == pytest.approx(start) and t["best"] == pytest.approx(1.0)
    assert t["level"] == pytest.approx(start + 0.8 * (1.0 - start))
    rows = {r["method"]: r for r in t["rows"]}
    # level 0.83: the moving mean of 5 is 0.80 at point 10 (0.6..1.0) and 0.88 at point 11 (0.7, 0.8, 0.9, 1, 1)
    assert rows["cc"]["reach"] == [88, 88] and rows["mc"]["reach"] == [None, None]
    assert rows["mc"]["cols"][0] == (25.0, 20.0, 30.0) and rows["warm"]["cols"][0] == (10.0,) * 3
    text = warm_findings.format_table(t)
    assert "| CC | 0.001 | 2 | 50.0 (50.0 to 50.0)" in text and "88 (2/2 seeds)" in text and "not reached" in text
    assert "68.5 / 7.3" in text  # the paper's CC row beside ours
    png = tmp_path / "curves.png"
    warm_findings.plot_curves(runs, "building-str", png, 0.0)
    assert png.stat().st_size > 1000


def test_tags_run_trains_from_a_warm_start(tmp_path):
    cfg = WarmStartConfig(task="writing-tags", episodes=40, epochs=1.0)
    warm = make_warm_start(tmp_path / "tags", cfg, progress=False)
    start = evaluate_tags(warm, [{"topic": "pets/senior-pet", "title": "Old dog"}], repeats=4, seed=0)
    assert start["episodes"] == 4 and 0 <= start["own_tag_rate"]["forum"] <= 1
    row = warm_findings.run_one("writing-tags", warm, "cc", 0, 1e-3, True, None)
    assert row["curve"][-1][0] == warm_findings.SMOKE["budget"]  # env steps counted up to the budget
    assert set(row["eval"]) >= {"return_mean", "own_tag_rate", "perfect_rate"}
