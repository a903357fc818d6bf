"""Writing tasks: two agents write two complementary parts of one text from a source document (one turn).

* ``writing-summary``: agents ``concise`` and ``detailed``; from a forum post, a short and a long summary.
* ``writing-intro``: agents ``background`` and ``method``; from a research abstract, the two halves of an
  introduction (background and motivation; method and implications).

The team reward is a level-gated score in [0, 3] (rules and examples: ``docs/tasks/writing.md``):

1. **length** (gate, up to 1): each part's word count inside its window; partial credit by distance to the window.
2. **ratio** (1 or 0, only when level 1 is full): the length ratio between the two parts inside a band.
3. **style** (up to 1, only when level 2 is met): vocabulary diversity, transitions, overlap between the parts
   and with the source, multiplied by a copy factor that falls to 0 for long verbatim copies of the source.

Each level is a GRPO-style reward function ``f(prompts, completions, document, **columns) -> list[float]`` that
applies its own gate, so the three sum to the combined score (also exposed as ``summary_reward`` /
``intro_reward``). The env uses the three level functions so the logs show each level (``rewards/<name>``).

The tasks' data (``load_posts``, ``load_abstracts``: the shipped sample or a Hugging Face dataset, the train / eval
split) is in ``writing_data.py``; this module registers both tasks with it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..chat import ChatPrompt, system_user
from ..envs import RewardFunctionEnv
from . import TaskSpec, register_task
from .writing_data import EVAL_PERCENT, load_abstracts, load_posts  # the tasks' data, re-exported here

__all__ = [
    "WritingRules",
    "WritingScore",
    "SUMMARY_RULES",
    "INTRO_RULES",
    "words",
    "score_pair",
    "make_reward_funcs",
    "summary_length_reward",
    "summary_ratio_reward",
    "summary_style_reward",
    "summary_reward",
    "intro_length_reward",
    "intro_ratio_reward",
    "intro_style_reward",
    "intro_reward",
    "make_summary_env",
    "make_intro_env",
    "load_posts",
    "load_abstracts",
    "EVAL_PERCENT",
]

# ----------------------------------------------------------------------------------------------------------------
# Rules
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WritingRules:
    """Thresholds of the three reward levels for one task. ``parts`` are the agents' roles, in team order."""

    task: str
    parts: tuple[str, str]
    windows: tuple[tuple[int, int], tuple[int, int]]  # inclusive (min, max) words per part
    ratio: tuple[int, int]  # (numerator part, denominator part) of the length ratio
    ratio_band: tuple[float, float]  # inclusive
    ttr_threshold: float = 0.5  # type/token ratio that earns full diversity credit
    grounding_threshold: float = 0.3  # share of a part's content words found in the source for full credit
    min_shared: int = 2  # content words both parts must share for full overlap credit
    copy_free_run: int = 8  # a verbatim run from the source up to this many words costs nothing
    copy_zero_run: int = 16  # ... and from this many words on, level 3 is 0

    def __post_init__(self):
        for lo, hi in self.windows:
            if not 0 < lo <= hi:
                raise ValueError(f"WritingRules({self.task}): window ({lo}, {hi}) must satisfy 0 < min <= max.")
        if not 0 < self.ratio_band[0] <= self.ratio_band[1]:
            raise ValueError(f"WritingRules({self.task}): ratio_band {self.ratio_band} must satisfy 0 < low <= high.")
        if sorted(self.ratio) != [0, 1]:
            raise ValueError(f"WritingRules({self.task}): ratio must be (0, 1) or (1, 0), got {self.ratio}.")
        if not 0 <= self.copy_free_run < self.copy_zero_run:
            raise ValueError(f"WritingRules({self.task}): need 0 <= copy_free_run < copy_zero_run.")


SUMMARY_RULES = WritingRules(
    task="writing-summary",
    parts=("concise", "detailed"),
    windows=((15, 40), (60, 120)),
    ratio=(1, 0),  # detailed / concise
    ratio_band=(2.0, 4.0),
)

INTRO_RULES = WritingRules(
    task="writing-intro",
    parts=("background", "method"),
    windows=((60, 120), (60, 120)),
    ratio=(0, 1),  # background / method
    ratio_band=(0.6, 1.6),
)

# Level-3 weights (sum 1.0): diversity 0.2 per part, transitions 0.1 per part, overlap between the parts 0.2,
# grounding in the source 0.1 per part.
W_DIVERSITY, W_TRANSITION, W_OVERLAP, W_GROUNDING = 0.2, 0.1, 0.2, 0.1

# ----------------------------------------------------------------------------------------------------------------
# Text measures
# ----------------------------------------------------------------------------------------------------------------

