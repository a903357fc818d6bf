"""Built-in writing tasks (writing-summary, writing-intro): reward levels, offline data, env, short trainer runs.

Expected scores are derived by hand in the comments (word counts were counted once and are asserted too, so a
change in word counting shows up as a count mismatch rather than a puzzling score).
"""

from __future__ import annotations

import math

import pytest

from trl_collm.tasks import get_task, list_tasks
from trl_collm.tasks import writing as W

SUM, INTRO = W.SUMMARY_RULES, W.INTRO_RULES

# ---------------------------------------------------------------------------------------------------------------
# Hand-written texts
# ---------------------------------------------------------------------------------------------------------------

DOC = (
    "My neighbor plays loud music every night until two in the morning. I work early shifts at the hospital, "
    "so I barely sleep before my alarm goes off. Last month I asked him politely to turn it down, and he agreed, "
    "but the noise came back after a week. My landlord says that noise between tenants is not his problem. "
    "Other people in the building complain in the group chat, yet nobody has filed anything official. "
    "Should I call the city noise line or write a formal letter first?"
)
CONCISE = (
    "A neighbor's late music keeps a hospital worker awake, but polite requests failed, "
    "so they ask whether to call the city or write a letter."
)  # 25 words; transitions "but", "so"
DETAILED = (
    "The writer works early hospital shifts and lives below a neighbor who blasts music late at night. "
    "At first, a polite talk seemed to help; however, the loud parties returned within days. "
    "Their landlord refuses to get involved, and although other tenants grumble online, none has acted. "
    "As a result, the writer wonders which step comes first: a complaint to the city hotline or a formal written "
    "letter."
)  # 68 words; ratio 68/25 = 2.72 in [2, 4]

# The same content without a single transition marker (no but/so/first/however/because/...).
CONCISE_PLAIN = (
    "A hospital worker with early shifts loses sleep to a neighbor's nightly music and asks whether to call the city "
    "noise line."
)  # 22 words
DETAILED_PLAIN = (
    "The writer works early hospital shifts and lives near a neighbor who plays music late every night. "
    "A polite talk helped for about a week. The landlord refuses to step in. Other tenants grumble in a group chat, "
    "and none of them has filed a complaint. The writer wants to know whether a call to the city noise line or a "
    "formal letter is the better opening move."
)  # 68 words

ABSTRACT = (
    "Flash floods in steep mountain catchments damage homes and roads every year, yet most small rivers have "
    "no gauging station. Warnings therefore rely on coarse regional forecasts that often arrive too late. "
    "We present Rainlink, a method that combines satellite rainfall estimates with cheap water level sensors "
    "through a physics informed neural network. The network respects mass balance, so it needs few labelled "
    "floods. We evaluate it on forty catchments over six years. Rainlink reduces peak flow error by 23 percent "
    "compared with the operational model and gives warnings two hours earlier on average. These results "
    "suggest that local agencies could issue better warnings with existing budgets."
)
BACKGROUND = (
    "Every year, sudden floods in steep mountain valleys destroy houses, cut roads and put lives at risk. "
    "However, most small rivers carry no gauging station, so nobody measures how quickly the water rises. "
    "As a result, local warnings depend on broad regional forecasts that miss short, intense storms and often "
    "come too late for residents to act. Better flood warnings for these catchments would protect people "
    "without large new investments."
)  # 70 words
METHOD = (
    "To close this gap, the study introduces Rainlink, which merges satellite rainfall data with inexpensive "
    "water level sensors inside a neural network that obeys mass balance. Because physics constrains the model, "
    "only a handful of recorded floods are needed for training. Across forty catchments and six years, peak flow "
    "errors fell by almost a quarter, and alerts came two hours sooner. Consequently, local agencies could "
    "deliver better flood warnings with the budgets they already have."
)  # 75 words; ratio 70/75 = 0.933 in [0.6, 1.6]


def filler(n: int, stem: str = "w") -> str:
    """n distinct made-up words: exact word counts for the length and ratio tests."""
    return " ".join(f"{stem}{i}" for i in range(n))


def summary(a, b, doc=DOC) -> W.WritingScore:
    return W.score_pair(a, b, doc, SUM)


