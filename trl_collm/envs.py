"""Multi-agent environments: the interface between a team rollout and the task.

Two layers:

* the *episode* layer (``reset`` / ``step``), gym-like and written by users for ONE episode;
* the *batch* layer (``reset_batch`` / ``step_batch``), which the rollout calls. The default batch layer clones the
  env once per episode and loops over the episode layer, validating everything the user code returns so that a
  mistake surfaces as a message naming the env, the method, the episode and the fix, instead of as a shape error
  deep inside the trainer.

``RewardFunctionEnv`` turns a GRPO-style single-turn dataset + reward functions into an env. It overrides the batch
layer so every reward function (which may be a reward model) runs once per batch rather than once per episode.
"""

from __future__ import annotations

import copy
import inspect
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import torch

__all__ = [
    "Observation",
    "StepResult",
    "BatchStep",
    "MultiAgentEnv",
    "RewardFunctionEnv",
    "RewardModelFunction",
    "as_float_rewards",
    "check_agent_names",
]

Observation = Union[str, list[int]]

_REWARD_TYPES = ("joint", "per_agent", "auto")

# Column names that would collide with the positional-by-keyword arguments of a reward function
# (``f(prompts=..., completions=..., **columns)``); a column named like this would raise
# "got multiple values for argument". GRPO drops "prompt"/"completion" for the same reason.
_RESERVED_COLUMNS = ("prompt", "completion", "prompts", "completions")


@dataclass
class StepResult:
    """What ``MultiAgentEnv.step`` returns for one episode."""

    reward: float | list[float]
    observations: list[Observation] | None = None
    done: bool = False
    info: dict = field(default_factory=dict)


@dataclass
class BatchStep:
    """What ``step_batch`` returns for the active episodes it was given (same order as ``episode_ids``)."""

    rewards: torch.Tensor  # (E_active, n) float32
    observations: list[list[Observation] | None]
    dones: torch.Tensor  # (E_active,) bool
    infos: list[dict]


# ----------------------------------------------------------------------------------------------------------------
# Helpers for error messages and validation
# ----------------------------------------------------------------------------------------------------------------


def _team_phrase(num_agents: int, agent_names: Sequence[str] | None) -> str:
    """'the team has 2 agents (alice, bob)'; names are only shown when known and consistent with the count."""
    noun = "agent" if num_agents == 1 else "agents"
    if agent_names is not None and len(agent_names) == num_agents:
        return f"the team has {num_agents} {noun} ({', '.join(str(a) for a in agent_names)})"
    return f"the team has {num_agents} {noun}"


def _agent_label(index: int, agent_names: Sequence[str] | None) -> str:
    if agent_names is not None and index < len(agent_names):
        return f"agent {index} ({agent_names[index]})"
    return f"agent {index}"


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} (type {type(value).__name__})"


def _is_token_id(x: Any) -> bool:
    # bool is an Integral subclass but a list of bools is certainly not a prompt.
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _validate_observation(obs: Any, where: str, episode: int, agent: int, agent_names) -> Observation:
    """Return the observation (tuples of ids normalised to a list) or raise a ValueError naming the culprit."""
    if isinstance(obs, str):
        return obs
    if isinstance(obs, (list, tuple)) and all(_is_token_id(t) for t in obs):
        return [int(t) for t in obs]
    hint = ""
    if isinstance(obs, (list, tuple)) and obs and isinstance(obs[0], Mapping):
        hint = (
            " It looks like a chat (list of messages); render it to text first, e.g. with "
            "tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) in a formatter."
        )
    raise ValueError(
        f"{where} returned an invalid observation for episode {episode}, {_agent_label(agent, agent_names)}: "
        f"{_describe(obs)}. An observation must be a str (the prompt text) or a list[int] (prompt token ids).{hint}"
    )


def _validate_observations(obs_list: Any, where: str, episode: int, num_agents: int, agent_names) -> list:
    if isinstance(obs_list, str) or not isinstance(obs_list, (list, tuple)):
        raise ValueError(
            f"{where} returned {_describe(obs_list)} for episode {episode}; expected a list with one observation "
            f"per agent ({_team_phrase(num_agents, agent_names)}). Return a list of {num_agents} observations."
        )
    if len(obs_list) != num_agents:
        raise ValueError(
            f"{where} returned {len(obs_list)} observations for episode {episode}; "
            f"{_team_phrase(num_agents, agent_names)}. Return one observation per agent."
        )
    return [_validate_observation(o, where, episode, i, agent_names) for i, o in enumerate(obs_list)]


