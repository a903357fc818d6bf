"""Cooperative text games with a known optimum: the sanity check that CC, DC and MC really learn, and the quickstart.

Every agent answers a prompt; its answer is read as an action: the first option letter of the answer ("A", "B",
...) when it starts with one, else the code of its first non-space character modulo the number of options. A real
LLM follows the instruction and answers with a letter; a tiny random-init model still produces a valid action with
every answer, so the games are learnable on CPU in minutes.

Games (team reward, joint):
- `coord-climbing` (2 agents, 1 turn): the climbing game of the MARL literature (Claus & Boutilier 1998). Payoffs
  A/A 11, A/B -30, B/A -30, B/B 7, B/C 6, C/* 0 except C/C 5, scaled by 1/11: the optimum (A, A) sits next to the
  worst penalties, so independent learners tend to settle on the safe (C, C) or (B, B).
- `coord-penalty` (2 agents, 1 turn): the penalty game (k = -10): A/A and C/C pay 10, A/C and C/A pay k, B/B 2,
  the rest 0; two optima to agree on.
- `coord-numbers` (2-4 agents, 1 turn): each agent picks a digit 0-9; the team scores 1 when the digits sum to the
  row's target, else 1 - |sum - target| / 10 (floored at 0).
- `coord-repeated` (2 agents, `turns` turns, default 4): the climbing game repeated; from turn 2 on each agent is
  told what both played last turn. `sparse=True` (default) pays the mean payoff only at the last turn: the sparse,
  long-horizon variant used to compare critics.
"""

from __future__ import annotations

import random

from ..chat import task_prompt
from ..envs import MultiAgentEnv, RewardFunctionEnv, StepResult
from . import TaskSpec, register_task

LETTERS = "ABCDEFGHIJ"

CLIMBING = [[11, -30, 0], [-30, 7, 6], [0, 0, 5]]
PENALTY = [[10, 0, -10], [0, 2, 0], [-10, 0, 10]]


def parse_action(text: str, num_options: int) -> int:
    """The option an answer picks: a leading option letter, else its first character's code modulo num_options."""
    stripped = text.strip()
    if not stripped:
        return 0
    first = stripped[0].upper()
    if first in LETTERS[:num_options]:
        return LETTERS.index(first)
    if num_options == 10 and first.isdigit():
        return int(first)
    return ord(stripped[0]) % num_options


def _matrix_prompt(agent: int, game: str, num_options: int) -> str:
    options = ", ".join(LETTERS[:num_options])
    return (
        f"You are player {agent + 1} of a two-player {game} game. Both players choose at once without talking. "
        f"Answer with one letter: {options}."
    )


def matrix_reward(matrix, scale: float):
    def reward(prompts, completions, **kwargs):
        k = len(matrix)
        return [matrix[parse_action(a, k)][parse_action(b, k)] / scale for a, b in completions]

    reward.__name__ = "payoff"
    return reward


def numbers_reward(prompts, completions, target, **kwargs):
    scores = []
    for texts, goal in zip(completions, target):
        total = sum(parse_action(t, 10) for t in texts)
        scores.append(1.0 if total == goal else max(0.0, 1.0 - abs(total - goal) / 10.0))
    return scores


class RepeatedMatrixEnv(MultiAgentEnv):
    """A matrix game played `turns` times; each agent then sees last turn's joint action."""

    agent_names = None

    def __init__(self, matrix=CLIMBING, turns: int = 4, sparse: bool = True, scale: float = 11.0):
        self.matrix, self.turns, self.sparse, self.scale = matrix, turns, sparse, scale

    def reset(self, row):
        self.t, self.total, self.round = 0, 0.0, row.get("round", 0)
        k = len(self.matrix)
        return [
            task_prompt(_matrix_prompt(i, "repeated coordination", k), f"Round {self.round}, turn 1 of {self.turns}.")
            for i in range(2)
        ]

    def step(self, completions):
        k = len(self.matrix)
        acts = [parse_action(c, k) for c in completions]
        payoff = self.matrix[acts[0]][acts[1]] / self.scale
        self.t += 1
        self.total += payoff
        done = self.t >= self.turns
        reward = (self.total / self.turns if done else 0.0) if self.sparse else payoff / self.turns
        played = f"Last turn: player 1 chose {LETTERS[acts[0]]}, player 2 chose {LETTERS[acts[1]]}."
        obs = (
            None
            if done
            else [
                task_prompt(
                    _matrix_prompt(i, "repeated coordination", k), f"Turn {self.t + 1} of {self.turns}. {played}"
                )
                for i in range(2)
            ]
        )
        return StepResult(reward=reward, observations=obs, done=done, info={"actions": acts, "payoff": payoff})


