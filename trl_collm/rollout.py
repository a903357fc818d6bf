"""The one episode runner, shared by every trainer.

For a batch of dataset rows it resets the environment, then for each turn asks every agent for a completion (one
`Sampler` call: one batched backend call per agent, or one for the whole team on a shared base), steps the environment
and stops episodes that are done or whose turn reward clears the early-termination threshold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import algorithms, chat
from .envs import MultiAgentEnv
from .generation.sampler import Generation, Sampler
from .team.agents import Observation


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


def _prompts_for(team, observations, episode_ids, histories, agent_context, t):
    """Each agent's prompt for the given episodes: its observation (a conversation rendered with the agent's chat
    template, trl_collm/chat.py), or (agent_context="history") its own past observations and completions followed by
    the new observation. histories[e] = (observations, completions) per agent."""
    names = team.names
    prompts = {a: [] for a in names}
    contexts = {a: [] for a in names}
    for e in episode_ids:
        for i, a in enumerate(names):
            obs = observations[e][i]
            histories[e][0][i].append(obs)
            if agent_context == "history" and t > 0:
                obs = _history_prompt(team, a, histories[e][0][i], histories[e][1][i])
            else:
                obs = chat.agent_prompt(team.tokenizers[a], obs)
            prompts[a].append(obs)
            contexts[a].append(team.decode_observation(a, obs))
    return prompts, contexts


def _history_prompt(team, agent, observations, completions) -> str:
    """The agent's history h_t = o_0, a_0, ..., o_t as one prompt: its conversation rendered with its template when
    it is a chat, else the texts joined (chat.history_context)."""
    tok = team.tokenizers[agent]

    def decode(ids):
        return team.decode_observation(agent, ids)

    if chat.wants_chat(tok, observations):
        return chat.render(tok, chat.history_messages(observations, completions, decode))
    return chat.history_context([decode(chat.agent_prompt(tok, o)) for o in observations], completions)


def _play_turn(sampler, env, observations, episodes, histories, t, turn_ids):
    """One turn for the given running episodes: prompts -> one batched generation -> env step.

    Returns the turn's AgentTurn per agent (rows indexed by `turn_ids`), the step result, and the ended-turn flags
    (env done or, via the caller, early termination)."""
    names = sampler.team.names
    # what the agent sees is the sampler's to say (PromptSettings), so every runner and entry point agrees
    agent_context = sampler.prompts.agent_context
    prompts, contexts = _prompts_for(sampler.team, observations, episodes, histories, agent_context, t)
    gens = sampler(prompts)
    turn = {a: AgentTurn(a, t, turn_ids, prompts[a], contexts[a], gens[a]) for a in names}
    completions = [[gens[a].texts[k] for a in names] for k in range(len(episodes))]
    for k, e in enumerate(episodes):
        for i in range(len(names)):
            histories[e][1][i].append(completions[k][i])
    step = env.step_batch(completions, episodes, len(names), names)
    check_rewards(env, step, episodes, len(names), t)
    return turn, step


def check_rewards(env: MultiAgentEnv, step, episodes: list[int], num_agents: int, t: int) -> None:
    """The one place every environment's rewards pass, on every runner (batch envs may build their tensor
    themselves): one finite float32 reward per agent for each episode the step was given."""
    rewards = torch.as_tensor(step.rewards).float()
    if tuple(rewards.shape) != (len(episodes), num_agents):
        raise ValueError(
            f"{type(env).__name__}.step_batch returned rewards of shape {tuple(rewards.shape)} for {len(episodes)} "
            f"episodes (turn {t}); expected ({len(episodes)}, {num_agents}): one reward per agent per episode."
        )
    if not bool(torch.isfinite(rewards).all()):
        k = int((~torch.isfinite(rewards)).any(-1).nonzero()[0])
        raise ValueError(
            f"{type(env).__name__}.step_batch returned a reward that is non-finite in float32 for episode "
            f"{episodes[k]} (turn {t}): {rewards[k].tolist()}; rewards must be finite floats that fit float32."
        )


def _ended(step, early_termination_threshold: float | None) -> torch.Tensor:
    done = step.dones.bool().cpu().clone()
    if early_termination_threshold is not None:
        done |= step.rewards.float().mean(-1).cpu() > early_termination_threshold
    return done


def run_episodes(
    sampler: Sampler,
    env: MultiAgentEnv,
    rows: list[dict],
    num_turns: int,
    early_termination_threshold: float | None = None,
) -> Rollout:
    names = sampler.team.names
    n, E = len(names), len(rows)
    observations = env.reset_batch(rows, n, names)  # E lists of n observations (validated by the env layer)
    rewards = torch.zeros(E, num_turns, n)
    turn_mask = torch.zeros(E, num_turns, dtype=torch.bool)
    active = list(range(E))
    histories = {e: ([[] for _ in names], [[] for _ in names]) for e in range(E)}  # texts, for agent_context="history"
    turns: list[dict[str, AgentTurn]] = []
    infos: list[list[dict]] = []
    for t in range(num_turns):
        if not active:
            break
        ids = torch.tensor(active, dtype=torch.long)
        turn, step = _play_turn(sampler, env, observations, active, histories, t, ids)
        turns.append(turn)
        rewards[ids, t] = step.rewards.float().cpu()
        turn_mask[ids, t] = True
        infos.append(list(step.infos))
        done = _ended(step, early_termination_threshold)
        next_active = []
        for k, e in enumerate(active):
            if not bool(done[k]):
                observations[e] = step.observations[k]
                next_active.append(e)
        active = next_active
    return Rollout(list(names), list(rows), turns, rewards, turn_mask, infos)


# ------------------------------------------------------------------------------------------------ Monte-Carlo runners
@dataclass
class SampleTree:
    """A Monte-Carlo rollout: per turn, the nodes created at that turn.

    In aligned / tree mode a node is one joint action (the k-th row of every agent's `AgentTurn`). In cross mode
    (single turn) row k of agent i is agent i's k-th sample and `rewards[0][k, i]` its credit.
    """

    agent_names: list[str]
    rows: list[dict]
    turns: list[dict[str, AgentTurn]]
    rewards: list[torch.Tensor]  # rewards[t]: (N_t, n)
    parents: list[torch.Tensor]  # parents[t]: (N_t,) index of the parent node at turn t-1 (-1 at turn 0)
    groups: list[torch.Tensor]  # groups[t]: (N_t,) siblings share a group id: the baseline's group
    row_index: list[torch.Tensor]  # row_index[t]: (N_t,) dataset row of the node
    credit_mask: list[torch.Tensor] | None = None  # cross mode: (N_t, n) samples that took part in a joint action

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    def returns(self, gamma: float, rewards: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """R_t(node) = r_t(node) + gamma * mean of R_{t+1} over the node's children (its reward alone at a leaf).
        `rewards` replaces the environment's rewards (e.g. after a missing-EOS penalty)."""
        return algorithms.tree_returns(self.rewards if rewards is None else rewards, self.parents, gamma)


def run_tree(
    sampler: Sampler,
    env: MultiAgentEnv,
    rows: list[dict],
    num_turns: int,
    num_generations: int,
    expansion: str,
    early_termination_threshold: float | None = None,
) -> SampleTree:
    """G samples per agent per prompt, joint actions index-aligned; multi-turn by tree expansion (each node samples
    G children: G^T leaves per prompt) or per branch (G independent branches: G*T generations per prompt)."""
    names = sampler.team.names
    n, G = len(names), num_generations
    root_rows = [row for row in rows for _ in range(G)]
    observations = dict(enumerate(env.reset_batch(root_rows, n, names)))
    episodes = list(range(len(root_rows)))
    histories = {e: ([[] for _ in names], [[] for _ in names]) for e in episodes}
    parents = [-1] * len(episodes)
    groups = [k // G for k in range(len(episodes))]
    row_of = list(groups)
    tree = SampleTree(list(names), list(rows), [], [], [], [], [])
    next_group = len(rows)
    for t in range(num_turns):
        if not episodes:
            break
        turn, step = _play_turn(sampler, env, observations, episodes, histories, t, torch.arange(len(episodes)))
        tree.turns.append(turn)
        rewards = step.rewards.float().cpu()
        tree.rewards.append(rewards)
        tree.parents.append(torch.tensor(parents, dtype=torch.long))
        tree.groups.append(torch.tensor(groups, dtype=torch.long))
        tree.row_index.append(torch.tensor(row_of, dtype=torch.long))
        done = _ended(step, early_termination_threshold)
        if t + 1 == num_turns:
            break
        new_episodes, new_parents, new_groups, new_rows = [], [], [], []
        for k, e in enumerate(episodes):
            if bool(done[k]):
                continue
            if expansion == "tree":
                children = [e] + env.fork_batch([e] * (G - 1))
                group = next_group
                next_group += 1
            else:
                children, group = [e], row_of[k]  # one branch continues; siblings are the row's other branches
            for c in children:
                observations[c] = step.observations[k]
                histories[c] = ([list(h) for h in histories[e][0]], [list(h) for h in histories[e][1]])
                new_episodes.append(c), new_parents.append(k), new_groups.append(group), new_rows.append(row_of[k])
        episodes, parents, groups, row_of = new_episodes, new_parents, new_groups, new_rows
    return tree


def run_cross(
    sampler: Sampler,
    env: MultiAgentEnv,
    rows: list[dict],
    num_generations: int,
    max_combinations: int,
    generator: torch.Generator,
) -> SampleTree:
    """Single turn, cross product: every agent samples G completions per prompt; the joint actions are all G^n
    combinations (or `max_combinations` of them drawn without replacement); each agent's sample is credited with the
    mean reward it received over the combinations it took part in."""
    import itertools

    team, names = sampler.team, sampler.team.names
    n, G, E = len(names), num_generations, len(rows)
    observations = env.reset_batch(rows, n, names)
    sample_rows = [e for e in range(E) for _ in range(G)]
    histories = {k: ([[] for _ in names], [[] for _ in names]) for k in range(E * G)}
    obs_per_sample = {k: observations[sample_rows[k]] for k in range(E * G)}
    prompts, contexts = _prompts_for(team, obs_per_sample, range(E * G), histories, "observation", 0)
    gens = sampler(prompts)
    combos = []  # (row, (g_1, ..., g_n))
    total = G**n
    for e in range(E):
        if total <= max_combinations:
            picks = list(itertools.product(range(G), repeat=n))
        else:
            flat = torch.randperm(total, generator=generator)[:max_combinations].tolist()
            picks = [tuple((f // G ** (n - 1 - i)) % G for i in range(n)) for f in flat]
        combos += [(e, p) for p in picks]
    env.reset_batch([rows[e] for e, _ in combos], n, names)
    completions = [[gens[a].texts[e * G + p[i]] for i, a in enumerate(names)] for e, p in combos]
    step = env.step_batch(completions, list(range(len(combos))), n, names)
    check_rewards(env, step, list(range(len(combos))), n, 0)
    sums = torch.zeros(E * G, n)
    counts = torch.zeros(E * G, n)
    for c, (e, p) in enumerate(combos):
        for i in range(n):
            sums[e * G + p[i], i] += step.rewards[c, i]
            counts[e * G + p[i], i] += 1
    ids = torch.arange(E * G)
    turn = {a: AgentTurn(a, 0, ids, prompts[a], contexts[a], gens[a]) for a in names}
    credit = torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums))
    rows_t = torch.tensor(sample_rows, dtype=torch.long)
    return SampleTree(
        list(names), list(rows), [turn], [credit], [torch.full((E * G,), -1)], [rows_t], [rows_t], [counts > 0]
    )