def _validate_done(done: Any, where: str, episode: int) -> bool:
    # Strings are rejected on purpose: bool("False") is True, a silent trap.
    if isinstance(done, (str, bytes)) or done is None:
        raise ValueError(
            f"{where} returned done={_describe(done)} for episode {episode}; done must be a bool "
            f"(True when the episode is over)."
        )
    if isinstance(done, torch.Tensor):
        if done.numel() != 1:
            raise ValueError(
                f"{where} returned a done tensor with {done.numel()} elements for episode {episode}; "
                f"done must be a single bool for the episode."
            )
        return bool(done.item())
    try:
        return bool(done)
    except Exception as err:  # e.g. a numpy array with several elements
        raise ValueError(
            f"{where} returned done={_describe(done)} for episode {episode}, which cannot be read as a bool "
            f"({err}); done must be a single bool for the episode."
        ) from None


def _to_number(x: Any) -> float | None:
    """float(x) for real numbers (python, numpy, 0-d/1-element tensors); None when x is not a number."""
    if isinstance(x, torch.Tensor):
        return float(x.item()) if x.numel() == 1 else None
    if isinstance(x, numbers.Real):  # includes bool (a pass/fail reward), numpy scalars
        return float(x)
    return None


def _reward_row(
    value: Any,
    num_agents: int,
    source: str,
    reward_type: str,
    episode: int,
    agent_names: Sequence[str] | None,
) -> list[float]:
    """One episode's reward entry -> n floats (joint scalars broadcast), with explicit errors."""
    scalar = _to_number(value)
    if scalar is not None:
        row = [scalar] * num_agents
    elif isinstance(value, (list, tuple)) or (isinstance(value, torch.Tensor) and value.dim() == 1):
        if reward_type == "joint":
            raise ValueError(
                f"{source} returned a list of rewards for episode {episode} but reward_type='joint'; "
                f"return one float per episode, or set reward_type='per_agent' (or 'auto') for per-agent rewards."
            )
        items = value.tolist() if isinstance(value, torch.Tensor) else list(value)
        if len(items) != num_agents:
            raise ValueError(
                f"{source} returned {len(items)} rewards for episode {episode} but "
                f"{_team_phrase(num_agents, agent_names)}; return a float or a list of {num_agents} floats."
            )
        row = []
        for i, item in enumerate(items):
            number = _to_number(item)
            if number is None:
                raise ValueError(
                    f"{source} returned a non-numeric reward {_describe(item)} for episode {episode}, "
                    f"{_agent_label(i, agent_names)}; rewards must be floats."
                )
            row.append(number)
    elif value is None:
        raise ValueError(
            f"{source} returned None for episode {episode}; every episode needs a reward "
            f"(a float, or a list of {num_agents} floats). Return 0.0 if the task does not apply."
        )
    else:
        raise ValueError(
            f"{source} returned a non-numeric reward {_describe(value)} for episode {episode}; "
            f"return a float or a list of {num_agents} floats."
        )
    for i, r in enumerate(row):
        if not math.isfinite(r):
            raise ValueError(
                f"{source} returned a non-finite reward {r} for episode {episode}, {_agent_label(i, agent_names)}; "
                f"rewards must be finite floats (check for division by zero or log(0))."
            )
    return row


def _check_reward_type(reward_type: str, source: str) -> None:
    if reward_type not in _REWARD_TYPES:
        raise ValueError(f"{source}: reward_type must be one of {_REWARD_TYPES}, got {reward_type!r}.")


def as_float_rewards(
    values: Any,
    num_agents: int,
    source: str,
    reward_type: str = "auto",
    *,
    num_episodes: int | None = None,
    agent_names: Sequence[str] | None = None,
) -> torch.Tensor:
    """Turn E reward entries (float = joint, list of n floats = per agent) into an (E, n) float32 tensor.

    ``num_episodes`` (optional) is the E the caller expects; ``agent_names`` (optional) only improves messages.
    """
    _check_reward_type(reward_type, source)
    if isinstance(values, torch.Tensor):
        values = values.tolist() if values.dim() > 0 else [values.item()]
    elif hasattr(values, "tolist") and not isinstance(values, (list, tuple)):  # numpy arrays
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ValueError(
            f"{source} returned {_describe(values)}; expected a list with one reward per episode "
            f"(a float, or a list of {num_agents} floats)."
        )
    if num_episodes is not None and len(values) != num_episodes:
        raise ValueError(
            f"{source} returned {len(values)} rewards but the batch has {num_episodes} episodes; "
            f"return one entry per episode (a float, or a list of {num_agents} floats)."
        )
    rows = [_reward_row(v, num_agents, source, reward_type, e, agent_names) for e, v in enumerate(values)]
    if not rows:
        return torch.zeros(0, num_agents, dtype=torch.float32)
    return torch.tensor(rows, dtype=torch.float32)


