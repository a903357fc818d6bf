"""Warm starts (trl_collm/warmstart.py) and the findings script built on them (benchmarks/research/warm_findings.py),
at toy size."""

import json
import os
import sys
from dataclasses import replace

import pytest

from trl_collm.tasks.building import parse_command
from trl_collm.warmstart import (
    TagNoise,
    WarmStartConfig,
    building_transcripts,
    evaluate_building,
    make_warm_start,
    tag_answer_rates,
    tag_transcripts,
)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "research"))
import warm_findings
import warm_tags_answers

# A toy recipe: it checks the pipeline (transcripts -> SFTTrainer -> a loadable, cached folder), not learning: the
# building prompts (600+ tokens) are too long to learn the format in CI seconds. Learning is checked on writing-tags.
TOY = WarmStartConfig(task="building-str", episodes=2, letters="I", max_letters=1, epochs=1.0, batch_size=8)
TAGS = WarmStartConfig(task="writing-tags", episodes=150, epochs=1.0, batch_size=8, learning_rate=1e-2)


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


def _answer_kinds(pairs):
    """Per transcript pair: 'own', 'teammate' or 'neither' (the tag the answer names, read off its own prompt)."""
    kinds = []
    for p in pairs:
        forum, subject = p["prompt"].split("Tags: ")[1].split("\n")[0].split(" / ")
        own, mate = (forum, subject) if p["agent"] == "forum" else (subject, forum)
        answer = p["completion"].strip()
        kinds.append("own" if answer == own else "teammate" if answer == mate else "neither")
    return kinds


def test_tag_transcripts_mix_own_teammate_and_random_answers():
    from collections import Counter

    from trl_collm.tasks import get_task
    from trl_collm.tasks.tags import tags_of

    train_tags = {t for r in get_task("writing-tags").load_dataset("train") for t in tags_of(r).values()}
    assert len(train_tags) == 26  # 12 forums + 14 subjects: the pool of the "random" answers
    cfg = WarmStartConfig.for_task("writing-tags", episodes=2000)
    assert cfg.resolved_noise() == TagNoise(own=0.45, other=0.45, random=0.1)
    pairs = tag_transcripts(cfg, cfg.resolved_noise())
    assert len(pairs) == 4000 and pairs == tag_transcripts(cfg, cfg.resolved_noise())  # 2 taggers; seeded
    assert {p["completion"].strip() for p in pairs} <= train_tags
    # a random answer is one of the 26 tags, so it is the own (teammate's) tag 1 time in 26:
    # P(own) = P(teammate) = 0.45 + 0.1 / 26 = 0.4538, P(neither) = 0.1 x 24 / 26 = 0.0923.
    # Binomial sd over 4,000 answers: 0.0079 (own) and 0.0046 (neither); the bounds are 4 sd.
    n = Counter(_answer_kinds(pairs))
    assert abs(n["own"] / 4000 - 0.4538) < 0.032 and abs(n["teammate"] / 4000 - 0.4538) < 0.032
    assert abs(n["neither"] / 4000 - 0.0923) < 0.019
    # each pure noise gives only its kind of answer
    assert set(_answer_kinds(tag_transcripts(cfg, TagNoise(own=1, other=0, random=0)))) == {"own"}
    assert set(_answer_kinds(tag_transcripts(cfg, TagNoise(own=0, other=1, random=0)))) == {"teammate"}
    n = Counter(_answer_kinds(tag_transcripts(replace(cfg, episodes=500), TagNoise(own=0, other=0, random=1))))
    assert 0.85 < n["neither"] / 1000 < 0.99  # 24/26 = 0.923