# Letters/digits with inner apostrophes or hyphens ("don't", "well-known"). Underscores are excluded so "____"
# is not a word; Python's \w is Unicode-aware, so "café" or "naïve" count as one word each.
_WORD_RE = re.compile(r"[^\W_]+(?:['\u2019-][^\W_]+)*")
# A "word" longer than this is junk (a pasted hash, "aaaa...") and is not counted, so one huge token cannot fill
# a length window; 30 letters still admits long real words.
MAX_WORD_CHARS = 30

TRANSITIONS = (
    "however",
    "therefore",
    "thus",
    "moreover",
    "furthermore",
    "meanwhile",
    "consequently",
    "because",
    "since",
    "although",
    "though",
    "but",
    "so",
    "yet",
    "instead",
    "overall",
    "finally",
    "first",
    "then",
    "also",
    "while",
    "in short",
    "in addition",
    "as a result",
    "for example",
    "for instance",
    "in contrast",
    "on the other hand",
    "this means",
    "which means",
    "in particular",
    "in turn",
)
_TRANSITION_RE = re.compile(r"\b(?:" + "|".join(re.escape(t) for t in TRANSITIONS) + r")\b")

# Function words do not show grounding or cohesion: sharing "the" with the source proves nothing.
STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be been before being below between both but by
    can could did do does doing down during each few for from further had has have having he her here hers him his
    how i if in into is it its itself just me more most my no nor not now of off on once only or other our ours out
    over own same she should so some such than that the their theirs them then there these they this those through
    to too under until up very was we were what when where which while who whom why will with would you your yours
    also one two get got very much many really like""".split()
)
_STEM = 5  # content words match on their first 5 letters: "complained" ~ "complaint", "summaries" ~ "summary"


def _normalize(text: str) -> str:
    # NFKC folds look-alike forms (full-width letters, ligatures) so they cannot dodge the copy check.
    return unicodedata.normalize("NFKC", text).casefold()


def words(text: str) -> list[str]:
    """The words of ``text`` (normalized, case-folded) that the reward counts."""
    return [w for w in _WORD_RE.findall(_normalize(text)) if len(w) <= MAX_WORD_CHARS]


def _content_stems(ws: Sequence[str]) -> set[str]:
    return {w[:_STEM] for w in ws if len(w) >= 3 and w not in STOPWORDS and not w.isdigit()}


def _length_credit(n: int, window: tuple[int, int]) -> float:
    """1 inside the window; n/min below it; 1 - (n - max)/max above it (0 at twice the max); 0 when empty."""
    lo, hi = window
    if n <= 0:
        return 0.0
    if n < lo:
        return n / lo
    if n > hi:
        return max(0.0, 1.0 - (n - hi) / hi)
    return 1.0


def _longest_common_run(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest run of consecutive words shared by ``a`` and ``b`` (sparse DP over matches only)."""
    positions: dict[str, list[int]] = {}
    for j, w in enumerate(b):
        positions.setdefault(w, []).append(j)
    best, prev = 0, {}
    for w in a:
        cur = {j: prev.get(j - 1, 0) + 1 for j in positions.get(w, ())}
        if cur:
            best = max(best, max(cur.values()))
        prev = cur
    return best


@dataclass
class WritingScore:
    """The score of one pair of texts, level by level, with the measures behind it (for logs and docs)."""

    level1: float
    level2: float
    level3: float
    details: dict = field(default_factory=dict)

    @property
    def total(self) -> float:
        return round(self.level1 + self.level2 + self.level3, 6)