def check_agent_names(env: Any, names: Sequence[str]) -> None:
    """Raise if ``env.agent_names`` is set and differs from the team's names (order matters: observation i goes
    to agent i)."""
    declared = getattr(env, "agent_names", None)
    if declared is None:
        return
    declared, names = list(declared), list(names)
    if declared == names:
        return
    cls = type(env).__name__
    if sorted(map(str, declared)) == sorted(map(str, names)):
        problem = "the same names in a different order (observation i is given to agent i, so order matters)"
    else:
        missing = [n for n in names if n not in declared]
        extra = [n for n in declared if n not in names]
        problem = f"team agents missing from the env: {missing}; env names not in the team: {extra}"
    raise ValueError(
        f"{cls}.agent_names is {declared} but the team's agents are {names}: {problem}. "
        f"Construct the team and the env with the same agent names in the same order, "
        f"or set the env's agent_names=None."
    )


# ----------------------------------------------------------------------------------------------------------------
# Base environment
# ----------------------------------------------------------------------------------------------------------------


class MultiAgentEnv:
    """Base class. Subclass and implement ``reset``/``step`` for ONE episode (gym-like).

    The rollout calls ``reset_batch`` once per batch, which clones ``self`` once per row, so per-episode state can
    simply live on ``self`` in ``reset``/``step``. Override ``clone`` if the env holds something that must not be
    deep-copied (a model, a connection); override ``reset_batch``/``step_batch`` to batch expensive work.
    """

    agent_names: list[str] | None = None
    max_turns: int | None = None
    reward_type: str = "auto"

    # -- episode layer -------------------------------------------------------------------------------------------

    def reset(self, row: dict) -> list[Observation]:
        raise NotImplementedError(f"{type(self).__name__} must implement reset(row) -> list of observations")

    def step(self, completions: list[str]) -> StepResult:
        raise NotImplementedError(f"{type(self).__name__} must implement step(completions) -> StepResult")

    def clone(self) -> MultiAgentEnv:
        return copy.deepcopy(self)

    # -- batch layer ---------------------------------------------------------------------------------------------

    def _names_for(self, num_agents: int, agent_names: Sequence[str] | None) -> list[str] | None:
        names = agent_names if agent_names is not None else self.agent_names
        return list(names) if names is not None and len(names) == num_agents else None

    def reset_batch(
        self, rows: list[dict], num_agents: int, agent_names: Sequence[str] | None = None
    ) -> list[list[Observation]]:
        """Start one episode per row; returns the validated observations, one list of n per episode."""
        names = self._names_for(num_agents, agent_names)
        where = f"{type(self).__name__}.reset"
        # Detach the previous batch's clones first: deep-copying self with them attached would copy every old
        # episode into every new one (quadratic memory growth across batches).
        self.__dict__.pop("_episodes", None)
        self.__dict__.pop("_episode_done", None)
        episodes, observations = [], []
        for e, row in enumerate(rows):
            env = self.clone()
            observations.append(_validate_observations(env.reset(row), where, e, num_agents, names))
            episodes.append(env)
        self._episodes = episodes
        self._episode_done = [False] * len(episodes)
        return observations

    def fork_batch(self, episode_ids: Sequence[int]) -> list[int]:
        """Branch running episodes: each new episode is a clone of one given episode in its current state.

        Used by tree expansion (Monte-Carlo trainer): a node's children continue from the same state. Returns the new
        episode ids, in the order of `episode_ids`.
        """
        if getattr(self, "_episodes", None) is None:
            raise RuntimeError(f"{type(self).__name__}.fork_batch was called before reset_batch.")
        new_ids = []
        for e in episode_ids:
            if self._episode_done[e]:
                raise ValueError(f"{type(self).__name__}.fork_batch got episode {e}, which is done; only running episodes branch.")
            self._episodes.append(self._episodes[e].clone())
            self._episode_done.append(False)
            new_ids.append(len(self._episodes) - 1)
        return new_ids

    def _check_step_args(self, completions, episode_ids, num_agents) -> None:
        cls = type(self).__name__
        if getattr(self, "_episodes", None) is None:
            raise RuntimeError(f"{cls}.step_batch was called before reset_batch; call reset_batch(rows, n) first.")
        if len(completions) != len(episode_ids):
            raise ValueError(
                f"{cls}.step_batch got {len(completions)} completion lists for {len(episode_ids)} episode ids; "
                f"pass one list of {num_agents} completions per episode id."
            )
        if len(set(episode_ids)) != len(episode_ids):
            raise ValueError(
                f"{cls}.step_batch got duplicate episode ids {list(episode_ids)}; each episode steps once per turn."
            )
        for k, (e, texts) in enumerate(zip(episode_ids, completions)):
            if not (0 <= e < len(self._episodes)):
                raise ValueError(
                    f"{cls}.step_batch got episode id {e}, but the last reset_batch started "
                    f"{len(self._episodes)} episodes (ids 0..{len(self._episodes) - 1})."
                )
            if self._episode_done[e]:
                raise ValueError(
                    f"{cls}.step_batch got episode {e}, which is already done; only step active episodes."
                )
            if isinstance(texts, str) or len(texts) != num_agents:
                got = "a single str" if isinstance(texts, str) else f"{len(texts)} completions"
                raise ValueError(
                    f"{cls}.step_batch got {got} for episode {e}; expected one completion per agent "
                    f"({num_agents})."
                )

    def step_batch(
        self,
        completions: list[list[str]],
        episode_ids: list[int],
        num_agents: int,
        agent_names: Sequence[str] | None = None,
    ) -> BatchStep:
        """Advance the given episodes (indices into the last ``reset_batch`` rows) by one turn."""
        self._check_step_args(completions, episode_ids, num_agents)
        names = self._names_for(num_agents, agent_names)
        cls = type(self).__name__
        where = f"{cls}.step"
        _check_reward_type(self.reward_type, cls)
        reward_rows, observations, dones, infos = [], [], [], []
        for e, texts in zip(episode_ids, completions):
            result = self._episodes[e].step(list(texts))
            if not isinstance(result, StepResult):
                raise ValueError(
                    f"{where} returned {_describe(result)} for episode {e}; return a "
                    f"StepResult(reward=..., observations=..., done=..., info=...)."
                )
            reward_rows.append(_reward_row(result.reward, num_agents, where, self.reward_type, e, names))
            done = _validate_done(result.done, where, e)
            if result.observations is None:
                if not done:
                    raise ValueError(
                        f"{where} returned observations=None for episode {e} while done=False; return the next "
                        f"observations (one per agent) or set done=True to end the episode."
                    )
                obs = None
            else:
                obs = _validate_observations(result.observations, where, e, num_agents, names)
            info = result.info if result.info is not None else {}
            if not isinstance(info, dict):
                raise ValueError(f"{where} returned info={_describe(info)} for episode {e}; info must be a dict.")
            self._episode_done[e] = done
            observations.append(obs)
            dones.append(done)
            infos.append(info)
        rewards = (
            torch.tensor(reward_rows, dtype=torch.float32)
            if reward_rows
            else torch.zeros(0, num_agents, dtype=torch.float32)
        )
        dones_t = torch.tensor(dones, dtype=torch.bool)
        return BatchStep(rewards=rewards, observations=observations, dones=dones_t, infos=infos)