def fullwidth(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


# ---------------------------------------------------------------------------------------------------------------
# Word counting and level 1
# ---------------------------------------------------------------------------------------------------------------


def test_word_counting():
    assert W.words("Don't stop - well-known Café, ____ 42!") == ["don't", "stop", "well-known", "café", "42"]
    assert W.words(" \n\t\u200b ") == []
    assert W.words("🙂🙂 … ---") == []
    assert W.words("a" * 30) == ["a" * 30] and W.words("a" * 31) == []  # MAX_WORD_CHARS = 30
    assert W.words("ＦＵＬＬ width") == ["full", "width"]  # NFKC + casefold
    assert [len(W.words(t)) for t in (DOC, CONCISE, DETAILED, CONCISE_PLAIN, DETAILED_PLAIN)] == [89, 25, 68, 22, 68]
    assert [len(W.words(t)) for t in (ABSTRACT, BACKGROUND, METHOD)] == [107, 70, 75]


@pytest.mark.parametrize(
    "n, window, expected",
    [
        (0, (15, 40), 0.0),
        (5, (15, 40), 5 / 15),  # below: n / min
        (15, (15, 40), 1.0),
        (40, (15, 40), 1.0),
        (60, (15, 40), 0.5),  # above: 1 - (60 - 40) / 40
        (80, (15, 40), 0.0),  # twice the max
        (500, (15, 40), 0.0),
        (150, (60, 120), 0.75),  # 1 - 30 / 120
    ],
)
def test_length_credit(n, window, expected):
    assert W._length_credit(n, window) == pytest.approx(expected)


def test_perfect_pairs_score_three():
    s = summary(CONCISE, DETAILED)
    assert (s.level1, s.level2, s.level3, s.total) == (1.0, 1.0, 1.0, 3.0)
    assert s.details["words"] == [25, 68] and s.details["ratio"] == 2.72
    i = W.score_pair(BACKGROUND, METHOD, ABSTRACT, INTRO)
    assert (i.level1, i.level2, i.level3, i.total) == (1.0, 1.0, 1.0, 3.0)


def test_empty_and_one_empty():
    assert summary("", "").total == 0.0
    assert summary(None, None).total == 0.0
    # One part empty: its half of level 1 is 0, the other half is full -> 0.5; the gate stops there.
    s = summary("", DETAILED)
    assert (s.level1, s.level2, s.level3) == (0.5, 0.0, 0.0)
    assert summary(CONCISE, "").total == 0.5


def test_too_short_and_too_long_stop_at_level1():
    # 5 words, window 15-40: 0.5 * 5/15 + 0.5 * 1 = 0.666667.
    assert summary("Loud neighbor music ruins sleep.", DETAILED).total == pytest.approx(0.666667)
    # 150 words, window 60-120: 0.5 + 0.5 * (1 - 30/120) = 0.875.
    assert summary(CONCISE, filler(150)).total == pytest.approx(0.875)
    # 240 words = twice the max: 0.5 + 0 = 0.5.
    assert summary(CONCISE, filler(240)).total == 0.5
    # both wrong: 0.5 * 10/15 + 0.5 * 30/60 = 0.583333.
    assert summary(filler(10), filler(30)).total == pytest.approx(0.583333)


# ---------------------------------------------------------------------------------------------------------------
# Level 2: ratio band
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n1, n2, level2",
    [
        (40, 60, 0.0),  # detailed/concise = 1.5 < 2
        (15, 61, 0.0),  # 4.07 > 4
        (30, 60, 1.0),  # 2.0: the band is inclusive
        (15, 60, 1.0),  # 4.0
    ],
)
def test_summary_ratio_band(n1, n2, level2):
    s = summary(filler(n1, "c"), filler(n2, "d"))
    assert s.level1 == 1.0 and s.level2 == level2
    if level2 == 0.0:
        assert s.total == 1.0  # stops at the level-1 score


@pytest.mark.parametrize(
    "n1, n2, level2",
    [
        (60, 101, 0.0),  # background/method = 0.594 < 0.6
        (120, 74, 0.0),  # 1.62 > 1.6
        (60, 100, 1.0),  # 0.6
        (120, 75, 1.0),  # 1.6
    ],
)
def test_intro_ratio_band(n1, n2, level2):
    s = W.score_pair(filler(n1, "b"), filler(n2, "m"), ABSTRACT, INTRO)
    assert s.level1 == 1.0 and s.level2 == level2
    if level2 == 0.0:
        assert s.total == 1.0


# ---------------------------------------------------------------------------------------------------------------
# Level 3
# ---------------------------------------------------------------------------------------------------------------