def test_recipes_per_task_and_the_command_line(monkeypatch, tmp_path):
    import trl_collm.warmstart as ws

    # building-str's recipe is the plain default: its cached warm starts keep their fingerprint
    assert WarmStartConfig.for_task("building-str").fingerprint() == WarmStartConfig(episodes=160).fingerprint()
    tags = WarmStartConfig.for_task("writing-tags", seed=3)
    assert (tags.episodes, tags.epochs, tags.seed) == (2000, 3.0, 3)
    with pytest.raises(ValueError, match="no recipe"):
        WarmStartConfig.for_task("writing-summary")
    made = []
    monkeypatch.setattr(ws, "make_warm_start", lambda out, cfg, force=False: made.append(cfg) or str(out))
    ws.main(["--task", "writing-tags", "--out", str(tmp_path / "w"), "--no-eval"])
    ws.main(["--task", "writing-tags", "--out", str(tmp_path / "w"), "--no-eval", "--episodes", "10", "--epochs", "1"])
    assert made[0] == WarmStartConfig.for_task("writing-tags")
    assert (made[1].episodes, made[1].epochs) == (10, 1.0)


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
    with open(os.path.join(toy_warm, "warmstart_stamp.json")) as f:
        stamp = json.load(f)
    assert stamp["fingerprint"] == TOY.fingerprint() and stamp["pairs"] == 2 * 2 * 4
    # same fingerprint: reused without training (SFTTrainer must not even be built)
    import trl

    monkeypatch.setattr(trl, "SFTTrainer", None)
    assert make_warm_start(toy_warm, TOY) == toy_warm
    assert TOY.fingerprint() != replace(TOY, seed=1).fingerprint()
    assert TOY.fingerprint() == replace(TOY, noise={"skip": 0.35}).fingerprint()  # spelled-out default, same start


@pytest.fixture(scope="module")
def tags_warm(tmp_path_factory):
    return make_warm_start(tmp_path_factory.mktemp("warm") / "tags", TAGS, progress=False)


