"""The built-in generation backends: how a batch of left-padded prompts becomes sampled tokens.

Both implement `sampler.GenerationBackend` (the declared contract: `generate`, `weights_changed`, `close`) and are
registered by name; `make_backend(args)` (here) picks one from the trainer arguments. The `Sampler` hands
every backend the same thing (one model, left-padded prompt ids and mask, the `SamplingSettings`) and gets the same
thing back (the new tokens, right-padded with the pad id, and where the backend records them the sampler's
log-probs). The rest of the pipeline (stop-token masks, decoding, log-probs) never knows which backend ran.

- `GenerateBackend` ("generate", the default): HF `generate()`, in chunks of `local_rollout_forward_batch_size` rows,
  prefilling the rows' shared prompt prefix once (`prefix.generate_with_prefix`). LoRA teams run all agents in one
  call, each row routed to its adapter (PEFT mixed-adapter batch).
- `ContinuousBatchingBackend` ("continuous_batching", `use_transformers_continuous_batching=True`): transformers'
  `generate_batch` (paged KV cache, continuous batching, CUDA graphs on GPU; prompts sharing blocks are cached once).
  It takes one model state per call, so a LoRA team runs one call per adapter (PEFT's per-row adapter routing does
  not reach it).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import math
import weakref

import torch

from ..cpu.attention import transformers_sdpa
from ..cpu.lora_mixed import stacks_kept
from ..team.modeling import base_model_of
from ..team.prefix import decode_cache_kwargs
from ..team.prompt_cache import PromptCache, prefill
from .generation_kwargs import LOGIT_CHANGING_SETTINGS
from .sampler import (
    BACKENDS,
    BackendOptions,
    GenerationBackend,
    GenerationRequest,
    Sampled,
    SamplingSettings,
    register_backend,
)

# Generation-config settings that change the logits before a user's logits processor sees them (the table lives in
# generation_kwargs.py, which `SamplingSettings.changes_logits` reads for GRPO's `generation_kwargs`). With any of
# them set, the logits at sampling time are not the policy's, so the log-probs are left to the scoring forward.
_LOGIT_CHANGING_SETTINGS = LOGIT_CHANGING_SETTINGS


def sampler_logits_are_the_models(model, settings: SamplingSettings | None = None) -> bool:
    """Whether generate() samples from the model's own logits for `model` (no penalty or forced token in its
    generation config, nor in the run's `settings`: GRPO's `repetition_penalty`, `generation_kwargs`), so that the
    sampler's log-probs are the policy's. (The `Sampler` itself asks for none when its settings change the logits.)"""
    if settings is not None and settings.changes_logits():
        return False
    config = getattr(base_model_of(model), "generation_config", None)
    if config is None:
        return True
    return all(getattr(config, key, None) in neutral for key, neutral in _LOGIT_CHANGING_SETTINGS.items())


class SampledLogprobs:
    """A logits processor that records, at each decoding step, log softmax(logits / temperature) of the token the
    sampler then picks: the old log-probs of PPO, from the forward generate() already ran (TRL's PPO took them from
    the returned scores; this keeps one step's (B, vocab) table at a time instead of all of them).

    At step t it sees the token chosen at step t-1 (the last input id) and reads its log-prob from the table it kept;
    `finish` reads the last step's. Top-k / top-p filtering comes after it, so the log-probs are over the whole
    vocabulary, as the policy's are in the loss."""

    def __init__(self, temperature: float):
        self.temperature = float(temperature)
        self._table: torch.Tensor | None = None
        self._steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._table is not None:
            self._steps.append(self._table.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self._table = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """(B, new tokens) log-probs of `new_tokens`, the tokens generate() returned after the prompt."""
        if self._table is not None and len(self._steps) < new_tokens.shape[1]:
            self._steps.append(self._table.gather(-1, new_tokens[:, len(self._steps)].unsqueeze(-1)).squeeze(-1))
        self._table = None
        if not self._steps:
            return torch.zeros(new_tokens.shape, dtype=torch.float32, device=new_tokens.device)
        out = torch.stack(self._steps, dim=1)[:, : new_tokens.shape[1]]
        self._steps = []
        return out


class PolicySampler(SampledLogprobs):
    """A logits processor that draws each row's next token from softmax(logits / temperature) itself, by inverting
    the distribution's cumulative sum at one uniform number per row, and hands generate() scores whose argmax is
    that token (generate() then decodes greedily). It records the log-probs as `SampledLogprobs` does, from the same
    table it samples from.

    Why: generate()'s sampler (`torch.multinomial`) draws an exponential number for every word of the vocabulary at
    every step (SmolLM2: 49,152 per row; ~22 ms a step at 16 rows on an AMD EPYC, one thread, ~15 % of a decoding
    step) where one uniform per row suffices. The distribution is the same (up to float rounding of the cumulative
    sum, kept in float64); the random numbers drawn are others, so a seeded run samples other tokens than generate()'s
    own sampler would (both draw from torch's default generator, so seeded runs still repeat). Used only where the
    settings sample the policy itself (no top-k, top-p, min-p, penalty or generation_kwargs:
    `SamplingSettings.samples_the_policy`); the other cases keep generate()'s sampler."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        super().__call__(input_ids, scores)
        cdf = self._table.double().exp_().cumsum_(-1)
        point = torch.rand(cdf.shape[0], 1, dtype=torch.float64, device=cdf.device) * cdf[:, -1:]
        # the first token whose cumulative sum passes the point: a token of probability 0 spans no interval
        token = torch.searchsorted(cdf, point, right=True).clamp_(max=cdf.shape[-1] - 1)
        return torch.full_like(scores, float("-inf")).scatter_(-1, token, 0.0)


def policy_sampling_kwargs(kwargs: dict) -> dict:
    """generate()'s keyword arguments with its own sampling off (`PolicySampler` draws the tokens): greedy
    decoding over the sampler's one-hot scores, without the warpers' settings (greedy decoding would warn)."""
    out = {k: v for k, v in kwargs.items() if k not in ("temperature", "top_p", "top_k", "min_p")}
    out["do_sample"] = False
    return out


@register_backend
class GenerateBackend(GenerationBackend):
    """HF `generate()` in chunks of `batch_size` rows (None: all rows at once), with the shared-prefix prefill
    (`share_prefix`)."""

    name = "generate"
    records_logprobs = True
    keeps_prompt_graph = True

    def __init__(self, batch_size: int | None = None, share_prefix: bool = True, policy_sampler: bool = True):
        self.batch_size = batch_size
        self.share_prefix = share_prefix
        self.policy_sampler = policy_sampler  # False: generate()'s own sampler in every case (tests compare both)

    @classmethod
    def from_config(cls, options: BackendOptions) -> GenerateBackend:
        return cls(options.local_rollout_forward_batch_size, options.share_prompt_prefix)

    def generate(self, request: GenerationRequest) -> Sampled:
        with stacks_kept():  # the weights are fixed for this call: mixed LoRA batches stack each layer once
            return self._generate(request)

    def _generate(self, request: GenerationRequest) -> Sampled:
        from transformers import LogitsProcessorList

        from ..team.prefix import generate_with_prefix

        r = request
        gen_kwargs = r.settings.generate_kwargs(r.pad_id)
        # the policy's own distribution: PolicySampler draws the tokens (one uniform per row instead of an
        # exponential per word); any filter or penalty keeps generate()'s sampler
        own_sampler = self.policy_sampler and r.settings.samples_the_policy()
        if own_sampler:
            gen_kwargs = policy_sampling_kwargs(gen_kwargs)
        if r.lockstep is not None:
            gen_kwargs["synced_gpus"] = r.lockstep
        outs, logprobs = [], []
        kept = {} if r.keep_prompt_graph else None
        step = self.batch_size or r.ids.shape[0] or 1
        for start in range(0, r.ids.shape[0], step):
            kwargs = dict(gen_kwargs)
            if r.adapter_names is not None:
                kwargs["adapter_names"] = r.adapter_names[start : start + step]
            sampler = PolicySampler(r.settings.temperature) if own_sampler else None
            if sampler is not None and r.logprob_temperature == r.settings.temperature:
                recorder, processors = sampler, [sampler]  # it records from the table it samples from
            else:
                recorder = SampledLogprobs(r.logprob_temperature) if r.logprob_temperature is not None else None
                processors = [p for p in (recorder, sampler) if p is not None]
            if processors:
                kwargs["logits_processor"] = LogitsProcessorList(processors)
            rows = slice(start, start + step)
            out = None
            if kept is not None:
                out = self._generate_keeping_prompts(r, rows, kwargs, kept)
            if out is None:
                kept = None  # one chunk without its prefill: no row keeps one (the update forwards them all)
                out = generate_with_prefix(r.model, r.ids[rows], r.mask[rows], kwargs, enabled=self.share_prefix)
            outs.append(out[:, r.ids.shape[1] :])
            if recorder is not None:
                logprobs.append(recorder.finish(outs[-1]))
        tokens = _right_pad_cat(outs, r.pad_id)
        caches = {name: PromptCache.cat(parts) for name, parts in kept.items()} if kept else None
        return Sampled(tokens, _right_pad_cat(logprobs, 0.0) if logprobs else None, prompt_caches=caches)

    def _generate_keeping_prompts(self, r: GenerationRequest, rows: slice, kwargs: dict, kept: dict):
        """generate() on the chunk `rows` after a prefill with gradients per adapter (team/prompt_cache.py), the
        prefills appended to `kept` (adapter -> parts); None when a prefill is not possible (the caller then runs
        the plain path)."""
        ids, mask = r.ids[rows], r.mask[rows]
        names = r.adapter_names[rows] if r.adapter_names is not None else [None] * ids.shape[0]
        groups = {name: [i for i, n in enumerate(names) if n == name] for name in dict.fromkeys(names)}
        pieces, order = [], []
        for name, idx in groups.items():
            index = torch.tensor(idx, device=ids.device)
            use = r.use_adapter(name) if name is not None else contextlib.nullcontext(r.model)
            with use as m:
                cache = prefill(m, ids[index], mask[index], share_prefix=self.share_prefix)
            if cache is None:
                return None
            pieces.append(cache)
            order.extend(idx)
        decode = PromptCache.cat([c.detached() for c in pieces])
        decode = decode.rows(torch.argsort(torch.tensor(order, device=ids.device)))  # back to the chunk's row order
        # generate() reads the cache as covering the first columns of `input_ids` and computes the rest (the last
        # prompt token); the cache's columns are placeholders for it (only the cache's mask and keys are read).
        placeholder = torch.full((ids.shape[0], decode.length), r.pad_id, dtype=ids.dtype, device=ids.device)
        out = r.model.generate(
            input_ids=torch.cat([placeholder, ids[:, -1:]], dim=1),
            attention_mask=torch.cat([decode.mask, torch.ones_like(mask[:, -1:])], dim=1),
            **decode_cache_kwargs(r.model, kwargs, decode.keys, decode.values),
            **kwargs,
        )
        for name, cache in zip(groups, pieces):
            kept.setdefault(name, []).append(cache)
        return torch.cat([ids, out[:, decode.length + 1 :]], dim=1)


@register_backend
class ContinuousBatchingBackend(GenerationBackend):
    """transformers' continuous batching (`generate_batch`) over every row of the call at once.

    `config`: keyword arguments for `transformers.generation.ContinuousBatchingConfig` (TRL's
    `transformers_continuous_batching_config`). As in TRL, `max_memory_percent` defaults to 0.5 on an accelerator
    (the cache must leave room for training). On CPU, where transformers would size the cache from the machine's
    free RAM, `num_blocks` and `max_batch_tokens` default to what the call's rows need.
    Sampling draws from torch's global generator (transformers seeds its sampler from it), so seeded runs repeat.
    """

    name = "continuous_batching"
    records_logprobs = False  # generate_batch returns tokens only: PPO's scoring forward computes the log-probs

    def __init__(self, config: dict | None = None):
        if config is not None and not isinstance(config, dict):
            raise TypeError(
                f"transformers_continuous_batching_config must be a dict (or JSON string), got {type(config).__name__}."
            )
        self.config = dict(config or {})
        _check_config_keys(self.config)
        # (id(model), adapter) -> the manager kept from the last call and what it was built for (see _generate_batch)
        self._managers: dict[tuple, _KeptManager] = {}
        _LIVE_BACKENDS.add(self)

    @classmethod
    def from_config(cls, options: BackendOptions) -> ContinuousBatchingBackend:
        return cls(options.transformers_continuous_batching_config)

    def close(self) -> None:
        """Stop and free the managers kept between calls."""
        managers, self._managers = self._managers, {}
        for kept in managers.values():
            kept.manager.destroy()

    def __del__(self):
        with contextlib.suppress(Exception):  # interpreter shutdown may have torn transformers down already
            self.close()

    def generate(self, request: GenerationRequest) -> Sampled:
        r = request
        self.refuse_lockstep(r.lockstep, "use_transformers_continuous_batching")
        gen_kwargs = r.settings.generate_kwargs(r.pad_id)  # every key it writes is one generate_batch honours
        prompts = r.prompts()
        if r.adapter_names is None:
            new = self._generate_batch(r.model, prompts, gen_kwargs)
        else:
            # One call per adapter: generate_batch runs one model state for all its requests.
            new = [None] * len(prompts)
            for name in dict.fromkeys(r.adapter_names):
                rows = [i for i, a in enumerate(r.adapter_names) if a == name]
                with r.use_adapter(name) if r.use_adapter is not None else contextlib.nullcontext(r.model) as m:
                    batch = self._generate_batch(m, [prompts[i] for i in rows], gen_kwargs, adapter=name)
                    for i, tokens in zip(rows, batch):
                        new[i] = tokens
        width = max((len(t) for t in new), default=0)
        out = torch.full((r.ids.shape[0], width), r.pad_id, dtype=r.ids.dtype, device=r.ids.device)
        for i, tokens in enumerate(new):
            if tokens:
                out[i, : len(tokens)] = torch.tensor(tokens, dtype=r.ids.dtype)
        return Sampled(out, None)

    def _generate_batch(
        self, model, prompts: list[list[int]], gen_kwargs: dict, adapter: str | None = None
    ) -> list[list[int]]:
        from transformers import GenerationConfig
        from transformers.generation import ContinuousBatchingConfig

        # A PEFT model's LoRA layers live inside the wrapped transformers model, which owns generate_batch.
        inner = base_model_of(model)
        base = inner.generation_config.to_dict() if getattr(inner, "generation_config", None) is not None else {}
        # Start from the model's generation config (as generate() does: its eos token when no stop token is set),
        # then the trainer's settings; `top_k=0` / `top_p=1.0` turn those filters off as they do in generate().
        config = GenerationConfig(**{**base, **gen_kwargs})
        config.num_return_sequences = 1
        cb = dict(self.config)
        max_new = int(gen_kwargs["max_new_tokens"])
        need = _Need(rows=len(prompts), longest=max(len(p) for p in prompts) + max_new, blocks=0)
        if inner.device.type == "cpu":
            page = int(cb.get("page_size", 256))
            cb.setdefault("page_size", page)
            need.blocks = sum(math.ceil((len(p) + max_new) / page) for p in prompts) + 1
            # Twice what this call needs: the manager is kept for later calls, whose prompts grow turn by turn.
            cb.setdefault("num_blocks", 2 * need.blocks)
            cb.setdefault("max_batch_tokens", max(64, min(8192, sum(len(p) for p in prompts))))
        else:
            cb.setdefault("max_memory_percent", 0.5)
        # The manager (its paged cache, warm-up and, on a GPU, captured CUDA graphs) is kept between calls: building
        # and tearing it down cost a fixed 0.3-0.6 s per call on CPU (docs/generation.md). transformers keeps one
        # manager per model (`persistent_manager`) and reuses it whatever the next call asks, so it is kept here per
        # model and adapter (a LoRA team switches adapters between calls) and rebuilt when the settings change or
        # the call does not fit what it was sized for.
        slot = (id(inner), adapter)
        settings = (config.to_json_string(use_diff=False), repr(sorted((k, repr(v)) for k, v in self.config.items())))
        kept = self._managers.pop(slot, None)
        if kept is not None and not kept.serves(settings, need):
            kept.manager.destroy()
            kept = None
        if kept is not None:
            inner._cached_continuous_batching_manager = kept.manager  # the slot generate_batch looks in
        was_training = inner.training
        try:
            with _quiet_persistent_manager_warning(), transformers_sdpa(inner):
                outputs = inner.generate_batch(
                    prompts,
                    generation_config=config,
                    continuous_batching_config=ContinuousBatchingConfig(**cb),
                    progress_bar=False,
                    max_new_tokens=max_new,
                    persistent_manager=True,
                )
        finally:
            manager = inner.__dict__.pop("_cached_continuous_batching_manager", None)
            inner.train(was_training)
        if manager is not None and any(hasattr(p, "ds_id") for p in inner.parameters()):
            # ZeRO-3: the next gather puts the weights in new memory, which a kept manager's captured CUDA graphs
            # would not see; build a fresh manager per call there.
            manager.destroy()
            manager = None
        if manager is not None:
            capacity = int(cb.get("num_blocks") or 0)
            self._managers[slot] = kept if kept is not None else _KeptManager(manager, settings, need, capacity)
        results = list(outputs.values())
        failed = [o.request_id for o in results if o.error is not None]
        if len(results) != len(prompts) or failed:
            raise RuntimeError(
                f"transformers' generate_batch returned {len(results)} of {len(prompts)} completions"
                + (f" ({len(failed)} failed: {results[0].error if failed else ''})" if failed else "")
                + "; see the transformers log above, or set use_transformers_continuous_batching=False."
            )
        return [list(o.generated_tokens)[:max_new] for o in results]


def backend_name(args) -> str:
    """The backend the arguments ask for, by TRL's field names (`use_vllm`, `use_transformers_continuous_batching`)."""
    options = BackendOptions.from_args(args)
    if options.use_vllm:
        return "vllm"
    if options.use_transformers_continuous_batching:
        return "continuous_batching"
    return "generate"


def make_backend(args=None) -> GenerationBackend:
    """Build the backend the trainer config, command-line namespace or `BackendOptions` asks for (HF generate() by
    default; the built-ins above are registered by the time this module is imported)."""
    from . import vllm_backend  # noqa: F401  (registers "vllm"; the vllm package itself is imported by an engine)

    name = backend_name(args)
    if name not in BACKENDS:
        raise ValueError(f"generation backend {name!r} is not available (registered: {sorted(BACKENDS)}).")
    return BACKENDS[name].from_config(BackendOptions.from_args(args))


_LIVE_BACKENDS: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_live_backends() -> None:  # before interpreter teardown, while transformers can still free its managers
    for backend in list(_LIVE_BACKENDS):
        backend.close()


@dataclasses.dataclass
class _Need:
    rows: int  # requests in the call
    longest: int  # longest prompt + max_new_tokens
    blocks: int  # paged-cache blocks the call needs (CPU sizing; 0 where transformers sizes the cache)


@dataclasses.dataclass
class _KeptManager:
    manager: object
    settings: tuple  # generation and continuous-batching settings it was built with
    built_for: _Need  # the call it was built for (transformers sizes requests per batch and blocks per request by it)
    capacity: int  # paged-cache blocks it holds (0: sized by transformers from the device's memory)

    def serves(self, settings: tuple, need: _Need) -> bool:
        b = self.built_for
        return (
            settings == self.settings
            and need.rows <= b.rows
            and need.longest <= b.longest
            and (self.capacity == 0 or need.blocks <= self.capacity)
        )


class _DropPersistentManagerWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "persistent_manager=True" not in record.getMessage()


@contextlib.contextmanager
def _quiet_persistent_manager_warning():
    """generate_batch warns on every call with `persistent_manager=True` that the kept manager is sized for that
    call; the backend checks that itself (`_KeptManager.serves`)."""
    log = logging.getLogger("ContinuousBatchingLogger")
    drop = _DropPersistentManagerWarning()
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


def _check_config_keys(config: dict) -> None:
    from dataclasses import fields

    from transformers.generation import ContinuousBatchingConfig

    known = {f.name for f in fields(ContinuousBatchingConfig)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(
            f"transformers_continuous_batching_config has unknown keys {unknown}; it takes the keyword arguments of "
            f"transformers.generation.ContinuousBatchingConfig ({', '.join(sorted(known))})."
        )


def _right_pad_cat(outs: list[torch.Tensor], pad_id: int) -> torch.Tensor:
    # Chunks may stop at different lengths; right-pad them to one width with the pad token.
    width = max(o.shape[1] for o in outs)
    return torch.cat([torch.nn.functional.pad(o, (0, width - o.shape[1]), value=pad_id) for o in outs], dim=0)
