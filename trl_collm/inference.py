"""Run a trained team decentralized: no critic, each agent sees only its own observations, agents in parallel.

from trl_collm.inference import load_team, play
team = load_team("outputs/quickstart")          # a folder written by save_model()
episodes = play(team, env, rows, num_turns=1)   # transcripts and rewards
"""

from __future__ import annotations

import contextlib

import torch

from .rollout import run_episodes
from .saved_team import TEAM_FILE, load_team, read_team_file  # noqa: F401  (the saved-team format lives there)
from .team import AgentTeam


@torch.no_grad()
def play(
    team: AgentTeam,
    env,
    rows: list[dict],
    num_turns: int = 1,
    max_new_tokens: int = 64,
    greedy: bool = True,
    temperature: float = 0.7,
    device=None,
) -> list[dict]:
    """Episodes run decentralized; returns one transcript per row: per turn each agent's prompt, answer, reward."""
    device = device or next(team.parameters()).device
    tok = team.tokenizers[team.names[0]]
    gen_kwargs = dict(max_new_tokens=max_new_tokens, do_sample=not greedy, pad_token_id=tok.pad_token_id)
    if not greedy:
        gen_kwargs["temperature"] = temperature
    with _eval_mode(team):
        roll = run_episodes(team, env, rows, num_turns, device, gen_kwargs)
    transcripts = []
    for e in range(len(rows)):
        turns = []
        for t, turn in enumerate(roll.turns):
            ids = turn[team.names[0]].episode_ids.tolist()
            if e not in ids:
                continue
            k = ids.index(e)
            turns.append(
                {
                    "turn": t,
                    "reward": roll.rewards[e, t].tolist(),
                    "agents": {
                        a: {"prompt": turn[a].contexts[k], "completion": turn[a].gen.texts[k]} for a in team.names
                    },
                }
            )
        transcripts.append({"episode": e, "return": roll.rewards[e].sum(0).tolist(), "turns": turns})
    return transcripts


@contextlib.contextmanager
def _eval_mode(team: AgentTeam):
    """Every module in eval mode for the episodes (no dropout; PEFT refuses per-row adapters in training mode, which a
    trainer's team is in after train()), each put back in its own mode afterwards."""
    modes = [(m, m.training) for m in team.modules()]
    team.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training
