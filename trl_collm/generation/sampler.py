"""The sampling seam: what the team is sampled with (`SamplingSettings`), who samples (a `GenerationBackend`), and the
one object the runners call (`Sampler`).

- `SamplingSettings` is the record `team.json` stores under "generation" and `load_team` / `trl-collm eval` / `play`
  read back, so a saved team is sampled as it was trained (GRPO's `generation_kwargs` in it are parsed and checked
  by `generation_kwargs.py` beside it).
- `GenerationBackend` is the declared contract every backend implements (`backends.py` beside it: HF `generate()`,
  transformers' continuous batching; a vLLM engine plugs in the same way). Backends register under a name
  (`register_backend`) and `backends.make_backend(args)` builds the one the arguments ask for (it lives beside the
  built-ins it registers, so this module never imports its implementations).
- `Sampler` binds a team, a backend and the settings; the trainer builds it once and hands it to the runners
  (trl_collm/rollout.py).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import json
from collections.abc import Callable
from typing import ClassVar, NamedTuple

import torch

from .. import chat
from ..team.agents import AgentTeam, Observation
from ..team.modeling import left_pad, unpad_rows
from ..team.prompt_cache import PromptCache
from .generation_kwargs import kwargs_change_logits, parse_generation_kwargs
from .prompts import PromptSettings


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """How completions are sampled. `top_k` None (or 0), `top_p` 1.0 and `min_p` 0 switch those filters off;
    `repetition_penalty` 1.0 leaves the logits alone; `generation_kwargs`: further keyword arguments for HF
    `generate()` (GenerationConfig's names) or vLLM's `SamplingParams` (GRPO's field: the backend's own names, none of
    the settings above); `stop_token_ids` empty means each agent's tokenizer eos token ends its completion; `greedy`
    decodes greedily (temperature, top-p, top-k and min-p are then unused; the repetition penalty still applies)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    greedy: bool = False
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    generation_kwargs: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.top_k == 0:  # TRL's spelling of "off"; one spelling here so equal settings compare equal
            object.__setattr__(self, "top_k", None)
        if self.min_p is None:  # GRPOConfig's default
            object.__setattr__(self, "min_p", 0.0)
        object.__setattr__(self, "stop_token_ids", tuple(int(i) for i in self.stop_token_ids))
        object.__setattr__(self, "generation_kwargs", parse_generation_kwargs(self.generation_kwargs))
        _check_settings(self)

    def __hash__(self):
        return hash(json.dumps(dataclasses.asdict(self), sort_keys=True, default=repr))

    @classmethod
    def from_config(cls, args, greedy: bool = False) -> SamplingSettings:
        """The settings of a trainer config (`response_length`, `temperature`, `top_p`, `top_k`, `stop_token_id`,
        and where the config has them GRPO's `min_p`, `repetition_penalty`, `generation_kwargs`)."""
        stop = getattr(args, "stop_token_id", None)
        return cls(
            max_new_tokens=args.response_length,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            stop_token_ids=() if stop is None else (stop,),
            greedy=greedy,
            min_p=getattr(args, "min_p", 0.0),
            repetition_penalty=getattr(args, "repetition_penalty", 1.0),
            generation_kwargs=getattr(args, "generation_kwargs", None),
        )

    def changes_logits(self) -> bool:
        """Whether generate() samples from logits other than the model's before the warpers (a repetition penalty,
        a generation_kwargs entry that penalises, forces or suppresses tokens, or one not known to be a warper): the
        log-probs recorded while sampling are then not the policy's (generation/backends.py)."""
        return self.repetition_penalty != 1.0 or kwargs_change_logits(self.generation_kwargs)

    def samples_the_policy(self) -> bool:
        """Whether the tokens are drawn from the policy's own distribution: softmax(logits / temperature) over the
        whole vocabulary, no filter (top-p, top-k, min-p or a generation_kwargs entry) and no penalty."""
        return not (self.greedy or self.top_p < 1.0 or self.top_k or self.min_p or self.generation_kwargs) and not (
            self.changes_logits()
        )

    def generate_kwargs(self, pad_id: int) -> dict:
        """Keyword arguments for HF `generate()` (`pad_id`: what finished rows are fed back with)."""
        kwargs = dict(max_new_tokens=self.max_new_tokens, do_sample=not self.greedy, pad_token_id=pad_id)
        if not self.greedy:  # sampling settings make generate() warn under greedy decoding
            kwargs.update(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k or 0)
            if self.min_p:
                kwargs["min_p"] = self.min_p
        if self.repetition_penalty != 1.0:  # a logits processor: greedy decoding too
            kwargs["repetition_penalty"] = self.repetition_penalty
        if self.stop_token_ids:
            stops = self.stop_token_ids
            kwargs["eos_token_id"] = stops[0] if len(stops) == 1 else list(stops)
        kwargs.update(self.generation_kwargs)
        return kwargs

    # ------------------------------------------------------------------ team.json
    def to_team_json(self) -> dict:
        """The "generation" entry of team.json (its key names predate this record; `greedy` is not stored: training
        samples, and eval / play choose greedy or sampled decoding themselves). GRPO's settings are written only
        when set, so a team trained without them has the same file as before."""
        stops = list(self.stop_token_ids)
        entry = {
            "response_length": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "stop_token_id": stops[0] if len(stops) == 1 else (stops or None),
        }
        if self.min_p:
            entry["min_p"] = self.min_p
        if self.repetition_penalty != 1.0:
            entry["repetition_penalty"] = self.repetition_penalty
        if self.generation_kwargs:
            entry["generation_kwargs"] = dict(self.generation_kwargs)
        return entry

    @classmethod
    def from_team_json(cls, entry: dict, greedy: bool = False, **overrides) -> SamplingSettings:
        """The settings a team.json "generation" entry records (missing keys: the defaults; `overrides`: fields to
        replace, e.g. from the command line, None meaning "keep the recorded value")."""
        stop = entry.get("stop_token_id")
        recorded = dict(
            max_new_tokens=entry.get("response_length") or 64,
            temperature=entry.get("temperature", 1.0),
            top_p=entry.get("top_p", 1.0),
            top_k=entry.get("top_k"),
            stop_token_ids=() if stop is None else tuple(stop) if isinstance(stop, list) else (stop,),
            min_p=entry.get("min_p", 0.0),
            repetition_penalty=entry.get("repetition_penalty", 1.0),
            generation_kwargs=entry.get("generation_kwargs"),
        )
        recorded.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**recorded, greedy=greedy)