def score_pair(first: str, second: str, document: str, rules: WritingRules) -> WritingScore:
    """Score the team's two texts (in ``rules.parts`` order) against the source ``document``."""
    texts = (_as_text(first), _as_text(second))
    ws = [words(t) for t in texts]
    counts = [len(w) for w in ws]
    details: dict = {"words": counts}

    # Level 1: half a point per part, by distance to its window. round() keeps a perfect score exactly 1.0/3.0.
    level1 = round(sum(0.5 * _length_credit(n, win) for n, win in zip(counts, rules.windows)), 6)
    if level1 < 1.0:
        return WritingScore(level1, 0.0, 0.0, details)

    # Level 2: both parts are non-empty here (level 1 is full), so the ratio is defined.
    num, den = rules.ratio
    ratio = counts[num] / counts[den]
    details["ratio"] = round(ratio, 4)
    if not rules.ratio_band[0] <= ratio <= rules.ratio_band[1]:
        return WritingScore(level1, 0.0, 0.0, details)

    # Level 3.
    source = words(document or "")
    source_stems = _content_stems(source)
    ttr = [len(set(w)) / len(w) for w in ws]
    diversity = sum(W_DIVERSITY * min(1.0, t / rules.ttr_threshold) for t in ttr)
    has_transition = [bool(_TRANSITION_RE.search(" ".join(w))) for w in ws]
    transitions = W_TRANSITION * sum(has_transition)
    stems = [_content_stems(w) for w in ws]
    shared = len(stems[0] & stems[1])
    overlap = W_OVERLAP * min(1.0, shared / rules.min_shared) if rules.min_shared > 0 else W_OVERLAP
    grounded = [len(s & source_stems) / len(s) if s else 0.0 for s in stems]
    grounding = sum(W_GROUNDING * min(1.0, g / rules.grounding_threshold) for g in grounded)
    run = max(_longest_common_run(w, source) for w in ws)
    span = rules.copy_zero_run - rules.copy_free_run
    copy_factor = min(1.0, max(0.0, (rules.copy_zero_run - run) / span))
    level3 = round(copy_factor * (diversity + transitions + overlap + grounding), 6)
    details.update(
        ttr=[round(t, 4) for t in ttr],
        transitions=has_transition,
        shared_words=shared,
        grounding=[round(g, 4) for g in grounded],
        longest_copy=run,
        copy_factor=round(copy_factor, 4),
        parts={
            "diversity": round(diversity, 6),
            "transitions": round(transitions, 6),
            "overlap": round(overlap, 6),
            "grounding": round(grounding, 6),
        },
    )
    return WritingScore(level1, 1.0, level3, details)


