"""The rollout's prompt prefill, run with gradients and kept for the update (one forward of the prompt, not two).

Sampling computes every prompt token's keys and values (the prefill); PPO's update then forwards the same prompt again
with gradients, because the response's log-probs depend on the prompt's keys and values, which the LoRA adapters
change. When the update's forward sees the very weights that sampled (one epoch, one minibatch, every row in one
micro-batch: the trainers decide, `keep_prompt_graph`), the prefill's numbers are the update's numbers. So the
sampler can run the prefill with gradients, keep its keys and values (with their autograd graph) in a `PromptCache`,
decode on a detached copy, and the update forwards only the response on top of the kept cache: backward flows into
the prefill's graph as it would into the update's own prompt forward.

The cache covers each prompt but its last token: generate() must compute at least one token itself, and the update
needs the last prompt token's logits (they predict the first response token), so both forward that token again.
Each agent's prefill is its own forward (its adapter active, as in the update): one agent's backward must not run
through another's graph, which autograd would do, freeing it, if their keys lived in one tensor.

Cost: the prompt's activations are held from sampling to the update (the update's own forward would hold the same
ones, for one agent at a time). Saved: the update's forward over every prompt token (~85 % of its forward tokens in
the writing tasks; docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import prefix
from .prefix import cache_keyword, min_saved_tokens, position_ids_from_mask, supports_prefix_cache


@dataclass
class PromptCache:
    """Per-layer keys and values (B, heads, L, head_dim) of B prompts minus their last token, `mask` (B, L) their
    layout's attention mask (pads may sit anywhere; positions follow the mask), `last_ids` (B,) the prompts' last
    tokens. With gradients it backs one forward (the update's, of those rows): a second backward through the
    prefill's graph would fail (the trainers hand it out once: `TeamUpdates.prompt_cache_rows`)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    mask: torch.Tensor
    last_ids: torch.Tensor

    def __len__(self) -> int:
        return self.mask.shape[0]

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    def rows(self, index: torch.Tensor) -> PromptCache:
        index = index.to(self.mask.device)
        return PromptCache(
            [k.index_select(0, index) for k in self.keys],
            [v.index_select(0, index) for v in self.values],
            self.mask.index_select(0, index),
            self.last_ids.index_select(0, index),
        )

    def left_padded(self, length: int) -> PromptCache:
        """The same cache with masked columns in front, `length` columns in all."""
        pad = length - self.length
        if pad == 0:
            return self
        return PromptCache(
            [F.pad(k, (0, 0, pad, 0)) for k in self.keys],
            [F.pad(v, (0, 0, pad, 0)) for v in self.values],
            F.pad(self.mask, (pad, 0)),
            self.last_ids,
        )

    @staticmethod
    def cat(parts: list[PromptCache]) -> PromptCache:
        """The rows of `parts` one after the other (left-padded to the longest)."""
        if len(parts) == 1:
            return parts[0]
        length = max(p.length for p in parts)
        parts = [p.left_padded(length) for p in parts]
        return PromptCache(
            [torch.cat(ks, 0) for ks in zip(*(p.keys for p in parts))],
            [torch.cat(vs, 0) for vs in zip(*(p.values for p in parts))],
            torch.cat([p.mask for p in parts], 0),
            torch.cat([p.last_ids for p in parts], 0),
        )

    def detached(self) -> PromptCache:
        return PromptCache([k.detach() for k in self.keys], [v.detach() for v in self.values], self.mask, self.last_ids)

    def dynamic_cache(self):
        """A fresh transformers DynamicCache holding these keys and values (a forward appends to its own copy)."""
        from transformers import DynamicCache

        cache = DynamicCache()
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            cache.update(k, v, i)
        return cache


def prefill(model, ids: torch.Tensor, mask: torch.Tensor, share_prefix: bool = True) -> PromptCache | None:
    """Run `model` (its adapter active) over each left-padded prompt but its last token, with gradients, computing
    what rows share once when that pays (prefix.py's cuts). None when the model cannot run on a cache with
    gradients (`supports_prefix_cache`) or returns no layered KV cache."""
    if ids.shape[1] < 2 or not supports_prefix_cache(model):
        return None
    body_ids, body_mask = ids[:, :-1], mask[:, :-1]
    split = None
    if share_prefix:
        split = prefix.plan_split(body_ids, body_mask, 1, min_saved=min_saved_tokens(model))
    with torch.enable_grad():
        head = prefix.head_cache(model, split, causal_lm=True) if split is not None else None
        if split is not None and head is None:
            return None  # the model returns no layered KV cache
        inputs = prefix.split_inputs(model, body_ids, body_mask, split, head, use_cache=True)
        cache = prefix.layered_cache(model(**inputs, logits_to_keep=1))
    if cache is None:
        return None
    keys = [layer.keys for layer in cache.layers]
    values = [layer.values for layer in cache.layers]
    return PromptCache(keys, values, inputs["attention_mask"].long(), ids[:, -1].clone())


def response_logits(model, cache: PromptCache, response_ids: torch.Tensor, response_mask: torch.Tensor):
    """Logits (B, Lr, vocab) predicting each response token, from the kept prompt cache: the last prompt token and
    the response but its last token are forwarded on top of it (what `forward_last` over prompt + response gives,
    up to float rounding)."""
    lr = response_ids.shape[1]
    ids = torch.cat([cache.last_ids[:, None], response_ids[:, :-1]], dim=1)
    ones = torch.ones_like(cache.last_ids)[:, None]
    full_mask = torch.cat([cache.mask, ones, response_mask[:, :-1].long()], dim=1)
    out = model(
        input_ids=ids,
        attention_mask=full_mask,
        position_ids=position_ids_from_mask(full_mask)[:, -lr:],
        use_cache=True,
        logits_to_keep=lr,
        **{cache_keyword(model): cache.dynamic_cache()},
    )
    return out.logits
