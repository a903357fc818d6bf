"""``RewardFunctionEnv``: a GRPO-style single-turn dataset + per-agent prompt formatters + reward functions, as an env.

It overrides the batch layer so every reward function (which may be a reward model) runs once per batch rather than
once per episode. `build_env` turns a trainer's `env` / `reward_funcs` / `reward_model` arguments into the run's env.
"""

from __future__ import annotations

import copy
import functools
import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .protocol import (
    BatchStep,
    MultiAgentEnv,
    Observation,
    StepResult,
    _check_reward_type,
    _describe,
    _team_phrase,
    _validate_observation,
    as_float_rewards,
    check_agent_names,
)
from .reward_model import RewardModelFunction

# Column names that would collide with the positional-by-keyword arguments of a reward function
# (``f(prompts=..., completions=..., **columns)``); a column named like this would raise
# "got multiple values for argument". GRPO drops "prompt"/"completion" for the same reason.
_RESERVED_COLUMNS = ("prompt", "completion", "prompts", "completions")


def _func_name(f: Any) -> str:
    name = getattr(f, "__name__", None)
    if name is None and hasattr(f, "func"):  # functools.partial
        name = getattr(f.func, "__name__", None)
    return name if isinstance(name, str) else type(f).__name__


# ---------------------------------------------------------------------------------------------------------------
# TRL / GRPO reward functions: one completion per sample. Here a sample is an episode and its completions are the
# agents' texts, so such a function must be wrapped (per_agent) or it would score lists as if they were strings.
# ---------------------------------------------------------------------------------------------------------------


def per_agent(func: Callable, conversational: bool | None = None) -> Callable:
    """Use a TRL / GRPO reward function as it is (`f(prompts, completions, **columns) -> list[float]`, one
    completion per sample) as a per-agent reward: it scores every agent's text on its own, and each agent gets its
    own reward. Dataset columns are repeated for every agent. `conversational` (default: read from the function's
    `completions` annotation, e.g. TRL's `list[list[dict[str, str]]]`) hands each text as
    `[{"role": "assistant", "content": text}]` and each prompt as a user message, as TRL's conversational rewards
    expect.

        env = RewardFunctionEnv([per_agent(trl.rewards.accuracy_reward)], formatters=[...])
    """
    conv = _annotation_kind(func) == "conversational" if conversational is None else conversational

    def as_message(text, role: str):
        return [{"role": role, "content": text}] if conv and isinstance(text, str) else text

    @functools.wraps(func)
    def scored_per_agent(prompts, completions, **columns):
        n = len(completions[0]) if completions else 0
        flat_completions = [as_message(c, "assistant") for joint in completions for c in joint]
        flat_prompts = [as_message(p, "user") for joint in prompts for p in joint]
        repeated = {k: [v for v in values for _ in range(n)] for k, values in columns.items()}
        out = list(func(prompts=flat_prompts, completions=flat_completions, **repeated))
        if len(out) != len(flat_completions):
            raise ValueError(
                f"per_agent({_func_name(func)}) returned {len(out)} rewards for {len(flat_completions)} texts "
                f"({len(completions)} episodes x {n} agents); return one reward per completion."
            )
        return [out[e * n : (e + 1) * n] for e in range(len(completions))]

    scored_per_agent.scores_per_agent = True
    return scored_per_agent


def _annotation_kind(func: Callable) -> str | None:
    """'single' or 'conversational' when `completions` is annotated as TRL's one-completion-per-sample shape
    (`list[str]`, `list[list[dict[str, str]]]`), else None (unknown, e.g. our joint `list[list[str]]`)."""
    try:
        param = inspect.signature(func).parameters.get("completions")
    except (TypeError, ValueError):
        return None
    if param is None or param.annotation is param.empty:
        return None
    text = param.annotation if isinstance(param.annotation, str) else repr(param.annotation)
    text = text.replace(" ", "").replace("typing.", "").replace("List", "list").replace("Dict", "dict")
    if text in ("list[str]", "Sequence[str]"):
        return "single"
    if text.startswith("list[list[dict"):
        return "conversational"
    return None