def test_low_diversity_is_partial():
    # A 10-word sentence (10 distinct words) said 7 times: 70 words, TTR 10/70 = 1/7.
    # diversity = 0.2 * min(1, 0.92/0.5) + 0.2 * (1/7)/0.5 = 0.2 + 0.057143; other components are full (0.6).
    repeated = " ".join(["However, loud neighbor music keeps one hospital worker awake nightly."] * 7)
    s = summary(CONCISE, repeated)
    assert s.details["words"] == [25, 70]
    assert s.level3 == pytest.approx(0.857143) and s.total == pytest.approx(2.857143)


def test_no_transitions_loses_point_two():
    s = summary(CONCISE_PLAIN, DETAILED_PLAIN)
    assert s.details["transitions"] == [False, False]
    assert s.level3 == pytest.approx(0.8) and s.total == pytest.approx(2.8)


def test_verbatim_copy_of_source_is_penalized():
    copied = " ".join(DOC.split()[:64])  # 64 words straight from the post: longest run 64 >= 16 -> factor 0
    s = summary(CONCISE, copied)
    assert s.details["longest_copy"] == 64 and s.level3 == 0.0 and s.total == 2.0
    # A 12-word verbatim run: factor (16 - 12) / 8 = 0.5 on an otherwise perfect level 3.
    partial = DETAILED.replace(
        "The writer works early hospital shifts and lives below a neighbor who blasts music late at night.",
        "The writer explains: I work early shifts at the hospital, so I barely sleep before dawn arrives.",
    )
    s = summary(CONCISE, partial)
    assert s.details["longest_copy"] == 12 and s.details["copy_factor"] == 0.5
    assert s.total == pytest.approx(2.5)


def test_adversarial_inputs():
    assert summary("   \n\t ", " \u200b\u200b ").total == 0.0  # whitespace / zero-width only
    assert summary("🙂" * 50, "🙂 " * 100).total == 0.0  # no letters at all
    assert summary("a" * 10_000, DETAILED).total == 0.5  # one huge "word" is not a word: concise is empty
    assert summary(CONCISE, " ".join(["x" * 31] * 100)).total == 0.5  # junk tokens do not fill a window
    # A copy in full-width letters is still a copy (NFKC): same score as the plain copy.
    assert summary(CONCISE, fullwidth(" ".join(DOC.split()[:64]))).total == 2.0
    # Accented words are ordinary words; a chat-style completion is read from its last message.
    assert len(W.words("Café naïve Zürich")) == 3
    assert summary([{"role": "assistant", "content": CONCISE}], DETAILED).total == 3.0
    with pytest.raises(TypeError, match="must be a str"):
        summary(123, DETAILED)


# ---------------------------------------------------------------------------------------------------------------
# Reward functions (GRPO convention)
# ---------------------------------------------------------------------------------------------------------------


def test_level_functions_sum_to_combined():
    completions = [[CONCISE, DETAILED], ["", DETAILED], [filler(40), filler(60)], [CONCISE_PLAIN, DETAILED_PLAIN]]
    docs = [DOC] * 4
    levels = [
        f(prompts=None, completions=completions, document=docs)
        for f in (W.summary_length_reward, W.summary_ratio_reward, W.summary_style_reward)
    ]
    combined = W.summary_reward(prompts=None, completions=completions, document=docs, title=["t"] * 4)
    assert levels[0] == [1.0, 0.5, 1.0, 1.0]
    assert levels[1] == [1.0, 0.0, 0.0, 1.0]
    assert levels[2] == [1.0, 0.0, 0.0, pytest.approx(0.8)]
    assert combined == [pytest.approx(sum(col)) for col in zip(*levels)] == [3.0, 0.5, 1.0, pytest.approx(2.8)]
    assert W.intro_reward(prompts=None, completions=[[BACKGROUND, METHOD]], document=[ABSTRACT]) == [3.0]
    assert W.summary_reward.__name__ == "summary_reward" and W.intro_style_reward.__name__ == "intro_style_reward"


def test_reward_function_errors():
    with pytest.raises(ValueError, match="'document' column"):
        W.summary_reward(prompts=None, completions=[[CONCISE, DETAILED]])
    with pytest.raises(ValueError, match="needs exactly two"):
        W.summary_reward(prompts=None, completions=[[CONCISE]], document=[DOC])
    with pytest.raises(ValueError, match="window"):
        W.WritingRules(task="x", parts=("a", "b"), windows=((0, 10), (5, 10)), ratio=(0, 1), ratio_band=(1, 2))


# ---------------------------------------------------------------------------------------------------------------
# Registry and data
# ---------------------------------------------------------------------------------------------------------------


