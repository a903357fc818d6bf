"""`GenerationBackendFields`: the fields that pick and tune the generation backend (transformers' continuous batching,
vLLM), under TRL 1.16's GRPOConfig names, types and defaults. `TeamConfig` derives from it, so every team config
has them (and every one is a command-line flag); `trl_collm/generation/backends.py` (`make_backend`) and
`generation/vllm_backend.py` read them, and docs/generation.md documents them. Their choices are checked with the
other fields' (`TEAM_CHOICES`, `team_config.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from ..generation.sampler import BackendOptions
from .ranges import ABOVE_0, AT_LEAST_0, AT_LEAST_1, UNIT_OPEN_BOTTOM


@dataclass
class GenerationBackendFields:
    r"""The generation backend's fields, shared by the team configs (`TeamConfig` derives from this class).

    Parameters:
        > Parameters that choose the generation backend

        use_transformers_continuous_batching (`bool`, *optional*, defaults to `False`):
            Generate rollouts with transformers' continuous batching (`generate_batch`) instead of `generate()`; LoRA
            teams run one call per adapter (see docs/generation.md).
        transformers_continuous_batching_config (`dict | str`, *optional*, defaults to `None`):
            Keyword arguments for `transformers.generation.ContinuousBatchingConfig` (a dict or JSON string).
        use_vllm (`bool`, *optional*, defaults to `False`):
            Generate rollouts with vLLM instead of `generate()`: one engine per distinct agent model, or one engine
            over the shared base with one LoRA adapter per agent; weights re-sent after every update. vLLM is
            installed apart from this project (see docs/generation.md).
        vllm_mode (`str`, *optional*, defaults to `'colocate'`):
            'colocate': the engine runs in the training process. TRL's 'server' mode is refused (one external server
            holds one model; a team needs one engine per agent model and its weight sync).
        vllm_gpu_memory_utilization (`float`, *optional*, defaults to `0.3`):
            Fraction of the GPU's memory the colocated engine takes (weights and KV cache); on CPU vLLM sizes its
            KV cache with VLLM_CPU_KVCACHE_SPACE instead.
        vllm_max_model_length (`int`, *optional*, defaults to `None`):
            The engine's context window (prompt plus response); default: the model's.
        vllm_enable_sleep_mode (`bool`, *optional*, defaults to `False`):
            Put the engine to sleep (weights and KV cache released) between rollouts; it wakes with the new weights.
            GPU only.
        vllm_model_impl (`str`, *optional*, defaults to `'vllm'`):
            'vllm' (vLLM's own model code) or 'transformers' (vLLM's transformers backend).
        vllm_importance_sampling_correction (`bool`, *optional*, defaults to `True`):
            Weight the policy loss by the clipped or masked ratio of the trainer's old log-probs to vLLM's sampler
            log-probs (truncated importance sampling, as TRL's GRPO does), correcting for the engine's numerics.
        vllm_importance_sampling_mode (`str`, *optional*, defaults to `'sequence_mask'`):
            'token_truncate', 'token_mask', 'sequence_truncate' or 'sequence_mask': per-token or per-response ratios,
            clipped to [clip_min, clip_max] (truncate) or zeroed outside it (mask).
        vllm_importance_sampling_clip_max (`float`, *optional*, defaults to `3.0`):
            Upper bound of the importance-sampling ratio (None: no upper bound).
        vllm_importance_sampling_clip_min (`float`, *optional*, defaults to `None`):
            Lower bound of the importance-sampling ratio (None: 0 for truncate modes, none for mask modes).
    """

    # Generation backend: TRL 1.16's GRPOConfig names and types. Read by trl_collm/generation/backends.py
    # (`make_backend`); documented in docs/generation.md.
    use_transformers_continuous_batching: bool = field(
        default=False,
        metadata={
            "help": (
                "Generate rollouts with transformers' continuous batching (`generate_batch`: paged KV cache, "
                "continuous batching, CUDA graphs on GPU) instead of `generate()`. LoRA teams run one call per "
                "adapter. "
                "Same sampling settings, stop token and response_length (see docs/generation.md)."
            )
        },
    )
    transformers_continuous_batching_config: dict | str | None = field(
        default=None,
        metadata={
            "help": (
                "Keyword arguments for `transformers.generation.ContinuousBatchingConfig` (a dict or JSON "
                "string). Default on GPU: max_memory_percent=0.5, as in TRL; on CPU the cache is sized to each call."
            )
        },
    )
    # vLLM: TRL 1.16 GRPOConfig's names and defaults. Read by trl_collm/generation/vllm_backend.py; docs/generation.md.
    use_vllm: bool = field(
        default=False,
        metadata={
            "help": (
                "Generate rollouts with vLLM (see docs/generation.md) instead of generate(): one engine per agent "
                "model, or one over the shared base with one LoRA adapter per agent; weights re-sent after each update."
            )
        },
    )
    vllm_mode: str = field(
        default="colocate",
        metadata={"help": "'colocate' (the engine runs in the training process); 'server' is refused for teams."},
    )
    vllm_gpu_memory_utilization: Annotated[float, UNIT_OPEN_BOTTOM] = field(
        default=0.3,
        metadata={"help": "Fraction of the GPU's memory the colocated engine takes (weights and KV cache)."},
    )
    vllm_max_model_length: Annotated[int | None, AT_LEAST_1] = field(
        default=None, metadata={"help": "The engine's context window (prompt plus response); default: the model's."}
    )
    vllm_enable_sleep_mode: bool = field(
        default=False,
        metadata={"help": "Put the engine to sleep between rollouts (GPU only); it wakes with the new weights."},
    )
    vllm_model_impl: str = field(
        default="vllm",
        metadata={"help": "'vllm' (vLLM's own model code) or 'transformers' (vLLM's transformers backend)."},
    )
    vllm_importance_sampling_correction: bool = field(
        default=True,
        metadata={
            "help": (
                "Weight the policy loss by the clipped or masked ratio of the trainer's old log-probs to vLLM's "
                "sampler log-probs (truncated importance sampling, as TRL's GRPO)."
            )
        },
    )
    vllm_importance_sampling_mode: str = field(
        default="sequence_mask",
        metadata={"help": "'token_truncate', 'token_mask', 'sequence_truncate' or 'sequence_mask'."},
    )
    vllm_importance_sampling_clip_max: Annotated[float | None, ABOVE_0] = field(
        default=BackendOptions.vllm_importance_sampling_clip_max,
        metadata={"help": "Upper bound of the importance-sampling ratio (None: no upper bound)."},
    )
    vllm_importance_sampling_clip_min: Annotated[float | None, AT_LEAST_0] = field(
        default=None,
        metadata={"help": "Lower bound of the importance-sampling ratio (None: 0 for truncate, none for mask modes)."},
    )