def _check_joint_signature(f: Callable, index: int, agent_names) -> None:
    """Refuse, in one line showing the team shape, a reward function written for one completion per sample."""
    if getattr(f, "scores_per_agent", False):
        return
    kind = _annotation_kind(f)
    from_trl = (getattr(f, "__module__", "") or "").startswith("trl.")
    if kind is None and not from_trl:
        return
    name = _func_name(f)
    team = f" {list(agent_names)}" if agent_names else ""
    raise ValueError(
        f"RewardFunctionEnv: reward_funcs[{index}] '{name}' is a TRL/GRPO reward function (one completion per "
        f"sample), but here completions[e] is episode e's list of agent texts{team} (one per agent, in team "
        f"order); wrap it as per_agent({name}) to score each agent's text on its own, or write "
        "f(prompts, completions, **columns) over each episode's list of texts."
    )


def _measures_list_length(out, completions: list[list[str]]) -> bool:
    """True when a joint reward returned len(completions[e]) (the number of agents) for every episode while the
    episodes' texts differ in length: what a TRL-style reward written for one completion per sample, say
    `[len(c) for c in completions]`, returns here without an error (its annotation, when it has one, is refused at
    construction; an unannotated one can only be told by this effect). Needs 2 episodes or more."""
    try:
        values = [float(v) for v in out]
    except (TypeError, ValueError):
        return False
    if len(values) < 2 or len(values) != len(completions):
        return False
    if any(v != len(c) for v, c in zip(values, completions)):
        return False
    return len({sum(len(t) for t in c if isinstance(t, str)) for c in completions}) > 1


def _default_observation(row: dict) -> Observation:
    if "prompt" in row:
        return row["prompt"]
    if "input_ids" in row:
        ids = row["input_ids"]
        return ids.tolist() if hasattr(ids, "tolist") else ids
    raise ValueError(
        f"RewardFunctionEnv: the dataset row has no 'prompt' or 'input_ids' column (its keys are {sorted(row)}); "
        f"add one of these columns or pass formatters=... that build each agent's prompt from the row."
    )


