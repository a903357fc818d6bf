"""Run a trained team decentralized: no critic, each agent sees only its own observations, agents in parallel.

from trl_collm.inference import load_team, play, saved_settings
team = load_team("outputs/quickstart")          # a folder written by save_model()
episodes = play(team, env, rows, num_turns=1)   # transcripts and rewards, sampled and prompted as in training
settings = saved_settings("outputs/quickstart", greedy=False)  # or: the training's sampling settings, sampled
episodes = play(team, env, rows, num_turns=1, settings=settings)

A loaded team keeps its team.json (`team.description`): `play` prompts it as training did (`PromptSettings`:
agent_context, each agent's prompt limit, its chat template) and, unless `settings` says otherwise, decodes greedily
with the recorded sampling settings.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import torch

from .generation.backends import make_backend
from .generation.prompts import PromptSettings
from .generation.sampler import GenerationBackend, Sampler, SamplingSettings
from .quiet import library_quiet
from .rollout import run_episodes
from .team import saved
from .team.agents import AgentTeam
from .team.saved import TEAM_FILE, read_team_file  # noqa: F401  (the saved-team format lives there)


def load_team(
    folder: str, base_model: str | None = None, device: str | torch.device | None = None, dtype=None
) -> AgentTeam:
    """`team.saved.load_team` (a saved team's agents for decentralized inference) without the library output a user
    cannot act on: transformers' weight-loading bars, PEFT's known FutureWarning (trl_collm/quiet.py;
    TRL_COLLM_VERBOSE=1 shows them)."""
    with library_quiet():
        return saved.load_team(folder, base_model=base_model, device=device, dtype=dtype)


def saved_settings(folder: str, greedy: bool = True, **overrides) -> SamplingSettings:
    """The sampling settings a saved team (a folder written by save_model(), or a Hub repo id) was trained with, as
    `team.json` records them; `greedy` decodes greedily instead of sampling, `overrides` replace recorded fields
    (None keeps the recorded value), e.g. `max_new_tokens=16`."""
    if not os.path.isdir(folder):  # a Hub repo id: load_team fetched (and cached) it already
        from huggingface_hub import snapshot_download

        folder = snapshot_download(folder)
    entry = read_team_file(folder).get("generation") or {}
    return SamplingSettings.from_team_json(entry, greedy=greedy, **overrides)


def saved_prompts(folder: str) -> PromptSettings:
    """What shaped a saved team's prompts (agent_context, prompt limits, chat templates), as `team.json` records it
    (an older team.json without the record: the observation alone, its recorded limits)."""
    if not os.path.isdir(folder):
        from huggingface_hub import snapshot_download

        folder = snapshot_download(folder)
    return PromptSettings.from_team_json(read_team_file(folder))


@torch.no_grad()
def play(
    team: AgentTeam,
    env,
    rows: list[dict],
    num_turns: int = 1,
    settings: SamplingSettings | None = None,
    device=None,
    backend: GenerationBackend | None = None,
    prompts: PromptSettings | None = None,
    batch_size: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[dict]:
    """Episodes run decentralized; returns one transcript per row: per turn each agent's prompt (as text, and as the
    token ids it was given, after its prompt limit), answer and reward.

    `settings`: how to sample (default: a loaded team's recorded settings, greedy; a team built in memory: greedy,
    64 new tokens). `prompts`: what shapes each prompt (default: a loaded team's record; else `PromptSettings()`,
    the observation alone, no limit). `backend`: who samples (default: HF generate()). `batch_size`: rows played
    together (None: all at once); `progress(n)` is called after each batch with the n plays it finished."""
    device = device or next(team.parameters()).device
    recorded = team.description
    if settings is None:
        gen = (recorded or {}).get("generation")
        settings = SamplingSettings.from_team_json(gen, greedy=True) if gen else SamplingSettings(64, greedy=True)
    if prompts is None:
        prompts = PromptSettings.from_team_json(recorded) if recorded is not None else PromptSettings()
    sampler = Sampler(team, backend or make_backend(), settings, device, prompts=prompts)
    step = batch_size or len(rows) or 1
    transcripts = []
    for start in range(0, len(rows), step):
        with _eval_mode(team):
            roll = run_episodes(sampler, env, rows[start : start + step], num_turns)
        transcripts += _transcripts(team, roll, start)
        if progress is not None:
            progress(len(roll.rewards))
    return transcripts


def _transcripts(team: AgentTeam, roll, offset: int) -> list[dict]:
    transcripts = []
    for e in range(roll.rewards.shape[0]):
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
                    "agents": {a: _agent_io(turn[a], k) for a in team.names},
                }
            )
        transcripts.append({"episode": offset + e, "return": roll.rewards[e].sum(0).tolist(), "turns": turns})
    return transcripts


def _agent_io(turn, k: int) -> dict:
    gen = turn.gen
    return {
        "prompt": turn.contexts[k],
        "prompt_ids": gen.query_ids[k][gen.query_mask[k].bool()].tolist(),  # what the model read
        "completion": gen.texts[k],
    }


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
