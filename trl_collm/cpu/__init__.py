"""What running on a CPU changes, in one room: each adaptation keeps the numbers of the plain path (or says where
they differ) and is switched on from one place.

- `autocast_cache.py`: one bf16 copy of each frozen linear weight while CPU bf16 autocast is on;
- `attention.py`: attention computed in float32 under CPU bf16 autocast (torch's CPU kernels are slower in bf16);
- `kv_cache.py`: the decoding KV cache written in place (no per-step `torch.cat`), values stored in the keys' dtype
  under CPU autocast (no per-step cast of the whole cache); generation uses it on every device.

`adapt_for_cpu_bf16(module)` is the one switch for the first two: the trainers call it on every model they run under
CPU bf16 autocast. What the CPU can do is detected in `trl_collm/hardware.py`.
"""

from __future__ import annotations

from torch import nn

from .attention import use_float32_cpu_attention
from .autocast_cache import cache_frozen_linears

__all__ = ["adapt_for_cpu_bf16"]


def adapt_for_cpu_bf16(module: nn.Module) -> None:
    """Switch on, for `module` run under CPU bf16 autocast, the bf16 copies of its frozen linear weights (the same
    numbers as plain autocast, without a cast per call) and float32 attention."""
    cache_frozen_linears(module)
    use_float32_cpu_attention(module)