class RewardFunctionEnv(MultiAgentEnv):
    """Single-turn task = a dataset + per-agent prompt formatters + GRPO-style reward functions."""

    def __init__(
        self,
        reward_funcs: Callable | Sequence[Callable],
        formatters: None | Callable | Sequence[Callable] | Mapping[str, Callable] = None,
        reward_weights: Sequence[float] | None = None,
        agent_names: Sequence[str] | None = None,
        reward_type: str = "auto",
    ):
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if not funcs:
            raise ValueError("RewardFunctionEnv: reward_funcs is empty; pass at least one reward function.")
        for i, f in enumerate(funcs):
            if not callable(f):
                raise ValueError(
                    f"RewardFunctionEnv: reward_funcs[{i}] is {_describe(f)}, not callable; pass functions "
                    f"f(prompts, completions, **columns) -> list of rewards."
                )
        for i, f in enumerate(funcs):
            _check_joint_signature(f, i, agent_names)
        self.reward_funcs = funcs

        if reward_weights is None:
            weights = [1.0] * len(funcs)
        else:
            weights = reward_weights.tolist() if hasattr(reward_weights, "tolist") else list(reward_weights)
            if len(weights) != len(funcs):
                raise ValueError(
                    f"RewardFunctionEnv: reward_weights has {len(weights)} entries but there are {len(funcs)} "
                    f"reward functions; pass one weight per reward function."
                )
        self.reward_weights = [float(w) for w in weights]

        # Unique names: they key the logs (rewards/<name>) and last_reward_components.
        names, seen = [], {}
        for f in funcs:
            base = _func_name(f)
            seen[base] = seen.get(base, 0) + 1
            names.append(base if seen[base] == 1 else f"{base}_{seen[base] - 1}")
        self.reward_func_names = names

        _check_reward_type(reward_type, "RewardFunctionEnv")
        self.reward_type = reward_type

        if isinstance(formatters, Mapping):
            keys = list(formatters)
            if agent_names is None:
                # A dict of formatters declares the team's names; the trainer checks them with check_agent_names.
                agent_names = keys
            elif sorted(map(str, keys)) != sorted(map(str, agent_names)):
                raise ValueError(
                    f"RewardFunctionEnv: formatters has keys {keys} but agent_names is {list(agent_names)}; "
                    f"give exactly one formatter per agent name."
                )
            for k, f in formatters.items():
                if not callable(f):
                    raise ValueError(f"RewardFunctionEnv: formatters[{k!r}] is {_describe(f)}, not callable.")
            formatters = dict(formatters)
        elif isinstance(formatters, (list, tuple)):
            for i, f in enumerate(formatters):
                if not callable(f):
                    raise ValueError(f"RewardFunctionEnv: formatters[{i}] is {_describe(f)}, not callable.")
            formatters = list(formatters)
            if agent_names is not None and len(agent_names) != len(formatters):
                raise ValueError(
                    f"RewardFunctionEnv: {len(formatters)} formatters for {len(agent_names)} agent names; "
                    f"give one formatter per agent."
                )
        elif formatters is not None and not callable(formatters):
            raise ValueError(
                f"RewardFunctionEnv: formatters is {_describe(formatters)}; pass None, a callable, a list of "
                f"callables (one per agent) or a dict agent_name -> callable."
            )
        self.formatters = formatters
        self.agent_names = list(agent_names) if agent_names is not None else None
        self.max_turns = 1
        self.last_reward_components: dict[str, torch.Tensor] = {}
        self._shape_checked: set[str] = set()  # reward functions whose first batch was checked (_measures_list_length)
        self._rows: list[dict] | None = None
        self._observations: list[list[Observation]] | None = None

    def clone(self) -> RewardFunctionEnv:
        # Reward functions may hold a reward model; a shallow copy shares it instead of duplicating its weights.
        env = copy.copy(self)
        env.last_reward_components = {}
        return env

    # -- observations ----------------------------------------------------------------------------------------

    def _per_agent_formatters(self, num_agents: int, names: list[str] | None) -> list[Callable]:
        f = self.formatters
        if f is None:
            return [_default_observation] * num_agents
        if isinstance(f, dict):
            order = names if names is not None else self.agent_names
            if order is None or len(order) != num_agents:
                raise ValueError(
                    f"RewardFunctionEnv: formatters is a dict with keys {list(f)}, which does not match "
                    f"a team of {num_agents} agents{'' if names is None else f' ({names})'}; give one "
                    f"formatter per agent name."
                )
            missing = [a for a in order if a not in f]
            if missing:
                raise ValueError(
                    f"RewardFunctionEnv: formatters has no entry for agents {missing} "
                    f"(keys are {list(f)}); give one formatter per agent name."
                )
            return [f[a] for a in order]
        if isinstance(f, list):
            if len(f) != num_agents:
                raise ValueError(
                    f"RewardFunctionEnv: got {len(f)} formatters but {_team_phrase(num_agents, names)}; "
                    f"pass one formatter per agent (or a single callable used for every agent)."
                )
            return f
        return [f] * num_agents

    def _observe(self, rows: list[dict], num_agents: int, names: list[str] | None) -> list[list[Observation]]:
        fmts = self._per_agent_formatters(num_agents, names)
        where = "RewardFunctionEnv.reset"
        return [
            [_validate_observation(fmt(row), where, e, i, names) for i, fmt in enumerate(fmts)]
            for e, row in enumerate(rows)
        ]

    def reset_batch(
        self, rows: list[dict], num_agents: int, agent_names: Sequence[str] | None = None
    ) -> list[list[Observation]]:
        names = self._names_for(num_agents, agent_names)
        rows = [dict(r) for r in rows]
        self._observations = self._observe(rows, num_agents, names)
        self._rows = rows
        self._episodes = [None] * len(rows)  # placeholders so the shared argument checks apply
        self._episode_done = [False] * len(rows)
        return [list(o) for o in self._observations]

    # -- rewards ---------------------------------------------------------------------------------------------

    def _compute_rewards(
        self, prompts: list, completions: list[list[str]], rows: list[dict], num_agents: int, names
    ) -> torch.Tensor:
        keys: list[str] = []
        for row in rows:
            keys.extend(k for k in row if k not in keys and k not in _RESERVED_COLUMNS)
        columns = {k: [row.get(k) for row in rows] for k in keys}
        total = torch.zeros(len(rows), num_agents, dtype=torch.float32)
        components = {}
        for f, name, w in zip(self.reward_funcs, self.reward_func_names, self.reward_weights):
            out = f(prompts=prompts, completions=completions, **columns)
            if name not in self._shape_checked and not getattr(f, "scores_per_agent", False):
                self._shape_checked.add(name)  # the first batch only: the hot path stays one call per function
                if _measures_list_length(out, completions):
                    warnings.warn(
                        f"RewardFunctionEnv: reward function '{name}' returned the number of agents "
                        f"({len(completions[0])}) for every episode although the texts' lengths differ: a TRL-style "
                        f"reward measuring len() of episode e's list of agent texts? Wrap it as per_agent({name}) "
                        "to score each agent's text on its own.",
                        UserWarning,
                        stacklevel=2,
                    )
            values = as_float_rewards(
                out,
                num_agents,
                f"reward function '{name}'",
                self.reward_type,
                num_episodes=len(rows),
                agent_names=names,
            )
            components[name] = values
            total += w * values
            if not bool(torch.isfinite(total).all()):
                e = int((~torch.isfinite(total)).any(-1).nonzero()[0])
                raise ValueError(
                    f"reward_weights: weight {w:g} times reward function '{name}' overflows float32 for episode {e} "
                    f"(reward {float(values[e].abs().max()):g}); use smaller reward_weights or rewards."
                )
        self.last_reward_components = components
        return total

    def step_batch(
        self,
        completions: list[list[str]],
        episode_ids: list[int],
        num_agents: int,
        agent_names: Sequence[str] | None = None,
    ) -> BatchStep:
        self._check_step_args(completions, episode_ids, num_agents)
        names = self._names_for(num_agents, agent_names)
        rows = [self._rows[e] for e in episode_ids]
        prompts = [list(self._observations[e]) for e in episode_ids]
        completions = [list(c) for c in completions]
        rewards = self._compute_rewards(prompts, completions, rows, num_agents, names)
        for e in episode_ids:  # single-turn: every step ends its episode
            self._episode_done[e] = True
        k = len(episode_ids)
        return BatchStep(
            rewards=rewards,
            observations=[None] * k,
            dones=torch.ones(k, dtype=torch.bool),
            infos=[{} for _ in range(k)],
        )

    # -- episode layer (for using the env directly, outside the batched rollout) -------------------------------

    def reset(self, row: dict) -> list[Observation]:
        f = self.formatters
        if isinstance(f, (list, dict)):
            n = len(f)
        elif self.agent_names is not None:
            n = len(self.agent_names)
        else:
            raise ValueError(
                "RewardFunctionEnv.reset cannot tell the team size (formatters is None or a single callable and "
                "agent_names is None); use reset_batch(rows, num_agents) or pass agent_names=..."
            )
        return self.reset_batch([row], n)[0]

    def step(self, completions: list[str]) -> StepResult:
        if self._rows is None or len(self._rows) != 1:
            raise RuntimeError("RewardFunctionEnv.step follows reset(row); for batches use reset_batch/step_batch.")
        batch = self.step_batch([list(completions)], [0], len(completions))
        return StepResult(reward=batch.rewards[0].tolist(), observations=None, done=True, info={})


