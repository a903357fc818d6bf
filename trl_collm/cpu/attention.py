"""Attention on a CPU: float32 while the rest of the model computes in bf16, and grouped-query attention without
copies of the keys and values.

Why float32: torch's CPU scaled-dot-product kernels are slow in bf16. One decode step's attention call (8 rows x 9
heads, one query row against a 300-400-token KV cache, one thread) took 3.0 ms in bf16 against 0.65 in float32 on an
AMD EPYC with avx512_bf16 (`torch.profiler` over 8 decode steps, docs/benchmarks.md: 727 ms in that kernel against
357 in all the matmuls), and 4.1 ms against 0.5 (0.8 with the casts to and from float32) on an AVX2-only EPYC: in a
bf16 decode step attention cost more than all the linear layers' matmuls. In the update's forward + backward, one
attention layer of the workload's shape took 284-313 ms with the bf16 flash kernel and 209 ms in float32. The
matmuls of the linear layers, where bf16 pays, stay in bf16. Attention's arithmetic is then float32 (more accurate
than bf16); its inputs are the bf16 q / k / v the projections made and its output is cast back, so the model around
it sees the dtypes it saw before. Autocast is switched off around the float32 call: under CPU autocast
`scaled_dot_product_attention` would be cast back to bf16.

Why grouped: with a padding mask and more query heads than key / value heads (SmolLM2: 9 and 3), transformers'
`sdpa` copies the keys and values once per query head of their group (`repeat_kv`) before the kernel, and autograd
keeps the copies until the backward. torch's CPU kernel takes the groups itself (`enable_gqa=True`): the same outputs
bitwise, the keys' and values' gradients summed over the group inside the kernel (float rounding), a third of the
saved key / value memory for SmolLM2, and a forward + backward of the workload's shape (8 rows x 214 tokens, float32,
one thread) 43 ms against 50-55 with the copies. Decoding (one query row) is left to transformers, which folds the
groups into the query instead.

Why one additive mask per forward: transformers hands every layer the same boolean padding mask, and torch's kernel
turns a boolean mask into an additive float one (0 / -inf) at every call, which autograd then keeps: one float32
copy of the (rows x queries x keys) mask per layer. Converted here once per mask (a one-entry memo per thread,
keyed by the mask object and its version) and given to every layer, the kernel sees the same values (bitwise the
same outputs and gradients) and autograd keeps one copy (the workload's prompt prefill: ~1.3 KB per token and layer
less, a critic's long views more: the mask grows with the keys).

On a GPU the call is transformers' own `sdpa` unchanged. `use_cpu_attention(module)` switches every transformers
model under `module` whose attention is `sdpa`; `adapt_for_cpu` calls it for every model the trainers run on a CPU.
The name is registered with transformers' `AttentionInterface` and, as transformers requires for a custom name, with
`AttentionMaskInterface` (without that no padding mask reaches the function: silently wrong log-probs for
left-padded rows).
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import torch
from torch import nn

NAME = "collm_cpu_float32_sdpa"
_HALF = (torch.bfloat16, torch.float16)


def cpu_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' `sdpa_attention_forward` on a CPU: computed in float32 when half precision is in play, and with
    grouped query heads given to the kernel instead of copied keys and values.

    Under CPU autocast the rotary embedding has already promoted q and k to float32 (its cos / sin are float32)
    while v is bf16; autocast would cast all three to bf16 for the kernel. Here they all go in as float32 instead,
    and the output leaves in the dtype the plain path gives (autocast's, or the half dtype of a half model)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.device.type != "cpu":
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    autocast = torch.is_autocast_enabled("cpu")
    half = {t.dtype for t in (query, key, value)} & set(_HALF)
    if not (autocast or half):
        return _grouped_sdpa(module, query, key, value, additive_mask(attention_mask, query.dtype), **kwargs)
    dtype = torch.get_autocast_dtype("cpu") if autocast else next(iter(half))
    if attention_mask is not None and attention_mask.dtype in _HALF:  # an additive mask: its -inf/0 in float32
        attention_mask = attention_mask.float()
    attention_mask = additive_mask(attention_mask, torch.float32)
    with torch.autocast("cpu", enabled=False):
        out, weights = _grouped_sdpa(module, query.float(), key.float(), value.float(), attention_mask, **kwargs)
    return out.to(dtype), weights


_memo = threading.local()  # the last mask converted: (weakref to the boolean mask, its version, dtype, the float mask)


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean attention mask as the additive one torch's kernel would make of it at each call (0 where True,
    -inf where False, in `dtype`), made once per mask object and shared by the layers that read it; any other mask
    as it is."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    last = getattr(_memo, "last", None)
    if last is not None and last[0]() is mask and last[1] == mask._version and last[2] == dtype:
        return last[3]
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask.logical_not(), float("-inf"))
    _memo.last = (weakref.ref(mask), mask._version, dtype, out)
    return out


def _grouped_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """`sdpa_attention_forward`, with the one case where it would copy keys and values per query head (a mask,
    several query rows, grouped heads) run by torch's kernel with `enable_gqa`; every other case is its own."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    unusual = kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
    if groups == 1 or attention_mask is None or query.shape[2] == 1 or unusual or kwargs.get("output_attentions"):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    # With a mask transformers never sets is_causal (the mask holds the causal pattern), so neither do we.
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Make NAME known to transformers (idempotent); returns it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, cpu_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def use_cpu_attention(module: nn.Module) -> int:
    """Switch every transformers model under `module` from `sdpa` to NAME; returns how many were switched. Models
    with another attention (eager, flash, a kernel the user chose) are left as they are."""
    register()
    return len(_switch(module, "sdpa", NAME))


@contextlib.contextmanager
def transformers_sdpa(module: nn.Module):
    """transformers' own `sdpa` for the models under `module` switched to NAME, for the duration: transformers'
    continuous batching accepts only the implementations it knows (it runs its own paged variant of `sdpa`)."""
    switched = _switch(module, NAME, "sdpa")
    try:
        yield
    finally:
        for m in switched:
            m.set_attn_implementation(NAME)


def _switch(module: nn.Module, old: str, new: str) -> list:
    """Set attention `new` on every transformers model under `module` whose attention is `old`; returns them."""
    from transformers import PreTrainedModel

    switched = []
    for m in module.modules():  # checked as it goes: switching a model also switches the submodels sharing its config
        if isinstance(m, PreTrainedModel) and getattr(m.config, "_attn_implementation", None) == old:
            m.set_attn_implementation(new)
            switched.append(m)
    return switched
