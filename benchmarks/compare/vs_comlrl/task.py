"""The one task both harnesses train on: the penalty game (k = -10), written once, no imports beyond the stdlib.

Two players answer a prompt each without seeing the other; an answer is read as an action (the leading option
letter A/B/C, else its first non-space character's code modulo 3, so a random-init tiny model's every answer is a
valid action). Team payoff / 10: A/A and C/C pay 1.0, A/C and C/A cost 1.0, B/B pays 0.2, the rest 0. A uniformly
random team scores about 0.02-0.05; the optimum is 1.0. This is the same game as trl_collm's `coord-penalty`, but
spelled out here so that the comlrl virtualenv (which has no trl_collm) runs exactly the same code.

Both libraries get the same dataset rows (``{"round": i}``), the same per-agent prompt formatters
(``FORMATTERS[i](row) -> str``, the signature both libraries accept) and the same payoff, through a thin adapter
for each library's reward-function convention:

- trl_collm (GRPO-style): ``reward(prompts, completions, **columns)``, ``completions`` one tuple of agent answers per
  episode; returns one team reward per episode.
- comlrl: ``reward(completions_agent_1, completions_agent_2, **kwargs)``, one list per agent (the g-th answers of
  all agents form the g-th joint action); returns one team reward per joint action. comlrl dispatches on the
  number of positional parameters (== num_agents: the agents' completion lists).
"""

from __future__ import annotations

PENALTY = [[10, 0, -10], [0, 2, 0], [-10, 0, 10]]
SCALE = 10.0
LETTERS = "ABC"
NUM_AGENTS = 2


def parse_action(text: str) -> int:
    stripped = text.strip()
    if not stripped:
        return 0
    first = stripped[0].upper()
    if first in LETTERS:
        return LETTERS.index(first)
    return ord(stripped[0]) % 3


def payoff(answer_1: str, answer_2: str) -> float:
    return PENALTY[parse_action(answer_1)][parse_action(answer_2)] / SCALE


def prompt(agent_idx: int, row: dict) -> str:
    return (
        f"You are player {agent_idx + 1} of a two-player penalty game. Both players choose at once without "
        f"talking. Answer with one letter: A, B, C. Round {row['round']}."
    )


FORMATTERS = [lambda row, i=i: prompt(i, row) for i in range(NUM_AGENTS)]


def dataset_rows(n: int) -> dict:
    """Columns for ``datasets.Dataset.from_dict``."""
    return {"round": list(range(n))}


class RewardLog:
    """Keeps every team reward in the order the trainer asked for it (the final-reward figure reads its tail)."""

    def __init__(self):
        self.rewards: list[float] = []

    def summary(self, tail_fraction: float = 0.25) -> dict:
        r = self.rewards
        k = max(1, int(round(len(r) * tail_fraction))) if r else 0
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
        return dict(
            reward_episodes=len(r),
            reward_first=mean(r[:k]),
            reward_last=mean(r[-k:]) if k else float("nan"),
            reward_all=mean(r),
            reward_tail_fraction=tail_fraction,
        )


def reward_for_trl_collm(log: RewardLog):
    def penalty_payoff(prompts, completions, **kwargs):
        out = [payoff(a, b) for a, b in completions]
        log.rewards.extend(out)
        return out

    return penalty_payoff


def reward_for_comlrl(log: RewardLog):
    def penalty_payoff(completions_1, completions_2, **kwargs):
        out = [payoff(a, b) for a, b in zip(completions_1, completions_2)]
        log.rewards.extend(out)
        return out

    return penalty_payoff