def build_env(env, reward_funcs, reward_model, prompt_formatters, args, team) -> MultiAgentEnv:
    """The run's environment: the user's `env` as it is, or a `RewardFunctionEnv` over `reward_funcs` (and a TRL-PPO
    `reward_model` as one more function) for a single-turn team; refuses a mix of both, or neither."""
    names = team.names
    if env is not None:
        if reward_funcs is not None or reward_model is not None:
            raise ValueError("Pass either `env` (which computes rewards) or `reward_funcs`/`reward_model`, not both.")
        if not isinstance(env, MultiAgentEnv):
            raise TypeError(f"`env` must be a trl_collm.MultiAgentEnv, got {type(env).__name__}.")
        if getattr(env, "agent_names", None):
            check_agent_names(env, names)
        return env
    funcs = (
        []
        if reward_funcs is None
        else (list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs])
    )
    if reward_model is not None:
        # A TRL-PPO reward model scores each agent's prompt + completion with the first agent's tokenizer.
        funcs.append(
            RewardModelFunction(
                reward_model, team.tokenizers[names[0]], batch_size=args.local_rollout_forward_batch_size
            )
        )
    if not funcs:
        raise ValueError("No reward: pass `reward_funcs` (GRPO-style functions), `reward_model`, or an `env`.")
    if args.num_turns > 1:
        raise ValueError(
            f"`num_turns`={args.num_turns} needs an `env` that produces the next observations; reward functions "
            "are single-turn."
        )
    weights = args.reward_weights
    if weights is not None and len(weights) != len(funcs):
        raise ValueError(
            f"`reward_weights` has {len(weights)} entries for {len(funcs)} reward functions; give one weight per "
            "function."
        )
    return RewardFunctionEnv(
        funcs, formatters=prompt_formatters, reward_weights=weights, agent_names=names, reward_type=args.reward_type
    )