def _check_settings(s: SamplingSettings) -> None:
    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if not isinstance(s.max_new_tokens, int) or isinstance(s.max_new_tokens, bool) or s.max_new_tokens < 1:
        raise ValueError(f"SamplingSettings.max_new_tokens must be an integer >= 1, got {s.max_new_tokens!r}.")
    if not s.greedy and not s.temperature > 0:
        raise ValueError(f"SamplingSettings.temperature must be > 0 when sampling, got {s.temperature!r}.")
    if not 0 < s.top_p <= 1:
        raise ValueError(f"SamplingSettings.top_p must be in (0, 1], got {s.top_p!r}.")
    if s.top_k is not None and (not isinstance(s.top_k, int) or s.top_k < 0):
        raise ValueError(f"SamplingSettings.top_k must be None, 0 (off) or a positive integer, got {s.top_k!r}.")
    if not number(s.min_p) or not 0 <= s.min_p <= 1:
        raise ValueError(f"SamplingSettings.min_p must be in [0, 1] (0: off), got {s.min_p!r}.")
    if not number(s.repetition_penalty) or not 0 < s.repetition_penalty < float("inf"):
        raise ValueError(
            f"SamplingSettings.repetition_penalty must be a number > 0 (1.0: off; > 1 discourages repeats), "
            f"got {s.repetition_penalty!r}."
        )


