"""A team's mixed-adapter batch (each row its own LoRA adapter) as two small matmuls per layer.

Why: PEFT runs a batch whose rows use different adapters (`adapter_names=`, how a team decodes all agents in one
batch) adapter by adapter: per LoRA layer and adapter it gathers the adapter's rows, runs `lora_A` and `lora_B` on
them and adds the result back in place. For a decoding step (16 rows, one token) that is a handful of tiny ops per
adapter and layer, and under CPU bf16 autocast each tiny bf16 matmul costs ~4x its float32 time: SmolLM2-135M with
two adapters on q_proj / v_proj decoded at 169 ms a step against 119 ms with one adapter (AMD EPYC, avx512_bf16,
bf16 autocast, 16 rows; 163 vs 154 in float32).

Here every adapter's `lora_A` rows are stacked into one matrix and every `lora_B` (times its scaling) into another,
so the layer's LoRA part is `((x @ A_all^T) * row_mask) @ B_all^T`: the row mask zeroes, for each row, the rank
columns of the adapters it does not use, so each row gets exactly its own adapter's update (rows of `"__base__"` or
of an adapter this layer does not have get none). The products are the ones PEFT computes, plus exact zeros; only
the order of the float sums may differ (up to rounding).

It applies to plain LoRA layers (no DoRA or other variant, no LoRA bias, every adapter of the same rank; PEFT
allows mixed batches in eval mode only, so dropout is off); any other layer or call keeps PEFT's own
`_mixed_batch_forward`.
"""

from __future__ import annotations

import contextlib
import types

import torch
import torch.nn.functional as F
from torch import nn


def _stackable(layer, names: set[str]) -> bool:
    adapters = [a for a in names if a in layer.lora_A]
    if not adapters or any(a in getattr(layer, "lora_variant", {}) for a in adapters):
        return False
    ranks = {layer.lora_A[a].weight.shape[0] for a in adapters}
    # (No dropout check: PEFT refuses `adapter_names` in training mode, so dropout is inactive here.)
    return len(ranks) == 1 and all(layer.lora_A[a].bias is None and layer.lora_B[a].bias is None for a in adapters)


def _stacked_mixed_batch_forward(self, x: torch.Tensor, *args, adapter_names: list[str], **kwargs) -> torch.Tensor:
    names = set(adapter_names)
    if kwargs.get("alora_offsets") is not None or not _stackable(self, names):
        return type(self)._mixed_batch_forward(self, x, *args, adapter_names=adapter_names, **kwargs)
    kwargs.pop("alora_offsets", None)
    result = self.base_layer(x, *args, **kwargs)
    adapters = tuple(sorted(a for a in names if a in self.lora_A))
    a_all, b_all = _stacked_weights(self, adapters)
    row_mask = _row_mask(self, adapters, tuple(adapter_names), x)
    hidden = F.linear(x.to(a_all.dtype), a_all)
    hidden = hidden * row_mask.to(hidden.dtype)
    return result + F.linear(hidden, b_all).to(result.dtype)


# Stacks are kept only inside `stacks_kept()` (one decoding pass, whose weights cannot change): outside it a write
# that no version counter sees (`p.data.copy_`, as DeepSpeed's optimizers and some loaders do) would leave a kept
# stack stale, so every call rebuilds them.
_SCOPE = {"depth": 0, "pass": 0}


@contextlib.contextmanager
def stacks_kept():
    """Within this block the LoRA weights do not change (a generate() call): each layer stacks its adapters once."""
    if _SCOPE["depth"] == 0:
        _SCOPE["pass"] += 1
    _SCOPE["depth"] += 1
    try:
        yield
    finally:
        _SCOPE["depth"] -= 1


def _stacked_weights(layer, adapters: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(n * r, in) and (out, n * r): the adapters' A rows and scaled B columns side by side; kept for the rest of
    the decoding pass inside `stacks_kept()` without gradients, rebuilt otherwise (with gradients, so that backward
    reaches each adapter's weights)."""
    keep = _SCOPE["depth"] > 0 and not torch.is_grad_enabled()
    key = (adapters, _SCOPE["pass"])
    kept = getattr(layer, "_collm_stacked_weights", None)
    if keep and kept is not None and kept[0] == key:
        return kept[1]
    a_all = torch.cat([layer.lora_A[a].weight for a in adapters], dim=0)
    b_all = torch.cat([layer.lora_B[a].weight * layer.scaling[a] for a in adapters], dim=1)
    layer._collm_stacked_weights = (key, (a_all, b_all)) if keep else None
    return a_all, b_all


def _row_mask(layer, adapters: tuple[str, ...], adapter_names: tuple[str, ...], x: torch.Tensor) -> torch.Tensor:
    """(B, 1, .., n * r) booleans: True where a rank column belongs to the row's adapter (kept per batch layout)."""
    key = (adapters, adapter_names, x.device, x.dim())
    kept = getattr(layer, "_collm_row_mask", None)
    if kept is not None and kept[0] == key:
        return kept[1]
    rank = layer.lora_A[adapters[0]].weight.shape[0]
    slot = {a: k for k, a in enumerate(adapters)}
    owner = torch.tensor([slot.get(a, -1) for a in adapter_names], device=x.device)
    columns = torch.arange(len(adapters) * rank, device=x.device) // rank
    mask = (columns[None, :] == owner[:, None]).view(len(adapter_names), *([1] * (x.dim() - 2)), -1)
    layer._collm_row_mask = (key, mask)
    return mask


def stack_mixed_lora_batches(module: nn.Module) -> int:
    """Let every PEFT LoRA `Linear` under `module` run mixed-adapter batches as stacked matmuls (module docstring).
    Returns how many layers take part."""
    try:
        from peft.tuners.lora import Linear as LoraLinear
    except ImportError:  # pragma: no cover - PEFT is a dependency
        return 0
    count = 0
    for layer in module.modules():
        if isinstance(layer, LoraLinear) and not getattr(layer, "_collm_stacked", False):
            layer._mixed_batch_forward = types.MethodType(_stacked_mixed_batch_forward, layer)
            layer._collm_stacked = True
            count += 1
    return count
