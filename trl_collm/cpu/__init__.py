"""What running on a CPU changes, in one room: each adaptation keeps the numbers of the plain path (or says where
they differ) and is switched on from one place.

- `autocast_cache.py`: one bf16 copy of each frozen linear weight while CPU bf16 autocast is on (and a oneDNN-packed
  one for the calls without a graph: decoding), one bf16 copy of each float32 input that several linear layers read
  (q / k / v, gate / up, a LoRA A beside its base), and in float32 a oneDNN-packed copy of each large frozen weight
  for decoding steps (the same outputs up to float rounding);
- `attention.py`: attention computed in float32 under CPU bf16 autocast (torch's CPU kernels are slower in bf16),
  grouped query heads given to the kernel instead of copied keys and values;
- `mlp.py`: the gated SiLU MLP keeping one activation less for its backward (the same numbers);
- `lora_mixed.py`: a team's mixed-adapter batch (how all agents decode in one batch) as two stacked matmuls per
  LoRA layer instead of PEFT's adapter-by-adapter gathers;
- `kv_cache.py`: the decoding KV cache written in place (no per-step `torch.cat`), values stored in the keys' dtype
  under CPU autocast (no per-step cast of the whole cache); generation uses it on every device.

`adapt_for_cpu(module)` is the one switch for all but the KV cache: the trainers call it on every model they run on
a CPU (the bf16 weight copies are made only under bf16 autocast, the packed ones at a layer's first call that uses
them). What the CPU can do is detected in
`trl_collm/hardware.py`.
"""

from __future__ import annotations

from torch import nn

from .attention import use_cpu_attention
from .autocast_cache import cache_frozen_linears
from .lora_mixed import stack_mixed_lora_batches
from .mlp import use_lean_mlp

__all__ = ["adapt_for_cpu"]


def adapt_for_cpu(module: nn.Module) -> None:
    """Switch on the CPU adaptations for `module`: mixed-adapter LoRA batches as stacked matmuls (the same outputs
    up to float rounding), grouped-query attention without key / value copies (float32 under bf16 autocast; the
    same outputs, key / value gradients up to float rounding), the lean MLP (the same numbers) and the frozen linear
    weights' copies: bf16 under CPU bf16 autocast (the same numbers as plain autocast, without a cast per call),
    oneDNN-packed for decoding (bf16 bitwise the same, float32 up to float rounding)."""
    stack_mixed_lora_batches(module)
    use_cpu_attention(module)
    use_lean_mlp(module)
    cache_frozen_linears(module)
