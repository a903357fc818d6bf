"""The one episode runner, shared by every trainer.

For a batch of dataset rows it resets the environment, then for each turn asks every agent for a completion (one
batched generate call per agent, or one call for the whole team on a shared base), steps the environment and stops
episodes that are done or whose turn reward clears the early-termination threshold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .envs import MultiAgentEnv
from .team import AgentTeam, Generation, Observation
from .views import history_context


@dataclass
class AgentTurn:
    """One agent's actions at one turn over the episodes still running at that turn."""

    agent: str
    turn: int
    episode_ids: torch.Tensor  # (B,) indices into the batch of episodes
    prompts: list[Observation]  # what the agent was prompted with
    contexts: list[str]  # the same, as text (what critics may read)
    gen: Generation


@dataclass
class Rollout:
    """E episodes of up to T turns by n agents."""

    agent_names: list[str]
    rows: list[dict]
    turns: list[dict[str, AgentTurn]]  # turns[t][agent]
    rewards: torch.Tensor  # (E, T, n) environment rewards
    turn_mask: torch.Tensor  # (E, T) bool: the turn was played
    infos: list[list[dict]] = field(default_factory=list)  # infos[t][k] for the k-th active episode of turn t

    @property
    def num_episodes(self) -> int:
        return len(self.rows)

    @property
    def num_turns(self) -> int:
        return self.turn_mask.shape[1]

    def completions(self, turn: int) -> list[list[str]]:
        """completions[k][i]: agent i's text in the k-th episode played at `turn`."""
        per_agent = [self.turns[turn][a].gen.texts for a in self.agent_names]
        return [list(x) for x in zip(*per_agent)]


def run_episodes(
    team: AgentTeam,
    env: MultiAgentEnv,
    rows: list[dict],
    num_turns: int,
    device,
    gen_kwargs: dict,
    agent_context: str = "observation",
    early_termination_threshold: float | None = None,
    stop_token_id: int | None = None,
    generation_batch_size: int | None = None,
    unwrap=None,
) -> Rollout:
    names = team.names
    n, E = len(names), len(rows)
    observations = env.reset_batch(rows, n)  # E lists of n observations (validated by the env layer)
    rewards = torch.zeros(E, num_turns, n)
    turn_mask = torch.zeros(E, num_turns, dtype=torch.bool)
    active = list(range(E))
    past_obs = [[[] for _ in names] for _ in range(E)]  # texts, for agent_context="history"
    past_act = [[[] for _ in names] for _ in range(E)]
    turns: list[dict[str, AgentTurn]] = []
    infos: list[list[dict]] = []
    for t in range(num_turns):
        if not active:
            break
        prompts: dict[str, list[Observation]] = {a: [] for a in names}
        contexts: dict[str, list[str]] = {a: [] for a in names}
        for e in active:
            for i, a in enumerate(names):
                obs = observations[e][i]
                text = team.decode_observation(a, obs)
                past_obs[e][i].append(text)
                if agent_context == "history" and t > 0:
                    text = history_context(past_obs[e][i], past_act[e][i])
                    obs = text
                prompts[a].append(obs)
                contexts[a].append(text)
        gens = team.generate(prompts, device, gen_kwargs, stop_token_id, generation_batch_size, unwrap)
        ids = torch.tensor(active, dtype=torch.long)
        turns.append({a: AgentTurn(a, t, ids, prompts[a], contexts[a], gens[a]) for a in names})
        completions = [[gens[a].texts[k] for a in names] for k in range(len(active))]
        for k, e in enumerate(active):
            for i in range(n):
                past_act[e][i].append(completions[k][i])
        step = env.step_batch(completions, active, n)
        rewards[ids, t] = step.rewards.float().cpu()
        turn_mask[ids, t] = True
        infos.append(list(step.infos))
        done = step.dones.bool().cpu().clone()
        if early_termination_threshold is not None:
            done |= step.rewards.float().mean(-1).cpu() > early_termination_threshold
        next_active = []
        for k, e in enumerate(active):
            if not bool(done[k]):
                observations[e] = step.observations[k]
                next_active.append(e)
        active = next_active
    return Rollout(list(names), list(rows), turns, rewards, turn_mask, infos)