def test_registered_specs():
    assert {"writing-summary", "writing-intro"} <= set(list_tasks())
    for name, agents in [("writing-summary", ["concise", "detailed"]), ("writing-intro", ["background", "method"])]:
        spec = get_task(name)
        assert spec.agent_names == agents and spec.num_turns == 1 and spec.max_reward == 3.0
        env = spec.make_env()
        assert env.agent_names == agents and env.max_turns == 1


# Posts: the first 120 rows of the generator's pool split 111 / 9, plus the pool's later held-out rows (77), so that
# an evaluation resolves a change; abstracts: 120 rows split 103 / 17.
@pytest.mark.parametrize("name,num_train,num_eval", [("writing-summary", 111, 86), ("writing-intro", 103, 17)])
def test_offline_sample_and_split(name, num_train, num_eval):
    spec = get_task(name)
    train, evals = spec.load_dataset("train"), spec.load_dataset("eval")
    assert train.column_names == ["id", "topic", "title", "document"]
    rows = list(train) + list(evals)
    assert (len(train), len(evals)) == (num_train, num_eval)
    docs = [r["document"] for r in rows]
    assert len(set(docs)) == len(docs) and len({r["id"] for r in rows}) == len(rows)
    assert all(80 <= len(W.words(d)) <= 250 for d in docs)
    assert len({r["topic"] for r in rows}) >= 10  # varied topics
    # Deterministic and disjoint.
    assert list(spec.load_dataset("train")["id"]) == list(train["id"])
    assert list(spec.load_dataset("eval")["id"]) == list(evals["id"])
    assert not set(train["id"]) & set(evals["id"])
    assert list(spec.load_dataset("train", limit=3)["id"]) == list(train["id"][:3])
    assert len(spec.load_dataset("eval", limit=0)) == 0
    with pytest.raises(ValueError, match="split"):
        spec.load_dataset("test")
    with pytest.raises(ValueError, match="limit"):
        spec.load_dataset("train", limit=-1)


def test_hub_source_offline_error(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match=r"source='trl-lib/tldr'.*source=None"):
        get_task("writing-summary").load_dataset("train", source="trl-lib/tldr")


def test_hub_source_column_mapping(monkeypatch):
    import datasets

    tldr = "SUBREDDIT: r/pets\n\nTITLE: Old cat stopped eating\n\nPOST: {}\n\nTL;DR:"
    posts = [f"My cat number {i} eats half of its food and hides under the bed." for i in range(40)]
    fake = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"prompt": [tldr.format(p) for p in posts], "completion": ["x"] * 40}),
            "validation": datasets.Dataset.from_dict({"prompt": [tldr.format("Held out post.")], "completion": ["y"]}),
        }
    )
    monkeypatch.setattr(datasets, "load_dataset", lambda name, *a, **k: fake)
    train = get_task("writing-summary").load_dataset("train", source="trl-lib/tldr", limit=5)
    assert len(train) == 5 and train[0]["document"] == posts[0]
    assert train[0]["title"] == "Old cat stopped eating" and train[0]["topic"] == "r/pets"
    evals = get_task("writing-summary").load_dataset("eval", source="trl-lib/tldr")
    assert evals["document"] == ["Held out post."]

    # A single-split dataset with a custom text column: split by the same hash rule, disjoint.
    single = datasets.Dataset.from_dict({"body": posts, "title": ["t"] * 40})
    monkeypatch.setattr(datasets, "load_dataset", lambda name, *a, **k: single)
    a = get_task("writing-intro").load_dataset("train", source="me/papers", text_column="body")
    b = get_task("writing-intro").load_dataset("eval", source="me/papers", text_column="body")
    assert len(a) + len(b) == 40 and not set(a["document"]) & set(b["document"])
    with pytest.raises(ValueError, match="text_column"):
        get_task("writing-intro").load_dataset("train", source="me/papers", text_column="abstract_text")


# ---------------------------------------------------------------------------------------------------------------
# Env end-to-end with a scripted oracle team
# ---------------------------------------------------------------------------------------------------------------


def _source_words(doc: str, k: int) -> list[str]:
    """The first k distinct content words of the source (distinct on the reward's 5-letter stems)."""
    out, stems = [], set()
    for w in W.words(doc):
        if len(w) >= 4 and w.isalpha() and w not in W.STOPWORDS and w not in W.TRANSITIONS and w[:5] not in stems:
            stems.add(w[:5])
            out.append(w)
    assert len(out) >= k
    return out


