"""Shared-prefix forward: the prompt tokens every row of a batch has in common are computed once.

Rows of a rollout batch often start with the same tokens: the G samples of one prompt (MC), or a task's fixed
instructions in front of each episode's details (every task here). A plain forward computes those tokens B times.
Here the batch is re-laid out as ``[common prefix][each row's rest, left-padded]``: the prefix runs once (batch 1,
with gradients), its keys and values are broadcast to the B rows as a KV cache, and the rest runs on top of it.
Backward sums the rows' gradients into the one prefix computation, so values, log-probs and gradients equal the plain
forward's up to float rounding (tests compare both).

Positions follow `position_ids_from_mask`: a row's real tokens are numbered from its first real token in both
layouts, and the pads moved between prefix and rest are masked out, so every real token sees the same keys at the
same positions as before.

Only the caller's last `keep` positions are returned (the response's logits, the value at the end of a view), which
the rest always covers. When the layout gains little (a short prefix, one row) or the model cannot take a cache
with gradients (gradient checkpointing recomputes layers and would grow the cache twice; sliding-window or
recurrent layers; attention kernels that assume left padding), the plain forward runs instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# A prefix shorter than this saves less than the second model call costs (measured on the tiny CPU models).
MIN_PREFIX_TOKENS = 16
_ATTENTION_OK = ("sdpa", "eager")


@dataclass
class PrefixSplit:
    prefix_ids: torch.Tensor  # (1, P)
    rest_ids: torch.Tensor  # (B, S): each row's tokens after the prefix, left-padded, right end aligned
    rest_mask: torch.Tensor  # (B, S)
    attention_mask: torch.Tensor  # (B, P + S): ones over the prefix, then rest_mask
    rest_positions: torch.Tensor  # (B, S)


def split_common_prefix(ids: torch.Tensor, mask: torch.Tensor, keep: int, min_prefix: int = MIN_PREFIX_TOKENS):
    """The split of a left-padded batch at its longest common prefix of real tokens, or None if it is not worth it.

    `keep` positions at the right end must stay in the rest (they are what the caller reads).
    """
    batch, length = ids.shape
    if batch < 2:
        return None
    mask = mask.long()
    first = mask.argmax(dim=1)  # first real token of each row (left padding)
    start = int(first.max())  # columns before `start` are padding in at least one row
    width = length - start - keep  # longest prefix that leaves every row `keep` positions of rest
    if width < min_prefix:
        return None
    # Align every row at its first real token, then compare the first `width` tokens with row 0's.
    cols = first[:, None] + torch.arange(width, device=ids.device)[None, :]
    aligned = ids.gather(1, cols)
    real = mask.gather(1, cols).bool()
    same = (aligned == aligned[:1]) & real
    mismatch = (~same.all(dim=0)).nonzero()
    p = int(mismatch[0]) if len(mismatch) else width
    if p < min_prefix:
        return None
    # Rest of row i: columns first_i + p .. L-1; left-pad all to the longest (the row that started earliest).
    rest_len = length - int(first.min()) - p
    offset = length - rest_len  # column of the rest's first position in the original layout
    src = torch.arange(rest_len, device=ids.device)[None, :] + offset  # (1, S) original columns, right-aligned
    rest_start = first[:, None] + p  # (B, 1): where each row's rest starts
    in_rest = src >= rest_start
    rest_ids = torch.where(in_rest, ids[:, offset:], torch.zeros_like(ids[:, offset:]))
    rest_mask = torch.where(in_rest, mask[:, offset:], torch.zeros_like(mask[:, offset:]))
    attention_mask = torch.cat([torch.ones(batch, p, dtype=mask.dtype, device=mask.device), rest_mask], dim=1)
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, p:]
    return PrefixSplit(aligned[:1, :p], rest_ids, rest_mask, attention_mask, positions)


def supports_prefix_cache(model: nn.Module) -> bool:
    """Whether `model` (a CausalLM or a bare backbone, possibly PEFT-wrapped) can run the rest on a grad-carrying cache."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    if getattr(model, "is_activation_checkpointing", False):
        return False
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if getattr(text, "is_encoder_decoder", False):
        return False
    if getattr(text, "use_sliding_window", False) or any(t != "full_attention" for t in (getattr(text, "layer_types", None) or [])):
        return False
    if getattr(text, "_attn_implementation", "eager") not in _ATTENTION_OK:
        return False
    return True


