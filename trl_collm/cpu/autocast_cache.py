"""Copies of a team's frozen linear weights: bf16 ones used while CPU bf16 autocast is on, and oneDNN-packed ones for
the calls that build no graph (decoding).

Why: under `torch.autocast("cpu", dtype=torch.bfloat16)` every `F.linear` casts its float32 weight to bf16 before the
matmul. Autocast caches that cast only for leaf tensors that require grad, so the frozen base of a LoRA team (and
a frozen critic base) is cast again at every call: at each decoding step all 135M base weights of SmolLM2 are read
as float32 and written as bf16 before any arithmetic. Keeping one bf16 copy per frozen weight gives the same bf16
matmul autocast would run (the same cast of the same values: results are bitwise those of plain autocast) without
the per-call cast. Outside autocast, and for weights that train, nothing changes.

The inputs too: q_proj, k_proj and v_proj (and gate_proj and up_proj, and a LoRA adapter's A beside its base layer)
read the same float32 activation, and autocast casts it to bf16 once per layer, three or four copies kept for the
backward. Here the copy is made once per activation (a one-entry memo per thread, keyed by the tensor object and its
version) and each layer reads it through its own autograd node (`_SharedCast`), so each layer's input gradient goes
back to float32 on its own, exactly as autocast's cast sends it: the same numbers, forward and backward, with one
bf16 copy of each shared input instead of three or four (SmolLM2 under bf16 autocast: 4.1 -> ~1.2 KB kept per
token and layer) and fewer casts.

And packed: where no graph is built (decoding, scoring without gradients), a frozen layer multiplies by a copy of its
weight already in oneDNN's blocked layout (`torch.ops.mkldnn._linear_pointwise`, the kernel torch's compiler uses
for frozen CPU weights), instead of `F.linear`, which reorders the weight at every call. Bitwise the same outputs
(tested at 1-2,560 rows, with and without bias). Why: a decoding step's matmuls have 16 rows and read each weight
once, cold; the reorder then costs as much as the product (one 16 x 576 x 1,536 layer, 60 distinct weights in turn,
one thread: 350 us with `F.linear`, 233 prepacked). bf16 where oneDNN runs it natively (checked once); the packed
copy costs the frozen weights' bf16 size once more.

And in float32 (no autocast: a CPU without native bf16, or `--dtype fp32`): F.linear's small-row products run at
about half the rate of large ones (SmolLM2's 30 layers at 16 rows, one thread, AMD EPYC with avx512_bf16: 45-48
GFLOP/s, the vocabulary head 34; `benchmarks/speed/bench_decode_gemm.py`), while oneDNN on a packed copy runs them
at 75. So a frozen float32 weight of at least PACK_MIN_WEIGHT elements multiplies its decoding steps (no graph, at
most PACK_MAX_ROWS rows) by a packed copy, made at its first such call: a fp32 decoding step of SmolLM2 with two
adapters 173 -> 123 CPU ms (`benchmarks/speed/bench_decode_step.py --dtype fp32`, its `unpacked` variant). The
outputs equal F.linear's up to float rounding (another order of the sums), not bitwise; the copy costs the float32
size of the decoding model's large frozen weights once more (SmolLM2: ~0.5 GB); models that never decode (a
critic) never make one.

What it buys, measured (benchmarks/speed/bench_workload.py, issue 28's CC workload, idle machine, docs/benchmarks.md):
little. A bf16 iteration costs the same with and without the copies (46.9 vs 46.5 CPU ms per generated token); the
rollout 13.9 vs 14.8 and a bare generate() 15.7 vs 17.8 in one round, so at most a small gain while sampling. (It
was added on a measurement that later proved to be float32 under both labels.) It costs a bf16 copy of the frozen
weights (half their float32 size).
"""

from __future__ import annotations

import threading
import types
import weakref

import torch
import torch.nn.functional as F
from torch import nn


class _SharedCast(torch.autograd.Function):
    """One layer's read of a shared bf16 copy of `x`: its gradient goes back to x's dtype (autocast's cast node)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cast: torch.Tensor) -> torch.Tensor:
        ctx.dtype = x.dtype
        return cast.view_as(cast)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.to(ctx.dtype), None


_memo = threading.local()  # the last input cast: (weakref to the input, its version, dtype, the cast)


def _shared_input(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x.to(dtype)` as autocast casts a linear layer's float32 input, the copy shared by the layers that read the
    same `x` one after another."""
    if x.dtype != torch.float32 or dtype == x.dtype:
        return x.to(dtype)
    last = getattr(_memo, "last", None)
    if last is not None and last[0]() is x and last[1] == x._version and last[2] == dtype:
        cast = last[3]
    else:
        cast = x.detach().to(dtype)
        _memo.last = (weakref.ref(x), x._version, dtype, cast)
    if torch.is_grad_enabled() and x.requires_grad:
        return _SharedCast.apply(x, cast)
    return cast


