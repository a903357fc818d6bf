"""The gated MLP of Llama-style models (`down(silu(gate(x)) * up(x))`) keeping three activations for the backward
instead of four.

Why: autograd keeps `gate(x)` for the SiLU's backward, `silu(gate(x))` and `up(x)` for the product's, and the product
for `down`: four tensors of the intermediate width per token and layer, the largest share of what a training
forward keeps (SmolLM2 under bf16 autocast: 11.3 of 31 KB per token and layer, `benchmarks/speed/bench_memory.py
--saved`). The SiLU's output is cheap to recompute from `gate(x)`, so the backward recomputes it: a quarter less of
that share, and exactly the same numbers (the backward runs the same operations autograd would, in the same order).

`use_lean_mlp(module)` switches every such MLP under `module` whose activation is SiLU; `adapt_for_cpu` calls it for
the models the trainers run on a CPU.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn


class SiluMul(torch.autograd.Function):
    """`silu(gate) * up`, saving `gate` and `up` only."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        # What autograd runs for `silu(gate) * up`: the product's backward (grad x the other factor), then SiLU's.
        grad_up = grad * F.silu(gate) if ctx.needs_input_grad[1] else None
        grad_gate = torch.ops.aten.silu_backward(grad * up, gate) if ctx.needs_input_grad[0] else None
        return grad_gate, grad_up


def _lean_forward(self, x: torch.Tensor) -> torch.Tensor:
    gate, up = self.gate_proj(x), self.up_proj(x)
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return self.down_proj(SiluMul.apply(gate, up))
    return self.down_proj(F.silu(gate) * up)  # nothing is kept without a graph


def use_lean_mlp(module: nn.Module) -> int:
    """Let every gated SiLU MLP under `module` (a `gate_proj`, `up_proj` and `down_proj`, `act_fn` SiLU, the
    forward `down(act(gate(x)) * up(x))` of Llama, Qwen2, Mistral and their kin) keep one activation less for its
    backward. Returns how many were switched."""
    count = 0
    for m in module.modules():
        if getattr(m, "_lean_mlp", False) or not all(hasattr(m, n) for n in ("gate_proj", "up_proj", "down_proj")):
            continue
        if not _is_silu(getattr(m, "act_fn", None)) or type(m).__name__ not in _GATED_SILU_MLPS:
            continue
        m.forward = types.MethodType(_lean_forward, m)
        m._lean_mlp = True
        count += 1
    return count


# The classes whose forward is exactly `down_proj(act_fn(gate_proj(x)) * up_proj(x))` (transformers 4.5x-5.x); a
# class with another forward (dropout, a bias term, a different product) is left alone.
_GATED_SILU_MLPS = {"LlamaMLP", "Qwen2MLP", "Qwen3MLP", "MistralMLP"}


def _is_silu(act) -> bool:
    """torch's SiLU module or transformers' (`SiLUActivation`, which a kernel from the Hub may replace: then its
    forward is not plain `F.silu` and the MLP is left alone)."""
    if isinstance(act, nn.SiLU):
        return True
    return type(act).__name__ == "SiLUActivation" and getattr(type(act).forward, "__module__", "").startswith(
        "transformers.activations"
    )
