"""`writing-revise`: writing-summary over two turns, the reward only at the end.

Turn 1 is writing-summary's: agent `concise` drafts the 15-40 word summary of a forum post, agent `detailed` the
60-120 word one, and nothing is paid. In turn 2 each writer sees its own draft with its word count, its window, and
the teammate's draft with its count, and writes its final text; the team is paid writing-summary's level-gated score
(max 3) of the two final texts, as one joint reward at the end of the episode.

Why a second task: issue 28 asks where a critic should matter on the real model, that is over several turns with a
reward that comes late. code-humaneval has that shape but a 135M model never writes code that runs a test, so only
its first level moves; here the first level (both lengths in their windows) is what SmolLM2-135M learns within 128
env steps in one turn (docs/real_findings.md), and the second turn adds what the critic is for: a first action
whose worth shows only after the teammate's answer to it. Its rules, data and prompts are writing-summary's.
"""

from __future__ import annotations

from ..chat import ChatPrompt
from ..envs.protocol import MultiAgentEnv, StepResult
from . import TaskSpec, register_task
from .writing import SUMMARY_RULES, WritingRules, _as_text, load_posts, make_formatters, score_pair, words

NUM_TURNS = 2


def revision_prompt(rules: WritingRules, index: int, first: str, drafts: list[str], counts: list[int]) -> str:
    """Turn 2's prompt for writer `index`: the turn-1 conversation, its draft as the assistant's answer, then a user
    message with both drafts' word counts (`counts`, in `rules.parts` order) against their windows and the
    teammate's draft. The plain form (models without a chat template) restates the same in one text."""
    role, other_role = rules.parts[index], rules.parts[1 - index]
    (lo, hi), (olo, ohi) = rules.windows[index], rules.windows[1 - index]
    own, other = drafts[index], drafts[1 - index]
    n, m = counts[index], counts[1 - index]
    note = (
        f"Your draft has {n} words; your window is {lo} to {hi} words. Your teammate, the {other_role} writer "
        f'({olo} to {ohi} words), wrote {m} words:\n"{other.strip()}"\n\n'
        f"Write your final {role} text now ({lo} to {hi} words). Reply with your text only."
    )
    plain = f"{first}\n{own.strip()}\n\n{note}\n\nFinal {role} text:"
    if not isinstance(first, ChatPrompt):  # a user's formatter gave a plain prompt: the revision stays plain too
        return plain
    messages = [*first.messages, {"role": "assistant", "content": own}, {"role": "user", "content": note}]
    return ChatPrompt(plain, messages)


class RevisionEnv(MultiAgentEnv):
    """The `writing-revise` env (module docstring). Options: `rules` (WritingRules with writing-summary's parts),
    `formatters` (turn 1's prompts, {role: row -> prompt}, as writing-summary takes them), `num_turns` (>= 2: drafts
    repeat revision turns; the last one is scored)."""

    reward_type = "joint"

    def __init__(self, rules: WritingRules | None = None, formatters=None, num_turns: int = NUM_TURNS):
        rules = rules or SUMMARY_RULES
        if rules.parts != SUMMARY_RULES.parts:
            raise ValueError(
                f"writing-revise: rules.parts must be {SUMMARY_RULES.parts} (the task's agents), got {rules.parts}."
            )
        if int(num_turns) < 2:
            raise ValueError(
                f"writing-revise: num_turns must be >= 2 (a draft, then a revision), got {num_turns}; "
                "use writing-summary for one turn."
            )
        self.rules = rules
        self.formatters = formatters if formatters is not None else make_formatters(rules)
        self.agent_names = list(rules.parts)
        self.max_turns = int(num_turns)
        self.row: dict | None = None
        self.turn = 0
        self.first: list[str] = []

    def reset(self, row: dict) -> list[str]:
        if "document" not in row:
            raise ValueError(
                f"writing-revise: the row has no 'document' (keys: {sorted(row)}); use the task's load_dataset "
                "(writing-summary's posts) or rows with the same columns."
            )
        self.row, self.turn = dict(row), 0
        self.first = [self.formatters[role](self.row) for role in self.rules.parts]
        return list(self.first)

    def step(self, completions: list[str]) -> StepResult:
        if self.row is None:
            raise RuntimeError("writing-revise: step called before reset(row).")
        if len(completions) != 2:
            raise ValueError(f"writing-revise: step expects 2 completions {self.rules.parts}, got {len(completions)}.")
        texts = [_as_text(c) for c in completions]
        self.turn += 1
        if self.turn < self.max_turns:
            counts = [len(words(t)) for t in texts]
            observations = [revision_prompt(self.rules, i, self.first[i], texts, counts) for i in range(2)]
            return StepResult(reward=0.0, observations=observations, done=False, info={"words": counts})
        score = score_pair(texts[0], texts[1], self.row["document"], self.rules)
        info = {
            "words": score.details["words"],
            "level1": score.level1,
            "level2": score.level2,
            "level3": score.level3,
            "score": score.total,
        }
        return StepResult(reward=float(score.total), observations=None, done=True, info=info)


def make_revise_env(rules: WritingRules | None = None, formatters=None, num_turns: int = NUM_TURNS) -> RevisionEnv:
    return RevisionEnv(rules=rules, formatters=formatters, num_turns=num_turns)


register_task(
    TaskSpec(
        name="writing-revise",
        description="writing-summary over 2 turns: the writers draft, see each other's draft and word counts, and "
        "revise; the level-gated score (max 3) of the final texts is paid at the end only.",
        agent_names=list(SUMMARY_RULES.parts),
        num_turns=NUM_TURNS,
        make_env=make_revise_env,
        load_dataset=load_posts,
        max_reward=3.0,
        options={
            "rules": "WritingRules overriding windows, ratio band and level-3 thresholds (parts must stay the same)",
            "formatters": "dict role -> (row -> prompt) replacing turn 1's built-in prompts",
            "num_turns": "turns per episode (>= 2; the last one is scored; default 2)",
        },
    )
)
