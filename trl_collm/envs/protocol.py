"""The environment protocol: what a task gives a team rollout.

Two layers:

* the *episode* layer (``reset`` / ``step``), gym-like and written by users for ONE episode;
* the *batch* layer (``reset_batch`` / ``step_batch``), which the rollout calls. The default batch layer clones the
  env once per episode and loops over the episode layer, validating everything the user code returns so that a
  mistake surfaces as a message naming the env, the method, the episode and the fix, instead of as a shape error
  deep inside the trainer.
"""

from __future__ import annotations

import copy
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..chat import ChatPrompt, check_conversation
from ..numerics import FLOAT32_MAX, fits_float32

Observation = str | list[int] | list[dict]  # a list of dicts: a conversation

_REWARD_TYPES = ("joint", "per_agent", "auto")


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


class EnvError(ValueError):
    """What an environment's `reset` / `step` (or a reward function) returned breaks the protocol; the message names
    the class and the method (`where`). A ValueError, so existing handlers keep working; the CLI says it in one line
    (the env is the user's code: its traceback adds nothing)."""


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


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Text as a tokenizer can take it: each lone surrogate (bytes decoded with errors='surrogateescape', a string
    cut inside a pair, the exception message of generated code that printed one) becomes U+FFFD. A surrogate cannot
    be encoded as UTF-8, and tokenizers raise a TypeError on it. A ``ChatPrompt`` stays one, both of its forms
    cleaned (its chat form is what an agent with a chat template is prompted with)."""
    if isinstance(text, ChatPrompt):
        messages, before = clean_messages(text.messages), str(text)
        plain = _clean_str(before)
        if plain is before and all(a is b for a, b in zip(messages, text.messages)):
            return text
        return ChatPrompt(plain, messages)
    return _clean_str(text)


def _clean_str(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub("\ufffd", text)
    return text


def clean_messages(messages: Sequence[Mapping]) -> list[dict]:
    """A conversation with each message's content cleaned as `clean_text` cleans text (a message already clean is
    returned as the same object)."""
    out = []
    for m in messages:
        content = _clean_str(m["content"])
        out.append(m if content is m["content"] and isinstance(m, dict) else {**m, "content": content})
    return out


def _validate_observation(obs: Any, where: str, episode: int, agent: int, agent_names) -> Observation:
    """Return the observation (text made safe for tokenizers, tuples of ids normalised to a list) or raise a
    ValueError naming the culprit. Every prompt an env hands the team passes here: the one place text from outside
    (datasets, env feedback, generated code's error messages) is cleaned."""
    if isinstance(obs, (str, list, tuple)) and len(obs) == 0:
        raise EnvError(
            f"{where} returned an empty prompt for episode {episode}, {_agent_label(agent, agent_names)}; give every "
            "agent some prompt text (a model continues from at least one token)."
        )
    if isinstance(obs, str):
        return clean_text(obs)
    if isinstance(obs, (list, tuple)) and all(_is_token_id(t) for t in obs):
        return [int(t) for t in obs]
    if isinstance(obs, (list, tuple)) and obs and all(isinstance(m, Mapping) for m in obs):
        # A conversation: each agent renders it with its own chat template (trl_collm/chat.py).
        check_conversation(obs, f"{where}'s observation for episode {episode}, {_agent_label(agent, agent_names)}")
        return [dict(m) for m in clean_messages(obs)]
    raise EnvError(
        f"{where} returned an invalid observation for episode {episode}, {_agent_label(agent, agent_names)}: "
        f"{_describe(obs)}. An observation must be a str (the prompt text), a list[int] (prompt token ids) or a "
        f"list of {{'role', 'content'}} messages (a conversation)."
    )


def validate_observations(obs_list: Any, where: str, episode: int, num_agents: int, agent_names) -> list:
    """One observation per agent, each checked (`where` names the env call in errors); the CLI checks a task's
    first prompts with it before any model loads."""
    if isinstance(obs_list, str) or not isinstance(obs_list, (list, tuple)):
        raise EnvError(
            f"{where} returned {_describe(obs_list)} for episode {episode}; expected a list with one observation "
            f"per agent ({_team_phrase(num_agents, agent_names)}). Return a list of {num_agents} observations."
        )
    if len(obs_list) != num_agents:
        raise EnvError(
            f"{where} returned {len(obs_list)} observations for episode {episode}; "
            f"{_team_phrase(num_agents, agent_names)}. Return one observation per agent."
        )
    return [_validate_observation(o, where, episode, i, agent_names) for i, o in enumerate(obs_list)]


def _validate_done(done: Any, where: str, episode: int) -> bool:
    # Strings are rejected on purpose: bool("False") is True, a silent trap.
    if isinstance(done, (str, bytes)) or done is None:
        raise EnvError(
            f"{where} returned done={_describe(done)} for episode {episode}; done must be a bool "
            f"(True when the episode is over)."
        )
    if isinstance(done, torch.Tensor):
        if done.numel() != 1:
            raise EnvError(
                f"{where} returned a done tensor with {done.numel()} elements for episode {episode}; "
                f"done must be a single bool for the episode."
            )
        return bool(done.item())
    try:
        return bool(done)
    except Exception as err:  # e.g. a numpy array with several elements
        raise EnvError(
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
            raise EnvError(
                f"{source} returned a list of rewards for episode {episode} but reward_type='joint'; "
                f"return one float per episode, or set reward_type='per_agent' (or 'auto') for per-agent rewards."
            )
        items = value.tolist() if isinstance(value, torch.Tensor) else list(value)
        if len(items) != num_agents:
            raise EnvError(
                f"{source} returned {len(items)} rewards for episode {episode} but "
                f"{_team_phrase(num_agents, agent_names)}; return a float or a list of {num_agents} floats."
            )
        row = []
        for i, item in enumerate(items):
            number = _to_number(item)
            if number is None:
                raise EnvError(
                    f"{source} returned a non-numeric reward {_describe(item)} for episode {episode}, "
                    f"{_agent_label(i, agent_names)}; rewards must be floats."
                )
            row.append(number)
    elif value is None:
        raise EnvError(
            f"{source} returned None for episode {episode}; every episode needs a reward "
            f"(a float, or a list of {num_agents} floats). Return 0.0 if the task does not apply."
        )
    else:
        raise EnvError(
            f"{source} returned a non-numeric reward {_describe(value)} for episode {episode}; "
            f"return a float or a list of {num_agents} floats."
        )
    for i, r in enumerate(row):
        if not math.isfinite(r):
            raise EnvError(
                f"{source} returned a non-finite reward {r} for episode {episode}, {_agent_label(i, agent_names)}; "
                f"rewards must be finite floats (check for division by zero or log(0))."
            )
        if not fits_float32(r):  # finite as a Python float, but rewards are used as float32
            raise EnvError(
                f"{source} returned a reward {r:g} for episode {episode}, {_agent_label(i, agent_names)}, that "
                f"overflows float32 (|r| > {FLOAT32_MAX:.3g}, the dtype rewards are used in); scale the reward down."
            )
    return row


def _check_reward_type(reward_type: str, source: str) -> None:
    if reward_type not in _REWARD_TYPES:
        raise EnvError(f"{source}: reward_type must be one of {_REWARD_TYPES}, got {reward_type!r}.")


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
        raise EnvError(
            f"{source} returned {_describe(values)}; expected a list with one reward per episode "
            f"(a float, or a list of {num_agents} floats)."
        )
    if num_episodes is not None and len(values) != num_episodes:
        raise EnvError(
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
            observations.append(validate_observations(env.reset(row), where, e, num_agents, names))
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
                raise ValueError(
                    f"{type(self).__name__}.fork_batch got episode {e}, which is done; only running episodes branch."
                )
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
        for e, texts in zip(episode_ids, completions):
            if not (0 <= e < len(self._episodes)):
                raise ValueError(
                    f"{cls}.step_batch got episode id {e}, but the last reset_batch started "
                    f"{len(self._episodes)} episodes (ids 0..{len(self._episodes) - 1})."
                )
            if self._episode_done[e]:
                raise ValueError(f"{cls}.step_batch got episode {e}, which is already done; only step active episodes.")
            if isinstance(texts, str) or len(texts) != num_agents:
                got = "a single str" if isinstance(texts, str) else f"{len(texts)} completions"
                raise ValueError(
                    f"{cls}.step_batch got {got} for episode {e}; expected one completion per agent ({num_agents})."
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
                raise EnvError(
                    f"{where} returned {_describe(result)} for episode {e}; return a "
                    f"StepResult(reward=..., observations=..., done=..., info=...)."
                )
            reward_rows.append(_reward_row(result.reward, num_agents, where, self.reward_type, e, names))
            done = _validate_done(result.done, where, e)
            if result.observations is None:
                if not done:
                    raise EnvError(
                        f"{where} returned observations=None for episode {e} while done=False; return the next "
                        f"observations (one per agent) or set done=True to end the episode."
                    )
                obs = None
            else:
                obs = validate_observations(result.observations, where, e, num_agents, names)
            info = result.info if result.info is not None else {}
            if not isinstance(info, dict):
                raise EnvError(f"{where} returned info={_describe(info)} for episode {e}; info must be a dict.")
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