def _as_text(completion) -> str:
    """A completion as text: a str, None (nothing written), or a chat (list of messages: the last one's content)."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], Mapping):
        return str(completion[-1].get("content") or "")
    raise TypeError(f"writing reward: a completion must be a str, got {type(completion).__name__}.")


# ----------------------------------------------------------------------------------------------------------------
# Reward functions (GRPO convention)
# ----------------------------------------------------------------------------------------------------------------


def _batch_scores(rules: WritingRules, name: str, completions, document) -> list[WritingScore]:
    if completions is None:
        raise ValueError(
            f"reward function '{name}' needs completions (one [{rules.parts[0]}, {rules.parts[1]}] pair per episode)."
        )
    if document is None:
        raise ValueError(
            f"reward function '{name}' needs a 'document' column (the source text) in the dataset; "
            f"load the data with the task's load_dataset, which provides it."
        )
    if len(document) != len(completions):
        raise ValueError(
            f"reward function '{name}' got {len(completions)} completion pairs but {len(document)} documents."
        )
    out = []
    for e, (pair, doc) in enumerate(zip(completions, document)):
        if isinstance(pair, str) or len(pair) != 2:
            got = "a single str" if isinstance(pair, str) else f"{len(pair)} completions"
            raise ValueError(
                f"reward function '{name}' got {got} for episode {e}; {rules.task} needs exactly two "
                f"({rules.parts[0]}, {rules.parts[1]})."
            )
        out.append(score_pair(pair[0], pair[1], doc, rules))
    return out


def make_reward_funcs(rules: WritingRules, prefix: str | None = None) -> tuple[Callable, Callable, Callable, Callable]:
    """``(length, ratio, style, combined)`` reward functions for ``rules``; each returns one float per episode.

    The level functions apply their own gates, so ``length + ratio + style == combined`` for every episode.
    """
    prefix = prefix or rules.task.split("-")[-1]

    def make(attr: str, suffix: str) -> Callable:
        name = f"{prefix}_{suffix}"

        def reward(prompts=None, completions=None, document=None, **columns) -> list[float]:
            return [getattr(s, attr) for s in _batch_scores(rules, name, completions, document)]

        reward.__name__ = reward.__qualname__ = name
        reward.__doc__ = f"{rules.task}: {suffix.replace('_', ' ')} (see docs/tasks/writing.md)."
        return reward

    return (
        make("level1", "length_reward"),
        make("level2", "ratio_reward"),
        make("level3", "style_reward"),
        make("total", "reward"),
    )


summary_length_reward, summary_ratio_reward, summary_style_reward, summary_reward = make_reward_funcs(SUMMARY_RULES)
intro_length_reward, intro_ratio_reward, intro_style_reward, intro_reward = make_reward_funcs(INTRO_RULES)

# ----------------------------------------------------------------------------------------------------------------
# Prompts
# ----------------------------------------------------------------------------------------------------------------

_ROLE_INSTRUCTIONS = {
    "concise": "a concise summary of the post: the main situation and the question, in one or two sentences",
    "detailed": "a detailed summary of the post: the situation, the important details, what was tried and what "
    "the author asks",
    "background": "the first half of an introduction for this study: the background and the motivation (why the "
    "problem matters and what is missing)",
    "method": "the second half of an introduction for this study: the method and its implications (what the "
    "study does, how, and what the results mean)",
}
_SOURCE_LABEL = {"writing-summary": "Post", "writing-intro": "Abstract"}


def make_formatters(rules: WritingRules) -> dict[str, Callable[[dict], ChatPrompt]]:
    """One prompt formatter per role; the prompt states the role, the length window and the teammate's part. Each
    returns a `ChatPrompt`: agents with a chat template get its system/user form (trl_collm/chat.py)."""
    label = _SOURCE_LABEL.get(rules.task, "Source")

    def formatter(index: int) -> Callable[[dict], str]:
        role, other = rules.parts[index], rules.parts[1 - index]
        lo, hi = rules.windows[index]
        olo, ohi = rules.windows[1 - index]
        what = _ROLE_INSTRUCTIONS.get(role, f"the {role} part")

        def fmt(row: dict) -> ChatPrompt:
            title = (row.get("title") or "").strip()
            head = f"Title: {title}\n" if title else ""
            instructions = (
                f"You are the {role} writer of a two-person writing team. Write {what}.\n"
                f"Length: {lo} to {hi} words. Your teammate writes the {other} part ({olo} to {ohi} words).\n"
                f"Use your own words: do not copy long phrases from the {label.lower()}. Connect your sentences "
                f"with transition words (for example 'because', 'however', 'as a result'). "
                f"Reply with your text only."
            )
            source = f"{head}{label}:\n{row['document']}"
            # Plain form for models without a chat template (it cues the answer); chat form: instructions as the
            # system message, the source then a one-line request as the user's. Without the request SmolLM2-135M
            # answers the post's author ("I'm sorry for ...") instead of summarising it (docs/chat.md).
            plain = f"{instructions}\n\n{source}\n\n{role.capitalize()} text:"
            request = f"Write {what.split(':')[0]} ({lo} to {hi} words)."
            return ChatPrompt(plain, system_user(instructions, f"{source}\n\n{request}"))

        fmt.__name__ = f"{role}_prompt"
        return fmt

    return {rules.parts[i]: formatter(i) for i in range(2)}


def _make_env(
    rules: WritingRules, default: WritingRules, formatters=None, reward_type: str = "joint"
) -> RewardFunctionEnv:
    if rules.parts != default.parts:
        raise ValueError(f"{default.task}: rules.parts must be {default.parts} (the task's agents), got {rules.parts}.")
    length, ratio, style, _ = make_reward_funcs(rules)
    return RewardFunctionEnv(
        [length, ratio, style],
        formatters=formatters if formatters is not None else make_formatters(rules),
        agent_names=list(rules.parts),
        reward_type=reward_type,
    )


def make_summary_env(rules: WritingRules | None = None, formatters=None) -> RewardFunctionEnv:
    """The ``writing-summary`` env. ``rules`` overrides thresholds; ``formatters`` ({role: row -> prompt})
    overrides the prompts (e.g. to apply a chat template)."""
    return _make_env(rules or SUMMARY_RULES, SUMMARY_RULES, formatters)


def make_intro_env(rules: WritingRules | None = None, formatters=None) -> RewardFunctionEnv:
    """The ``writing-intro`` env; options as in :func:`make_summary_env`."""
    return _make_env(rules or INTRO_RULES, INTRO_RULES, formatters)


# ----------------------------------------------------------------------------------------------------------------
# Registration
# ----------------------------------------------------------------------------------------------------------------

_ENV_OPTIONS = {
    "rules": "WritingRules overriding windows, ratio band and level-3 thresholds (parts must stay the same)",
    "formatters": "dict role -> (row -> prompt str) replacing the built-in prompts",
}

register_task(
    TaskSpec(
        name="writing-summary",
        description="From a forum post, agent 'concise' writes a 15-40 word summary and agent 'detailed' a 60-120 "
        "word one (detailed/concise in [2, 4]); level-gated reward, max 3.",
        agent_names=list(SUMMARY_RULES.parts),
        num_turns=1,
        make_env=make_summary_env,
        load_dataset=load_posts,
        max_reward=3.0,
        options=dict(_ENV_OPTIONS),
    )
)

register_task(
    TaskSpec(
        name="writing-intro",
        description="From a research abstract, agent 'background' writes background and motivation and agent "
        "'method' the method and implications (60-120 words each, ratio in [0.6, 1.6]); level-gated reward, max 3.",
        agent_names=list(INTRO_RULES.parts),
        num_turns=1,
        make_env=make_intro_env,
        load_dataset=load_abstracts,
        max_reward=3.0,
        options=dict(_ENV_OPTIONS),
    )
)