def oracle_summary(row) -> list[str]:
    s = _source_words(row["document"], 16)
    concise = (
        f"In short, {s[0]}, {s[1]} and {s[2]} are the issue, but {s[3]} and {s[4]} matter too, so advice is wanted."
    )
    detailed = (
        f"The post is about {s[0]} and {s[1]}. First, it describes {s[2]}, {s[3]} and {s[4]}. "
        f"However, {s[5]} and {s[6]} make things harder, because {s[7]} keeps changing. "
        f"As a result, the author mentions {s[8]}, {s[9]} and {s[10]}. "
        f"Meanwhile, {s[11]} and {s[12]} also play a part, while {s[13]} stays open. "
        f"Finally, the author asks what to do about {s[14]} and {s[15]}. "
        f"Overall, the details about {s[1]} and {s[3]} explain why help is needed."
    )
    return [concise, detailed]


def oracle_intro(row) -> list[str]:
    s = _source_words(row["document"], 22)
    background = (
        f"Research on {s[0]} and {s[1]} matters, because {s[2]} affects many people. "
        f"However, {s[3]} and {s[4]} remain poorly understood, and {s[5]} is rarely measured well. "
        f"In particular, earlier studies of {s[6]} and {s[7]} missed important cases. "
        f"As a result, decisions about {s[8]} and {s[21]} rely on weak evidence. "
        f"Therefore, a better view of {s[9]}, {s[10]} and {s[11]} is needed before practical choices can improve."
    )
    method = (
        f"The study combines {s[6]} with {s[7]} to examine {s[12]}. "
        f"First, it collects evidence on {s[13]} and {s[14]}. "
        f"Then, a careful analysis compares {s[15]} against {s[16]} and {s[17]}. "
        f"Moreover, {s[18]} and {s[19]} are checked against {s[20]}, so each estimate can be judged. "
        f"Overall, the findings imply that {s[8]} and {s[9]} can be handled with more confidence, which means "
        f"practitioners may plan their next steps sooner."
    )
    return [background, method]


@pytest.mark.parametrize("name, oracle", [("writing-summary", oracle_summary), ("writing-intro", oracle_intro)])
def test_env_oracle_team_reaches_max(name, oracle):
    spec = get_task(name)
    env = spec.make_env()
    rows = list(spec.load_dataset("train")) + list(spec.load_dataset("eval"))
    obs = env.reset_batch(rows, 2, spec.agent_names)
    lo, hi = (SUM if name == "writing-summary" else INTRO).windows[0]
    assert f"{lo} to {hi} words" in obs[0][0] and rows[0]["document"] in obs[0][1]
    step = env.step_batch([oracle(r) for r in rows], list(range(len(rows))), 2, spec.agent_names)
    assert step.rewards.shape == (len(rows), 2) and bool(step.dones.all())
    assert step.rewards.min().item() == pytest.approx(spec.max_reward)
    prefix = name.split("-")[1]
    assert sorted(env.last_reward_components) == sorted(f"{prefix}_{k}_reward" for k in ("length", "ratio", "style"))
    # A team that writes nothing scores 0.
    env.reset_batch(rows[:3], 2, spec.agent_names)
    assert env.step_batch([["", ""]] * 3, [0, 1, 2], 2).rewards.abs().sum().item() == 0.0


# ---------------------------------------------------------------------------------------------------------------
# Short trainer runs (mechanics only)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["writing-summary", "writing-intro", "writing-revise"])
@pytest.mark.parametrize("critic_type", ["centralized", "decentralized"])
def test_trainer_runs_on_task(tmp_path, make_config, qwen_path, name, critic_type):
    from trl_collm import MultiAgentPPOTrainer

    spec = get_task(name)
    data = spec.load_dataset("train")
    # The 4 shortest posts keep the centralized critic's view (both prompts) short and the test fast.
    shortest = sorted(range(len(data)), key=lambda i: len(data[i]["document"]))[:4]
    args = make_config(
        tmp_path,
        agent_names=list(spec.agent_names),
        critic_type=critic_type,
        num_turns=spec.num_turns,
        response_length=8,
        total_episodes=4,
        num_ppo_epochs=1,
    )
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=data.select(shortest), env=spec.make_env())
    out = tr.train()
    assert out.global_step == 1 and out.metrics["objective/turns"] == spec.num_turns
    # writing-revise scores the final texts itself; the one-turn tasks log each level's reward function
    levels = [f"rewards/{name.split('-')[1]}_length_reward"] if spec.num_turns == 1 else []
    for key in ["objective/scores", "loss/policy_avg", *levels]:
        assert math.isfinite(out.metrics[key]), key
    assert 0.0 <= out.metrics["objective/scores"] <= spec.max_reward
