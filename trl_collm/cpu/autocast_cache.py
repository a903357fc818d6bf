"""bf16 copies of a team's frozen linear weights, used while CPU bf16 autocast is on.

Why: under `torch.autocast("cpu", dtype=torch.bfloat16)` every `F.linear` casts its float32 weight to bf16 before the
matmul. Autocast caches that cast only for leaf tensors that require grad, so the frozen base of a LoRA team (and
a frozen critic base) is cast again at every call: at each decoding step all 135M base weights of SmolLM2 are read
as float32 and written as bf16 before any arithmetic. Keeping one bf16 copy per frozen weight gives the same bf16
matmul autocast would run (the same cast of the same values: results are bitwise those of plain autocast) without
the per-call cast. Outside autocast, and for weights that train, nothing changes.

What it buys, measured (benchmarks/speed/bench_workload.py, issue 28's CC workload, idle machine, docs/benchmarks.md):
little. A bf16 iteration costs the same with and without the copies (46.9 vs 46.5 CPU ms per generated token); the
rollout 13.9 vs 14.8 and a bare generate() 15.7 vs 17.8 in one round, so at most a small gain while sampling. (It
was added on a measurement that later proved to be float32 under both labels.) It costs a bf16 copy of the frozen
weights (half their float32 size).
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn


def _cached_linear_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    weight = self.weight
    if weight.requires_grad or not torch.is_autocast_enabled("cpu") or weight.device.type != "cpu":
        return nn.Linear.forward(self, x)
    dtype = torch.get_autocast_dtype("cpu")
    key = (dtype, weight.data_ptr(), weight._version)  # an in-place load or a moved tensor invalidates the copy
    if getattr(self, "_autocast_copy_key", None) != key:
        self._autocast_copy = weight.detach().to(dtype)
        self._autocast_copy_key = key
    bias = None if self.bias is None else self.bias.to(dtype)
    return F.linear(x.to(dtype), self._autocast_copy, bias)


def cache_frozen_linears(module: nn.Module) -> int:
    """Let every plain `nn.Linear` under `module` keep a bf16 copy of its weight for CPU autocast while that weight
    is frozen. Returns how many layers take part (each costs a bf16 copy of its weight, made at its first call)."""
    count = 0
    for layer in module.modules():
        if type(layer) is nn.Linear and not getattr(layer, "_autocast_cached", False):
            layer.forward = types.MethodType(_cached_linear_forward, layer)
            layer._autocast_cached = True
            count += 1
    return count