def _completion_nll(model_dir_or_model, pairs):
    """Mean per-token negative log-likelihood of the completions (+ EOS) given their prompts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_collm.testing import build_tokenizer

    tok = build_tokenizer()
    model = model_dir_or_model
    if isinstance(model, str):
        model, tok = AutoModelForCausalLM.from_pretrained(model), AutoTokenizer.from_pretrained(model)
    total, count = 0.0, 0
    with torch.no_grad():
        for p in pairs:
            prompt = tok(p["prompt"], add_special_tokens=False)["input_ids"]
            answer = tok(p["completion"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            logits = model(torch.tensor([prompt + answer])).logits[0, len(prompt) - 1 : -1]
            total += torch.nn.functional.cross_entropy(logits, torch.tensor(answer), reduction="sum").item()
            count += len(answer)
    return total / count


def test_sft_learns_the_transcripts(tags_warm):
    from trl_collm.testing import build_causal_lm, build_tokenizer
    from trl_collm.warmstart import DEFAULT_DIMS

    held_out = tag_transcripts(replace(TAGS, seed=7), TAGS.resolved_noise())[:40]
    before = build_causal_lm(
        build_tokenizer(), size="tiny", seed=TAGS.seed, **DEFAULT_DIMS
    )  # the model SFT started from
    nll_before, nll_after = _completion_nll(before, held_out), _completion_nll(tags_warm, held_out)
    assert nll_before > 5.5  # about ln(512): uniform over the vocabulary
    assert nll_after < 0.6 * nll_before


def test_building_warm_start_plays_the_task(toy_warm):
    scores = evaluate_building(toy_warm, [{"target": "I", "kind": "str"}], repeats=2, seed=0, max_new_tokens=8)
    assert scores["episodes"] == 2 and set(scores["per_target"]) == {"I"}
    assert -0.25 - 1.5 <= scores["return_mean"] <= 2.0 and 0 <= scores["valid_rate"] <= 1


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


def test_a_one_method_call_keeps_the_other_methods_runs_and_table():
    # a --methods mc call without --reuse reruns MC at its size; CC's runs and MC's at another budget stay
    def run(method, seed, lr, last, budget=64, smoke=False):
        return dict(
            task="building-str",
            method=method,
            seed=seed,
            lr=lr,
            curve=[(8, 0.0), (16, last)],
            budget=budget,
            smoke=smoke,
        )

    saved = [run("cc", 0, 1e-3, 0.5), run("cc", 0, 3e-3, 0.9), run("cc", 1, 3e-3, 0.7), run("mc", 0, 1e-3, 0.4)]
    saved += [run("mc", 0, 1e-3, 0.4, budget=32), run("mc", 0, 1e-3, 0.4, smoke=True)]
    kept = warm_findings.kept_runs(saved, False, ["mc"], False, 64)
    assert kept == saved[:3] + saved[4:]
    assert warm_findings.kept_runs(saved, True, ["mc"], False, 64) == saved
    new_mc = [run("mc", 0, 1e-2, 0.8), run("mc", 0, 3e-2, 0.6), run("mc", 1, 1e-2, 0.75)]
    chosen, mine = warm_findings.table_runs(kept + new_mc, "building-str", False, 64, 0)
    assert chosen == {"cc": 3e-3, "mc": 1e-2}  # CC's rate from its saved sweep-seed runs, not from seed 1
    assert mine == [saved[1], saved[2], new_mc[0], new_mc[2]]


def test_tags_run_trains_from_a_warm_start(tags_warm):
    row = warm_findings.run_one("writing-tags", tags_warm, "cc", 0, 1e-3, True, None)
    assert row["curve"][-1][0] == warm_findings.SMOKE["budget"]  # env steps counted up to the budget
    assert set(row["eval"]) >= {"return_mean", "own_tag_rate", "teammate_tag_rate", "perfect_rate"}


@pytest.mark.parametrize("method", ["cc", "mc"])
def test_building_run_trains_and_renders_from_a_warm_start(toy_warm, method, tmp_path):
    """The paper-table run itself at toy size (the CI smoke of `warm_findings.py --tasks building-str`): a CC team
    with its joint-view critic, or MC, trains from the warm folder to the step budget, plays the eval targets, and
    renders its worlds."""
    row = warm_findings.run_one("building-str", toy_warm, method, 0, 1e-3, True, str(tmp_path))
    # one iteration, the smallest the smoke budget (8 env steps) rounds up to: 4 episodes x 4 turns (CC), or one
    # prompt x G = 4 samples x 4 turns (MC)
    assert [steps for steps, _ in row["curve"]] == [16.0]
    assert set(row["eval"]) >= {"iou_pct", "adj_pct", "return_mean", "valid_rate"}
    assert (len(row["critic_ev"]) == len(row["curve"])) if method == "cc" else row["critic_ev"] == []
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == [f"{method}-seed0-lr0.001-b8-{t}.png" for t in sorted(warm_findings.RENDER_TARGETS)]


def test_tag_answer_rates_count_own_and_teammate_tags():
    rows = [{"topic": "cars/used-car"}, {"topic": "pets/senior-pet"}, {"topic": "cars/used-car"}]
    texts = [  # (forum tagger, subject tagger) per row
        (" cars", " cars"),  # forum right; subject wrote the teammate's tag
        (" senior-pet pets", " senior"),  # forum wrote both tags; subject wrote a fragment (neither)
        (" used-car", " used-car"),  # forum wrote the teammate's tag; subject right
    ]
    rates = tag_answer_rates(rows, texts)
    assert rates["own_tag_rate"] == pytest.approx({"forum": 2 / 3, "subject": 1 / 3})
    assert rates["teammate_tag_rate"] == pytest.approx({"forum": 2 / 3, "subject": 1 / 3})
    rates = tag_answer_rates(rows[:1], [(" used-car", " cars")])  # both wrote the other's tag
    assert rates == {"own_tag_rate": {"forum": 0, "subject": 0}, "teammate_tag_rate": {"forum": 1, "subject": 1}}


def test_warm_tags_answers_sorts_answers_by_kind():
    rows = [{"topic": "cars/used-car"}] * 3
    texts = [(" cars", " cars"), (" used-car cars", " pets"), (" legaladv", " roommates")]
    kinds = warm_tags_answers.answer_kinds(rows, texts)
    assert kinds["forum"] == {"own": 1, "both": 1, "no tag": 1}  # a fragment of a tag is no tag
    assert kinds["subject"] == {"teammate": 1, "another tag": 2}  # pets, roommates: tags of other posts


def test_a_call_at_another_budget_may_not_replace_a_files_table():
    """warm_findings keeps one table per JSON file: runs of another size there mean another table, which this call's
    table and figure would replace; it is refused with the flags that give the new size files of its own."""
    saved = [dict(method="cc", budget=128, smoke=False), dict(method="mc", budget=128, smoke=False)]
    assert warm_findings.other_sizes(saved, "d/w.json", "building-str", 128, False) is None
    assert warm_findings.other_sizes([], "d/w.json", "building-str", 1024, False) is None
    why = warm_findings.other_sizes(saved, "d/w.json", "building-str", 1024, False)
    assert "d/w.json holds building-str runs at budget 128" in why and "this call's budget 1024" in why
    assert "--out-dir docs/data/warm_findings_1024 --png-prefix docs/warm_findings_1024" in why
    assert "budget 128 (smoke)" in warm_findings.other_sizes(
        [dict(method="cc", budget=128, smoke=True)], "d/w.json", "building-str", 128, False
    )