def _no_source(task: str, source) -> None:
    """The games generate their rows: a dataset source would be ignored, so it is refused."""
    if source is not None:
        raise ValueError(
            f"task {task!r} generates its rows and has no dataset source (--dataset_source / source=); drop it"
        )


def _rounds(split: str, limit: int | None, seed: int):
    from datasets import Dataset

    n = limit or (256 if split == "train" else 32)
    offset = 0 if split == "train" else 10_000
    return Dataset.from_dict({"round": list(range(offset, offset + n))})


def _matrix_task(name: str, matrix, game: str, description: str):
    k, scale = len(matrix), float(max(max(r) for r in matrix))

    def make_env(**options):
        formatters = [
            lambda row, i=i: task_prompt(_matrix_prompt(i, game, k), f"Round {row['round']}.") for i in range(2)
        ]
        return RewardFunctionEnv([matrix_reward(matrix, scale)], formatters=formatters, agent_names=None)

    def load_dataset(split: str = "train", source: str | None = None, limit: int | None = None):
        _no_source(name, source)
        return _rounds(split, limit, 0)

    return register_task(
        TaskSpec(name, description, ["player_1", "player_2"], 1, make_env, load_dataset, max_reward=1.0)
    )


_matrix_task("coord-climbing", CLIMBING, "climbing", "Climbing matrix game (2 agents, 1 turn); optimum A/A = 1.0.")
_matrix_task(
    "coord-penalty", PENALTY, "penalty", "Penalty matrix game, k=-10 (2 agents, 1 turn); optima A/A and C/C = 1.0."
)


def _numbers_make_env(num_agents: int = 2, **options):
    def formatter(i):
        return lambda row: task_prompt(
            f"You are agent {i + 1} of {num_agents}.",
            f"Together your digits must add up to {row['target']}. Answer with one digit.",
        )

    return RewardFunctionEnv([numbers_reward], formatters=[formatter(i) for i in range(num_agents)])


def _numbers_dataset(split: str = "train", source: str | None = None, limit: int | None = None, num_agents: int = 2):
    _no_source("coord-numbers", source)
    from datasets import Dataset

    rng = random.Random(0 if split == "train" else 1)
    n = limit or (256 if split == "train" else 32)
    return Dataset.from_dict({"target": [rng.randint(0, 9 * num_agents) for _ in range(n)]})


register_task(
    TaskSpec(
        "coord-numbers",
        "Pick digits that add up to a target (2-4 agents, 1 turn); optimum 1.0.",
        ["agent_1", "agent_2"],
        1,
        _numbers_make_env,
        _numbers_dataset,
        max_reward=1.0,
        options={"num_agents": "2 to 4 agents (dataset targets follow)"},
    )
)


def _repeated_make_env(turns: int = 4, sparse: bool = True, **options):
    return RepeatedMatrixEnv(CLIMBING, turns=turns, sparse=sparse)


def _repeated_dataset(split: str = "train", source: str | None = None, limit: int | None = None):
    _no_source("coord-repeated", source)
    return _rounds(split, limit, 0)


register_task(
    TaskSpec(
        "coord-repeated",
        "Climbing game repeated over turns (2 agents, default 4 turns, sparse reward); optimum 1.0.",
        ["player_1", "player_2"],
        4,
        _repeated_make_env,
        _repeated_dataset,
        max_reward=1.0,
        options={"turns": "number of turns (default 4)", "sparse": "pay only at the last turn (default True)"},
    )
)