def _cache_keyword(model: nn.Module) -> str:
    """transformers 5.24 renamed the forward's `past_key_values` to `cache` (5.23 knows only the old name)."""
    import inspect

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        params = inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - exotic wrappers
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _broadcast_cache(cache, batch: int) -> None:
    """The prefix's keys/values (batch 1) as views over `batch` rows; the rest's keys are appended by torch.cat."""
    for layer in getattr(cache, "layers", []):
        layer.keys = layer.keys.expand(batch, *layer.keys.shape[1:])
        layer.values = layer.values.expand(batch, *layer.values.shape[1:])


def forward_last(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, keep: int, causal_lm: bool,
                 min_prefix: int = MIN_PREFIX_TOKENS, enabled: bool = True):
    """Logits (causal_lm) or last hidden states of the last `keep` positions of a left-padded batch, (B, keep, ...).

    The same numbers as one plain forward over (ids, mask), computing the rows' common prefix once when that helps.
    """
    from .team import position_ids_from_mask

    split = split_common_prefix(ids, mask, keep, min_prefix) if enabled and supports_prefix_cache(model) else None
    if split is None:
        kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=False)
        if causal_lm:
            return model(**kwargs, logits_to_keep=keep).logits
        return model(**kwargs).last_hidden_state[:, -keep:]
    p = split.prefix_ids.shape[1]
    head = model(
        input_ids=split.prefix_ids,
        position_ids=torch.arange(p, device=ids.device)[None, :],
        use_cache=True,
        **({"logits_to_keep": 1} if causal_lm else {}),
    )
    cache = getattr(head, "cache", None)
    if cache is None:
        cache = head.past_key_values
    _broadcast_cache(cache, ids.shape[0])
    kwargs = {
        "input_ids": split.rest_ids,
        "attention_mask": split.attention_mask,
        "position_ids": split.rest_positions,
        _cache_keyword(model): cache,
        "use_cache": True,
    }
    if causal_lm:
        return model(**kwargs, logits_to_keep=keep).logits
    return model(**kwargs).last_hidden_state[:, -keep:]


@torch.no_grad()
def generate_with_prefix(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, gen_kwargs: dict,
                         min_prefix: int = MIN_PREFIX_TOKENS, enabled: bool = True) -> torch.Tensor:
    """`model.generate` on a left-padded batch, prefilling the rows' common prefix once.

    Returns what `generate(input_ids=ids, attention_mask=mask)` returns: the prompt columns of `ids` followed by the
    new tokens. generate() reads a cache it is given as covering the first columns of every row, which the
    ``[prefix][rest]`` layout satisfies; it numbers positions from the attention mask, as the plain call does.
    """
    split = split_common_prefix(ids, mask, 1, min_prefix) if enabled and supports_prefix_cache(model) else None
    if split is None:
        return model.generate(input_ids=ids, attention_mask=mask, **gen_kwargs)
    batch, p = ids.shape[0], split.prefix_ids.shape[1]
    head = model(input_ids=split.prefix_ids, position_ids=torch.arange(p, device=ids.device)[None, :], use_cache=True,
                 logits_to_keep=1)
    cache = getattr(head, "cache", None)
    if cache is None:
        cache = head.past_key_values
    _broadcast_cache(cache, batch)
    laid_out = torch.cat([split.prefix_ids.expand(batch, p), split.rest_ids], dim=1)
    out = model.generate(input_ids=laid_out, attention_mask=split.attention_mask, **{_cache_keyword(model): cache}, **gen_kwargs)
    return torch.cat([ids, out[:, laid_out.shape[1]:]], dim=1)