class Sampled(NamedTuple):
    """What a backend returns for B prompts."""

    tokens: torch.Tensor  # (B, L) the new tokens only, right-padded with the call's pad id
    logprobs: torch.Tensor | None  # (B, L) the sampler's log-probs of those tokens, or None (see `records_logprobs`)
    # (B, L) an engine's own log-probs of those tokens at the sampling temperature (vLLM), for the importance-sampling
    # correction between its numerics and the trainer's; None for backends that sample with the trainer's forward
    engine_logprobs: torch.Tensor | None = None
    # adapter name (None: a plain model) -> the prefill of that adapter's rows, in their order in the request, with
    # gradients (`GenerationRequest.keep_prompt_graph`); None when not asked or not possible
    prompt_caches: dict | None = None


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    """One backend call (verl's shape: one request in, `Sampled` out): B left-padded prompts and how to answer them.

    `ids`, `mask`: (B, Lq). `pad_id`: what finished rows are fed back with and the tokens are right-padded with.
    `adapter_names`: for a LoRA team, the adapter of each row (`model` is then the shared PeftModel), with
    `use_adapter(name)` a context manager yielding the model with that adapter active (for backends that run one
    adapter at a time); None for a plain model. `logprob_temperature`: also return the sampled tokens' log-probs
    under log softmax(logits / temperature) (honoured only when the backend `records_logprobs`). `lockstep`:
    generate()'s `synced_gpus` (ZeRO-3 decoding in step with the other ranks; None: not distributed); a backend that
    cannot decode in lockstep raises when it is True. `keep_prompt_graph`: run each adapter's prompt prefill with
    gradients and return it (`Sampled.prompt_caches`; honoured only when the backend `keeps_prompt_graph`).
    """

    model: torch.nn.Module
    ids: torch.Tensor
    mask: torch.Tensor
    settings: SamplingSettings
    pad_id: int
    adapter_names: list[str] | None = None
    use_adapter: Callable | None = None
    logprob_temperature: float | None = None
    lockstep: bool | None = None
    keep_prompt_graph: bool = False

    def prompts(self) -> list[list[int]]:
        """The prompts without their padding, one token list per row (for engines that take token lists)."""
        return [row[m.bool()].tolist() for row, m in zip(self.ids, self.mask)]


@dataclasses.dataclass(frozen=True)
class BackendOptions:
    """What the built-in backends are configured with, typed: the trainer configs' fields of the same names (TRL's),
    which a command-line namespace for eval / play may carry too. `from_args` is the one place that reads them.
    The defaults here are the configs' defaults too (`TeamConfig` reads them from this class)."""

    local_rollout_forward_batch_size: int | None = 64  # generate(): rows per call (None: all at once)
    share_prompt_prefix: bool = True  # generate(): the shared-prefix prefill
    use_transformers_continuous_batching: bool = False
    transformers_continuous_batching_config: dict | None = None  # a dict, or its JSON from the command line
    use_vllm: bool = False
    vllm_mode: str = "colocate"
    vllm_gpu_memory_utilization: float = 0.3
    vllm_max_model_length: int | None = None
    vllm_enable_sleep_mode: bool = False
    vllm_model_impl: str = "vllm"
    vllm_importance_sampling_clip_min: float | None = None
    vllm_importance_sampling_clip_max: float | None = 3.0  # None: no upper bound

    def __post_init__(self):
        config = self.transformers_continuous_batching_config
        if isinstance(config, str):  # from the command line
            import json

            object.__setattr__(self, "transformers_continuous_batching_config", json.loads(config))

    @classmethod
    def from_args(cls, args=None) -> BackendOptions:
        """The options a trainer config or a command-line namespace carries (None: the defaults; a field it lacks:
        its default)."""
        if args is None or isinstance(args, BackendOptions):
            return args or cls()
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)})


class GenerationBackend(abc.ABC):
    """How a batch of left-padded prompts becomes sampled tokens: the contract every backend implements.

    A backend is built once per run (`from_config`), called with one `GenerationRequest` for every batch of prompts
    (`generate`, returning `Sampled`), told after every optimizer step that the weights moved (`weights_changed`)
    and closed at the end (`close`). The `Sampler` turns its tokens into `Generation`s (stop-token masks, decoded
    texts), so every backend ends completions the same way.
    """

    name: ClassVar[str] = ""  # the registry key (`register_backend`)
    # Whether `generate` can return the sampler's log-probs (`logprob_temperature`); when not, the caller computes them
    # with a forward of its own (PPO's scoring forward).
    records_logprobs: ClassVar[bool] = False
    # Whether `generate` can run the prompt prefill with gradients and return it (`keep_prompt_graph`).
    keeps_prompt_graph: ClassVar[bool] = False

    @classmethod
    def from_config(cls, options: BackendOptions) -> GenerationBackend:
        """The backend for the run's options (`BackendOptions.from_args(config or namespace)`)."""
        return cls()

    @staticmethod
    def refuse_lockstep(lockstep: bool | None, flag: str) -> None:
        """For a backend that decodes each rank on its own: ZeRO-3 without a whole-model gather asks every rank to
        decode in lockstep (generate()'s synced_gpus), which it cannot; `flag` is the config field that chose it."""
        if lockstep:
            raise ValueError(
                f"{flag} cannot decode in lockstep with other ranks (ZeRO-3 with `ds3_gather_for_generation=False`); "
                f"set `ds3_gather_for_generation=True` (the default) or {flag}=False."
            )

    @abc.abstractmethod
    def generate(self, request: GenerationRequest) -> Sampled:
        """Sample one completion per row of the request's left-padded prompts from `request.model`."""

    def weights_changed(self) -> None:
        """The model's weights were updated (called once the trainer's `global_step` has moved, before the next
        generation). Backends that read the weights from the model at each call do nothing; an engine holding its
        own copy (vLLM) reloads it here or on its next call."""
        return None

    def close(self) -> None:
        """Free what the backend keeps between calls (caches, engines)."""
        return None