# ----------------------------------------------------------------------------------------------------------------
# Single-turn dataset + reward functions
# ----------------------------------------------------------------------------------------------------------------


def _func_name(f: Any) -> str:
    name = getattr(f, "__name__", None)
    if name is None and hasattr(f, "func"):  # functools.partial
        name = getattr(f.func, "__name__", None)
    return name if isinstance(name, str) else type(f).__name__


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


# ----------------------------------------------------------------------------------------------------------------
# Reward model as a reward function
# ----------------------------------------------------------------------------------------------------------------


class RewardModelFunction:
    """Wraps a TRL-PPO-style reward model (``AutoModelForSequenceClassification``, ``num_labels=1``).

    Each agent's prompt + completion is scored separately as ``logits[:, 0]``; the model's own head pools the last
    non-pad token, so we pad with the model's ``config.pad_token_id`` (the id it pools on) on the tokenizer's
    padding side.
    """

    __name__ = "reward_model"

    def __init__(self, model, tokenizer, batch_size: int = 64, max_length: int | None = None):
        if batch_size < 1:
            raise ValueError(f"RewardModelFunction: batch_size must be >= 1, got {batch_size}.")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = int(batch_size)
        self.max_length = max_length
        config = getattr(model, "config", None)
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        pad = getattr(text_config, "pad_token_id", None)
        if pad is None:
            pad = getattr(tokenizer, "pad_token_id", None)
            if pad is not None and self.batch_size > 1:
                raise ValueError(
                    f"RewardModelFunction: the reward model's config.pad_token_id is None, so it cannot find the "
                    f"last token of a padded batch; set model.config.pad_token_id = tokenizer.pad_token_id "
                    f"({pad}) or use batch_size=1."
                )
        if pad is None and self.batch_size > 1:
            raise ValueError(
                "RewardModelFunction: neither the reward model's config nor the tokenizer defines a pad token id; "
                "set tokenizer.pad_token (e.g. to the eos token) and model.config.pad_token_id, or use batch_size=1."
            )
        self.pad_token_id = pad if pad is not None else 0
        try:
            self._accepts_position_ids = "position_ids" in inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            self._accepts_position_ids = False

    def _text(self, prompt: Observation) -> str:
        if isinstance(prompt, str):
            return prompt
        ids = prompt.tolist() if hasattr(prompt, "tolist") else list(prompt)
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _encode(self, texts: list[str]) -> list[list[int]]:
        enc = self.tokenizer(texts)
        ids = enc["input_ids"] if isinstance(enc, Mapping) or hasattr(enc, "keys") else enc
        ids = [x.tolist() if hasattr(x, "tolist") else list(x) for x in ids]
        if self.max_length is not None:
            # Respect the tokenizer's truncation side (default right) so the same text is cut the same way
            # as when it was used elsewhere.
            side = getattr(self.tokenizer, "truncation_side", "right")
            ids = [x[-self.max_length :] if side == "left" else x[: self.max_length] for x in ids]
        return ids

    def _device(self) -> torch.device:
        try:
            return next(self.model.parameters()).device
        except (StopIteration, AttributeError):
            return torch.device("cpu")

    @torch.no_grad()
    def score_ids(self, sequences: list[list[int]]) -> list[float]:
        """Score token-id sequences (one float each) in length-sorted batches of ``batch_size``."""
        device = self._device()
        side = getattr(self.tokenizer, "padding_side", "right")
        # Sorting by length keeps the padding (wasted compute) per batch small; results are scattered back.
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        scores = [0.0] * len(sequences)
        was_training = getattr(self.model, "training", False)
        if was_training:
            self.model.eval()  # dropout would make the reward noisy
        try:
            for start in range(0, len(order), self.batch_size):
                idx = order[start : start + self.batch_size]
                batch = [sequences[i] for i in idx]
                width = max(1, max(len(s) for s in batch))
                input_ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
                attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
                for r, seq in enumerate(batch):
                    if not seq:
                        continue
                    sl = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
                    input_ids[r, sl] = torch.tensor(seq, dtype=torch.long)
                    attention_mask[r, sl] = 1
                kwargs = {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device)}
                if self._accepts_position_ids:
                    # Positions count real tokens only, so left padding does not shift them.
                    kwargs["position_ids"] = (attention_mask.cumsum(-1) - 1).clamp(min=0).to(device)
                logits = self.model(**kwargs).logits
                values = logits[:, 0].float().cpu().tolist()
                for i, v in zip(idx, values):
                    scores[i] = float(v)
        finally:
            if was_training:
                self.model.train()
        return scores

    def __call__(self, prompts, completions, **kwargs) -> list[float | list[float]]:
        if len(prompts) != len(completions):
            raise ValueError(
                f"reward function 'reward_model' got {len(prompts)} prompt lists for {len(completions)} "
                f"completion lists; pass one of each per episode."
            )
        texts, shape = [], []
        for e, (ps, cs) in enumerate(zip(prompts, completions)):
            if len(ps) != len(cs):
                raise ValueError(
                    f"reward function 'reward_model' got {len(ps)} prompts but {len(cs)} completions for "
                    f"episode {e}; pass one prompt and one completion per agent."
                )
            texts.extend(self._text(p) + c for p, c in zip(ps, cs))
            shape.append(len(cs))
        flat = self.score_ids(self._encode(texts)) if texts else []
        out, pos = [], 0
        for n in shape:
            chunk = flat[pos : pos + n]
            pos += n
            out.append(chunk[0] if n == 1 else chunk)
        return out