def _cached_linear_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    weight = self.weight
    if weight.device.type != "cpu":
        return nn.Linear.forward(self, x)
    if not torch.is_autocast_enabled("cpu"):
        if _packs_float32(self, x):
            return _packed_linear(x, _packed(self, weight, torch.float32), self.bias)
        return nn.Linear.forward(self, x)
    dtype = torch.get_autocast_dtype("cpu")
    if weight.requires_grad:  # autocast casts the weight (its own cache for a trained leaf); the input is shared
        return F.linear(_shared_input(x, dtype), weight, self.bias)
    key = (dtype, weight.data_ptr(), weight._version)  # an in-place load or a moved tensor invalidates the copy
    if getattr(self, "_autocast_copy_key", None) != key:
        self._autocast_copy = weight.detach().to(dtype)
        self._autocast_copy_key = key
    bias = None if self.bias is None else self.bias.to(dtype)
    x = _shared_input(x, dtype)
    if _packable(self, dtype) and not _builds_graph(x):
        return _packed_linear(x, _packed(self, self._autocast_copy, dtype), bias)
    return F.linear(x, self._autocast_copy, bias)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _builds_graph(x: torch.Tensor) -> bool:
    # the packed product has no backward: only calls whose input carries no gradient may use it
    return torch.is_grad_enabled() and x.requires_grad


def _packable(layer: nn.Linear, dtype: torch.dtype) -> bool:
    # ZeRO-3 gathers each weight into new memory per call: a packed copy would be rebuilt every time, so none is kept.
    return getattr(layer, "_prepack", False) and _can_prepack(dtype) and not hasattr(layer.weight, "ds_id")


def _packs_float32(layer: nn.Linear, x: torch.Tensor) -> bool:
    """A float32 call on a frozen weight that pays for oneDNN's packed layout: no graph, a decoding step's few rows,
    a weight large enough that the packed product beats oneDNN's fixed cost per call."""
    weight = layer.weight
    return (
        x.dtype == weight.dtype == torch.float32
        and not weight.requires_grad
        and not _builds_graph(x)
        and weight.numel() >= PACK_MIN_WEIGHT
        and x.numel() <= PACK_MAX_ROWS * weight.shape[1]
        and _packable(layer, torch.float32)
    )


def _packed(layer: nn.Linear, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`weight` (the layer's weight or its `dtype` copy) in oneDNN's blocked layout, made at the first call and
    again after the layer's weight changes (in place, or replaced)."""
    key = (dtype, layer.weight.data_ptr(), layer.weight._version)
    if getattr(layer, "_packed_key", None) != key:
        layer._autocast_packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        layer._packed_key = key
    return layer._autocast_packed


def _can_prepack(dtype: torch.dtype) -> bool:
    """Whether oneDNN takes prepacked weights of `dtype` here: float32 wherever oneDNN runs, bf16 on a CPU whose
    oneDNN runs it natively."""
    if not _ONEDNN_LINEAR:
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and _PREPACK_BF16)


_ONEDNN_LINEAR = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
_PREPACK_BF16 = _ONEDNN_LINEAR and torch.ops.mkldnn._is_mkldnn_bf16_supported()
# Float32 packing only where it pays (one thread, 16 rows; bench_decode_gemm.py prints the packed rates): oneDNN
# costs ~15 us a call whatever the size, so a 256 x 256 weight multiplies in 38 us packed against 32 with F.linear,
# 192 x 576 ties (61 / 59 us), 384 x 384 gains (68 / 104), SmolLM2's 1,536 x 576 MLP 367 / 671 and its 49,152-word
# vocabulary head 11.0 / 25.9 ms. Decoding steps have a few rows; calls with more (a prefill, a critic's scoring) keep
# F.linear and no model that never decodes pays for a packed copy.
PACK_MIN_WEIGHT = 131_072
PACK_MAX_ROWS = 64


def cache_frozen_linears(module: nn.Module, prepack: bool = True) -> int:
    """Let every plain `nn.Linear` under `module` keep a bf16 copy of its weight for CPU autocast while that weight
    is frozen, and (`prepack`) a oneDNN-packed copy for the calls without a graph. Returns how many layers take part
    (each costs a bf16 copy of its weight, made at its first call, and a packed one at its first call without a
    graph)."""
    count = 0
    for layer in module.modules():
        if type(layer) is nn.Linear and not getattr(layer, "_autocast_cached", False):
            layer.forward = types.MethodType(_cached_linear_forward, layer)
            layer._autocast_cached = True
            layer._prepack = prepack
            count += 1
    return count
