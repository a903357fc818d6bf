"""Attention in float32 on a CPU while the rest of the model computes in bf16.

Why: torch's CPU scaled-dot-product kernels are slow in bf16. One decode step's attention call (8 rows x 9 heads,
one query row against a 300-400-token KV cache, one thread) took 3.0 ms in bf16 against 0.65 in float32 on an AMD
EPYC with avx512_bf16 (`torch.profiler` over 8 decode steps, docs/benchmarks.md: 727 ms in that kernel against 357
in all the matmuls), and 4.1 ms against 0.5 (0.8 with the casts to and from float32) on an AVX2-only EPYC: in a bf16
decode step attention cost more than all the linear layers' matmuls. In the update's forward + backward, one
attention layer of the workload's shape took 284-313 ms with the bf16 flash kernel and 209 ms in float32. The
matmuls of the linear layers, where bf16 pays, stay in bf16.

What it changes: attention's arithmetic is float32 (more accurate than bf16); its inputs are the bf16 q / k / v the
projections made and its output is cast back, so the model around it sees the dtypes it saw before. On a GPU, in
float32, and for a half-precision tensor off the CPU, the call is transformers' own `sdpa` unchanged. Autocast is
switched off around the float32 call: under CPU autocast `scaled_dot_product_attention` would be cast back to bf16.

`use_float32_cpu_attention(module)` switches every transformers model under `module` whose attention is `sdpa`; the
trainers call it where they turn on CPU bf16 autocast. The name is registered with transformers' `AttentionInterface`
and, as transformers requires for a custom name, with `AttentionMaskInterface` (without that no padding mask reaches
the function: silently wrong log-probs for left-padded rows).
"""

from __future__ import annotations

import torch
from torch import nn

NAME = "collm_cpu_float32_sdpa"
_HALF = (torch.bfloat16, torch.float16)


def float32_cpu_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' `sdpa_attention_forward`, computed in float32 on the CPU when half precision is in play.

    Under CPU autocast the rotary embedding has already promoted q and k to float32 (its cos / sin are float32)
    while v is bf16; autocast would cast all three to bf16 for the kernel. Here they all go in as float32 instead,
    and the output leaves in the dtype the plain path gives (autocast's, or the half dtype of a half model)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    autocast = query.device.type == "cpu" and torch.is_autocast_enabled("cpu")
    half = {t.dtype for t in (query, key, value)} & set(_HALF)
    if query.device.type != "cpu" or not (autocast or half):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    dtype = torch.get_autocast_dtype("cpu") if autocast else next(iter(half))
    if attention_mask is not None and attention_mask.dtype in _HALF:  # an additive mask: its -inf/0 in float32
        attention_mask = attention_mask.float()
    with torch.autocast("cpu", enabled=False):
        out, weights = sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), attention_mask, **kwargs
        )
    return out.to(dtype), weights


def register() -> str:
    """Make NAME known to transformers (idempotent); returns it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, float32_cpu_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def use_float32_cpu_attention(module: nn.Module) -> int:
    """Switch every transformers model under `module` from `sdpa` to NAME; returns how many were switched. Models
    with another attention (eager, flash, a kernel the user chose) are left as they are."""
    from transformers import PreTrainedModel

    register()
    switched = 0
    for m in module.modules():
        config = getattr(m, "config", None)
        if isinstance(m, PreTrainedModel) and getattr(config, "_attn_implementation", None) == "sdpa":
            m.set_attn_implementation(NAME)
            switched += 1
    return switched
