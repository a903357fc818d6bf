"""What running on a CPU changes, in one room: each adaptation keeps the numbers of the plain path (or says where
they differ) and is switched on from one place.

- `autocast_cache.py`: one bf16 copy of each frozen linear weight while CPU bf16 autocast is on;
- `attention.py`: attention computed in float32 under CPU bf16 autocast (torch's CPU kernels are slower in bf16);
- `lora_mixed.py`: a team's mixed-adapter batch (how all agents decode in one batch) as two stacked matmuls per
  LoRA layer instead of PEFT's adapter-by-adapter gathers;
- `kv_cache.py`: the decoding KV cache written in place (no per-step `torch.cat`), values stored in the keys' dtype
  under CPU autocast (no per-step cast of the whole cache); generation uses it on every device.

`adapt_for_cpu(module, bf16)` is the one switch for the first three: the trainers call it on every model they run on
a CPU (the first two only under bf16 autocast). What the CPU can do is detected in `trl_collm/hardware.py`.
"""

from __future__ import annotations

from torch import nn

from .attention import use_float32_cpu_attention
from .autocast_cache import cache_frozen_linears
from .lora_mixed import stack_mixed_lora_batches

__all__ = ["adapt_for_cpu"]


def adapt_for_cpu(module: nn.Module, bf16: bool) -> None:
    """Switch on the CPU adaptations for `module`: mixed-adapter LoRA batches as stacked matmuls (the same outputs
    up to float rounding) and, when it runs under CPU bf16 autocast (`bf16`), the bf16 copies of its frozen linear
    weights (the same numbers as plain autocast, without a cast per call) and float32 attention."""
    stack_mixed_lora_batches(module)
    if bf16:
        cache_frozen_linears(module)
        use_float32_cpu_attention(module)
