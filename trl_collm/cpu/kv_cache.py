"""A decoding KV cache that is written in place instead of grown by concatenation.

Why: transformers' `DynamicCache` appends each step's keys and values with `torch.cat`, which copies the whole cache
of every layer at every decoding step (SmolLM2, 16 rows, 300-token prompts: 60 tensors of 16 x 3 x 300 x 64 a step,
the rollout's `aten::cat` at 13 % of its CPU time on an AMD EPYC with avx512_bf16). This cache reserves room for the
prompt and every new token once and writes each step's keys and values into it; a layer hands attention a view of
the columns written so far.

Under CPU bf16 autocast the rotary embedding leaves keys in float32 while values come out of their projection in
bf16, and the float32 CPU attention (`cpu/attention.py`) then cast the whole value cache to float32 at every step
(~2 ms a layer and step in the same rollout). Here values are stored in the keys' dtype when the two differ on a
CPU: the cast happens once per token, and it is exact (bf16 -> float32), so attention sees the same numbers.

Decoding only: the writes are in place, so no gradient may flow through this cache (the kept prompt prefill of
`team/prompt_cache.py` and the update's forwards keep transformers' `DynamicCache`). Everything a forward reads
(`get_seq_length`, mask sizes, the keys and values) is what `DynamicCache` would return, so generate() numbers
positions and masks as before.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer


class ReservedLayer(DynamicLayer):
    """One layer's keys and values in a buffer with room for `reserve` more columns than the first update brings;
    it grows (doubling) only if a caller writes past that."""

    def __init__(self, reserve: int = 0):
        super().__init__()
        self.reserve = int(reserve)
        self.length = 0
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, need: int) -> None:
        capacity = max(need + self.reserve, 2 * (self._keys.shape[-2] if self._keys is not None else 0))
        shape_k = (*key_states.shape[:-2], capacity, key_states.shape[-1])
        shape_v = (*value_states.shape[:-2], capacity, value_states.shape[-1])
        keys = key_states.new_empty(shape_k)
        values = value_states.new_empty(shape_v, dtype=self._value_dtype(key_states, value_states))
        if self.length:
            keys[..., : self.length, :] = self._keys[..., : self.length, :]
            values[..., : self.length, :] = self._values[..., : self.length, :]
        self._keys, self._values = keys, values

    @staticmethod
    def _value_dtype(key_states: torch.Tensor, value_states: torch.Tensor) -> torch.dtype:
        # bf16 values beside float32 keys (CPU autocast): stored as float32, what the float32 CPU attention reads.
        if key_states.device.type == "cpu" and key_states.dtype == torch.float32 != value_states.dtype:
            return key_states.dtype
        return value_states.dtype

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        if self._keys is None or self.length + new > self._keys.shape[-2]:
            self._grow(key_states, value_states, self.length + new)
        self._keys[..., self.length : self.length + new, :] = key_states
        self._values[..., self.length : self.length + new, :] = value_states
        self.length += new
        return self.keys, self.values

    # `keys` / `values`: the columns written so far (what DynamicLayer holds), as views of the buffers.
    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._keys[..., : self.length, :]

    @keys.setter
    def keys(self, value) -> None:  # DynamicLayer.__init__ / reset assign; a tensor replaces the buffer
        self._keys, self.length = value, (0 if value is None else value.shape[-2])

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._values[..., : self.length, :]

    @values.setter
    def values(self, value) -> None:
        self._values = value

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop({tokens_to_remove}): pass the number of columns to remove as a negative number")
        self.length = max(0, self.length + tokens_to_remove)

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("ReservedLayer is a sampling cache; beam search keeps transformers' DynamicCache")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("ReservedLayer is a sampling cache; beam search keeps transformers' DynamicCache")


class DecodeCache(DynamicCache):
    """A `DynamicCache` whose layers are `ReservedLayer`s with room for `reserve` new tokens (a sampler passes
    `max_new_tokens`); `keys` / `values` (one tensor per layer) start it from a prefilled prompt."""

    def __init__(self, reserve: int, keys: list[torch.Tensor] | None = None, values: list[torch.Tensor] | None = None):
        Cache.__init__(self, layers=[])  # layers are added as the model's layers write (as DynamicCache does)
        self.reserve = int(reserve)
        for i, (k, v) in enumerate(zip(keys or (), values or ())):
            self.update(k.detach(), v.detach(), i)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        while len(self.layers) <= layer_idx:
            self.layers.append(ReservedLayer(self.reserve))
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    @classmethod
    def from_cache(cls, cache, reserve: int) -> DecodeCache:
        """The same keys and values as `cache` (a layered transformers cache), in a cache with room for `reserve`."""
        return cls(reserve, [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers])