# name -> backend class. A new backend is one GenerationBackend subclass plus one register_backend call.
BACKENDS: dict[str, type[GenerationBackend]] = {}


def register_backend(cls: type[GenerationBackend]) -> type[GenerationBackend]:
    """Make `cls.name` a generation backend (usable as a class decorator)."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no `name`; set the name it registers under.")
    BACKENDS[cls.name] = cls
    return cls


# ---------------------------------------------------------------------------------------------------------- Sampler
@dataclasses.dataclass
class Generation:
    """What one agent produced for a batch of prompts (B rows)."""

    query_ids: torch.Tensor  # (B, Lq) left-padded prompt tokens
    query_mask: torch.Tensor  # (B, Lq) 1 on real prompt tokens
    response_ids: torch.Tensor  # (B, Lr) sampled tokens, pad after the stop token
    response_mask: torch.Tensor  # (B, Lr) bool: tokens up to and including the first stop token
    texts: list[str]  # decoded responses (stop token and padding removed)
    ended: torch.Tensor  # (B,) bool: the response contains the stop token
    # (B, Lr) log softmax(logits / T) of each sampled token as the sampler saw it (0 after the stop token), when the
    # sampler was asked for them (`Sampler.logprob_temperature`) and its backend records them; else None
    sampled_logprobs: torch.Tensor | None = None
    # (B, Lr) the engine's log-probs of the sampled tokens (0 after the stop token) when the backend is an engine with
    # numerics of its own (vLLM; `Sampled.engine_logprobs`), else None
    engine_logprobs: torch.Tensor | None = None
    # the prompts' prefill with its autograd graph, when the sampler was asked to keep it (`keep_prompt_graph`) and
    # its backend could: the update forwards only the response on top of it (team/prompt_cache.py)
    prompt_cache: PromptCache | None = None


@dataclasses.dataclass
class Sampler:
    """A team, a backend and the settings, bound once (by the trainer, or by `inference.play`); the runners call it.

    Separate models: one backend call per agent over its whole batch. Shared base: one call for all agents, each row
    routed to its agent's adapter. `unwrap`: a context-manager factory (model -> model) that gathers ZeRO-3 weights
    for the call, or None. `logprob_temperature`: ask the backend for the sampled tokens' log-probs at that
    temperature (PPO's old log-probs; None: not needed). `lockstep`: asked at each call for generate()'s
    `synced_gpus` (ZeRO-3 gathering is set up when training starts), or None. `prompts`: what shapes each agent's
    prompt (prompts.py): the runners read its `agent_context`, and every prompt is encoded here with its limit.
    `keep_prompt_graph`: ask the backend to keep each agent's prompt prefill with gradients for the update
    (`Generation.prompt_cache`); the trainer sets it on its training rollouts when that is exact
    (`TeamUpdates.keeps_prompt_graph`).
    """

    team: AgentTeam
    backend: GenerationBackend
    settings: SamplingSettings
    device: torch.device | str = "cpu"
    unwrap: Callable | None = None
    logprob_temperature: float | None = None
    lockstep: Callable[[], bool | None] | None = None
    prompts: PromptSettings = dataclasses.field(default_factory=PromptSettings)
    keep_prompt_graph: bool = False

    def __post_init__(self):
        self.prompts.check_team(self.team)  # recorded chat templates: the team's tokenizers must render the same

    def with_settings(self, settings: SamplingSettings) -> Sampler:
        """The same sampler with other settings (e.g. greedy decoding for evaluation)."""
        return dataclasses.replace(self, settings=settings)

    @torch.no_grad()
    def __call__(self, observations: dict[str, list[Observation]]) -> dict[str, Generation]:
        """Sample one completion per observation for every agent that has observations."""
        team = self.team
        names = [n for n in team.names if observations.get(n)]
        if team.layout == "shared_base":
            encoded = {n: self._encode(n, observations[n]) for n in names}
            rows = [row for n in names for row in unpad_rows(*encoded[n])]
            ids, mask = left_pad(rows, team.pad_id(team.names[0]), self.device)
            adapters = [n for n in names for _ in range(len(observations[n]))]
            # One tokenizer on a shared base: the first agent's stop tokens are everyone's.
            out = self._sample(team.shared_base, ids, mask, team.pad_id(team.names[0]), team.names[0], adapters)
            result, start = {}, 0
            for n in names:
                part = slice(start, start + len(observations[n]))
                lp = out.logprobs[part] if out.logprobs is not None else None
                elp = out.engine_logprobs[part] if out.engine_logprobs is not None else None
                # Each agent's own prompt padding may be shorter than the joint one; trim the shared left padding.
                result[n] = _trim_left(self._finish(n, ids[part], mask[part], out.tokens[part], lp, elp))
                result[n].prompt_cache = (out.prompt_caches or {}).get(n)
                start += len(observations[n])
            return result
        result = {}
        for n in names:
            ids, mask = self._encode(n, observations[n])
            out = self._sample(team.policies[n], ids, mask, team.pad_id(n), n)
            result[n] = self._finish(n, ids, mask, out.tokens, out.logprobs, out.engine_logprobs)
            result[n].prompt_cache = (out.prompt_caches or {}).get(None)
        return result

    def _encode(self, name: str, observations: list[Observation]):
        return self.team.encode(name, observations, self.device, max_length=self.prompts.limit(name))

    def settings_for(self, name: str) -> SamplingSettings:
        """Agent `name`'s settings: the team's, with its own stop tokens when the settings name none and its chat
        template ends a turn with a token other than eos (trl_collm/chat.py; a mixed team has one per tokenizer)."""
        if self.settings.stop_token_ids:
            return self.settings
        tok = self.team.tokenizers[name]
        stops = chat.stop_token_ids(tok)
        if not stops or stops == (getattr(tok, "eos_token_id", None),):  # eos alone: generate() stops there already
            return self.settings
        return dataclasses.replace(self.settings, stop_token_ids=stops)

    def _sample(self, model, ids, mask, pad_id: int, agent: str, adapter_names: list[str] | None = None) -> Sampled:
        unwrap = self.unwrap or contextlib.nullcontext
        settings = self.settings_for(agent)
        # A penalty before the recorder makes its log-probs other than the policy's: the caller's forward computes them
        recorded = self.backend.records_logprobs and not settings.changes_logits()
        record = self.logprob_temperature if recorded else None
        with unwrap(model) as m:
            request = GenerationRequest(
                m,
                ids,
                mask,
                settings,
                pad_id=pad_id,  # finished rows are fed it back in
                adapter_names=adapter_names,
                use_adapter=self.team.active if adapter_names is not None else None,
                logprob_temperature=record,
                lockstep=self.lockstep() if self.lockstep is not None else None,
                keep_prompt_graph=self.keep_prompt_graph and self.backend.keeps_prompt_graph,
            )
            return self.backend.generate(request)

    def _finish(self, name, query_ids, query_mask, response_ids, logprobs=None, engine_logprobs=None) -> Generation:
        tok = self.team.tokenizers[name]
        stops = self.settings_for(name).stop_token_ids or (tok.eos_token_id,)
        if None in stops:
            raise ValueError(
                f"agent {name!r}'s tokenizer has no eos_token; set `stop_token_id` to the id that ends an answer."
            )
        is_stop = torch.isin(response_ids, torch.tensor(stops, device=response_ids.device))
        # Everything after the first stop token is padding; the stop token itself belongs to the action.
        after_stop = (is_stop.long().cumsum(-1) - is_stop.long()) > 0
        response_mask = ~after_stop
        ended = is_stop.any(-1)
        response_ids = response_ids.masked_fill(~response_mask, self.team.pad_id(name))
        texts = [
            tok.decode(r[m & ~s].tolist(), skip_special_tokens=True)
            for r, m, s in zip(response_ids, response_mask, is_stop)
        ]
        if logprobs is not None:
            logprobs = logprobs.masked_fill(~response_mask, 0.0)
        if engine_logprobs is not None:
            engine_logprobs = engine_logprobs.masked_fill(~response_mask, 0.0)
        return Generation(query_ids, query_mask, response_ids, response_mask, texts, ended, logprobs, engine_logprobs)


def _trim_left(gen: Generation) -> Generation:
    keep = gen.query_mask.any(0)
    if keep.all() or not keep.any():
        return gen
    first = int(keep.nonzero()[0])
    gen.query_ids = gen.query_ids[:, first:]
    gen.query_mask = gen.query_mask[:, first:]
    return gen
