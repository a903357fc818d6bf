"""Shared-prefix forward: the prompt tokens every row of a batch has in common are computed once.

Rows of a rollout batch often start with the same tokens: a task's fixed instructions in front of each episode's
details (every task here), or the G samples of one prompt (MC). A plain forward computes those tokens B times. Two
cuts avoid that, and the one that saves more tokens is taken:

- common prefix: the batch is re-laid out as ``[common prefix][each row's rest, left-padded]``; the prefix runs once
  (batch 1) and its keys and values are broadcast to the B rows;
- repeated rows: rows whose columns before the caller's tail are identical (the G copies of a prompt) run those
  columns once per distinct row, and each copy reads its original's keys and values.

Either way the head runs with gradients and the rest runs on top of its KV cache. Backward sums the rows' gradients
into the one head computation, so values, log-probs and gradients equal the plain forward's up to float rounding
(tests compare both).

Positions follow `position_ids_from_mask`: a row's real tokens are numbered from its first real token in every
layout, and the pads moved between prefix and rest are masked out, so every real token sees the same keys at the
same positions as before.

Only the caller's last `keep` positions are returned (the response's logits, the value at the end of a view), which
the rest always covers. When a cut does not pay or the model cannot take a cache with gradients (activation
checkpointing recomputes layers and would grow the cache twice; sliding-window or recurrent layers; attention kernels
that assume left padding), the plain forward runs instead.

Whether a cut pays is an expected-cost decision, not a token count: the cut saves `saved_tokens` prompt tokens but
costs a second model call (the head) and the copies of its keys and values. `min_saved_tokens(model)` is the saving
that pays for that call, from a cost model calibrated on CPU by `benchmarks/speed/bench_prefix_cut.py`: on the tiny test
models (a 9k-parameter layer) a call costs as much as ~600 tokens, so short prompts run plain; on a 0.7M-parameter
layer ~80 tokens; on 0.5B-class models a few tokens. A common prefix also needs MIN_PREFIX_TOKENS tokens per row.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass

import torch
from torch import nn

from ..cpu.attention import NAME as FLOAT32_CPU_SDPA
from ..cpu.kv_cache import DecodeCache
from .modeling import base_model_of

# A common prefix must be at least this long per row to be considered at all.
MIN_PREFIX_TOKENS = 16
# The expected-cost model (benchmarks/speed/bench_prefix_cut.py; fit on CPU to the break-even points of two runs,
# forward + backward, 2026-11-30: tiny between 378 and 1530 saved tokens, small between 66 and 90): the cut's extra
# model call costs as much as CALL_COST_TOKENS tokens through a layer without weights, and one token through a layer
# with p parameters costs (1 + p / LAYER_PARAMS_SCALE) of those. The cut pays when the tokens it saves cost more than
# the call: saved * (1 + p / LAYER_PARAMS_SCALE) > CALL_COST_TOKENS (per layer on both sides).
CALL_COST_TOKENS = 650
LAYER_PARAMS_SCALE = 105_000
_ATTENTION_OK = ("sdpa", "eager", FLOAT32_CPU_SDPA)


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    # Left padding shifts real tokens right; generate() numbers positions from the first real token, so the
    # training forward must do the same or the log-probs of the rollout and of the update would disagree.
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass
class SharedSplit:
    """A batch cut into a head computed once per distinct head and a rest computed per row.

    The head's keys/values become the rest's KV cache: row i reads head row `index[i]` (None: the single head row,
    broadcast). `layout_ids` / `attention_mask` are the whole batch as the rest sees it (head columns first).
    """

    head_ids: torch.Tensor  # (U, H)
    head_mask: torch.Tensor | None  # (U, H); None: all real tokens
    head_positions: torch.Tensor  # (U, H)
    index: torch.Tensor | None  # (B,) head row of each batch row; None: U == 1
    rest_ids: torch.Tensor  # (B, S): right end aligned with the original batch
    attention_mask: torch.Tensor  # (B, H + S)
    rest_positions: torch.Tensor  # (B, S)
    saved_tokens: int  # real tokens the plain forward would compute and this one does not
    head_keys: torch.Tensor | None = None  # (U,) the row key (e.g. LoRA adapter) each head row runs with

    @property
    def layout_ids(self) -> torch.Tensor:
        head = self.head_ids.expand(self.rest_ids.shape[0], -1) if self.index is None else self.head_ids[self.index]
        return torch.cat([head, self.rest_ids], dim=1)


def split_common_prefix(
    ids: torch.Tensor,
    mask: torch.Tensor,
    keep: int,
    min_prefix: int = MIN_PREFIX_TOKENS,
    row_keys: torch.Tensor | None = None,
):
    """Cut a left-padded batch at its rows' longest common prefix of real tokens, or None if it is not worth it.

    The batch is re-laid out as ``[prefix][each row's rest, left-padded]``. `keep` positions at the right end must
    stay in the rest (they are what the caller reads). With `row_keys` (B,) the rows of each key (the LoRA adapter
    a row runs with) have their own prefix, one head row per key: a team's agents each read their own instructions
    in front of the same episode, so the prefix all rows share ends where the agents' instructions part, while each
    agent's rows share its whole instructions. The cut is the shortest of the keys' common prefixes (one head width).
    """
    batch, length = ids.shape
    if batch < 2:
        return None
    mask = mask.long()
    first = mask.argmax(dim=1)  # first real token of each row (left padding)
    width = length - int(first.max()) - keep  # longest prefix that leaves every row `keep` positions of rest
    if width < min_prefix:
        return None
    if row_keys is None:
        keys, index = None, torch.zeros(batch, dtype=torch.long, device=ids.device)
    else:
        keys, index = torch.unique(row_keys, return_inverse=True)
        if len(keys) == batch:
            return None  # every row its own key: nothing to share
    # the first row of each key: the one its rows are compared with, and the key's head row
    leaders = torch.stack([(index == k).nonzero()[0, 0] for k in range(int(index.max()) + 1)])
    # Align every row at its first real token, then compare the first `width` tokens with its key's leader's.
    cols = first[:, None] + torch.arange(width, device=ids.device)[None, :]
    aligned = ids.gather(1, cols)
    real = mask.gather(1, cols).bool()
    same = (aligned == aligned[leaders[index]]) & real
    mismatch = (~same.all(dim=0)).nonzero()
    p = int(mismatch[0]) if len(mismatch) else width
    if p < min_prefix:
        return None
    # Rest of row i: columns first_i + p .. L-1; left-pad all to the longest (the row that started earliest).
    rest_len = length - int(first.min()) - p
    offset = length - rest_len  # column of the rest's first position in the original layout
    src = torch.arange(rest_len, device=ids.device)[None, :] + offset  # (1, S) original columns, right-aligned
    in_rest = src >= first[:, None] + p
    rest_ids = torch.where(in_rest, ids[:, offset:], torch.zeros_like(ids[:, offset:]))
    rest_mask = torch.where(in_rest, mask[:, offset:], torch.zeros_like(mask[:, offset:]))
    attention_mask = torch.cat([torch.ones(batch, p, dtype=mask.dtype, device=mask.device), rest_mask], dim=1)
    positions = position_ids_from_mask(attention_mask)
    return SharedSplit(
        aligned[leaders, :p],
        None,
        positions[leaders, :p],
        None if keys is None else index,
        rest_ids,
        attention_mask,
        positions[:, p:],
        saved_tokens=(batch - len(leaders)) * p,
        head_keys=keys,
    )


def split_repeated_rows(
    ids: torch.Tensor,
    mask: torch.Tensor,
    keep: int,
    min_prefix: int = MIN_PREFIX_TOKENS,
    row_keys: torch.Tensor | None = None,
):
    """Cut a left-padded batch before its last `keep` columns when rows repeat there (the G samples of one prompt).

    The distinct heads (and keys) run once each; every row reads its head's cache. No re-layout: the columns stay
    as they are.
    """
    batch, length = ids.shape
    cut = length - keep
    if batch < 2 or cut < 1:
        return None
    parts = [ids[:, :cut], mask[:, :cut].to(ids.dtype)]
    if row_keys is not None:
        parts.append(row_keys.to(ids.dtype)[:, None])
    distinct, index = torch.unique(torch.cat(parts, dim=1), dim=0, return_inverse=True)
    if len(distinct) == batch:
        return None
    head_keys = distinct[:, -1] if row_keys is not None else None
    head_mask = distinct[:, cut : 2 * cut].to(mask.dtype)
    saved = int(mask[:, :cut].sum()) - int(head_mask.sum())
    if saved < min_prefix:
        return None
    return SharedSplit(
        distinct[:, :cut],
        head_mask,
        position_ids_from_mask(head_mask),
        index,
        ids[:, cut:],
        mask,
        position_ids_from_mask(mask)[:, cut:],
        saved_tokens=saved,
        head_keys=head_keys,
    )


def plan_split(
    ids: torch.Tensor,
    mask: torch.Tensor,
    keep: int,
    min_prefix: int = MIN_PREFIX_TOKENS,
    row_keys: torch.Tensor | None = None,
    min_saved: int = 0,
):
    """The cut that saves more tokens (common prefix or repeated rows), or None when neither saves `min_prefix`
    tokens, or `min_saved` (what the cut must save to pay for its extra model call: `min_saved_tokens(model)`).

    `row_keys` (B,) integers: rows with different keys never share a head (the LoRA adapter each row runs with).
    """
    common = split_common_prefix(ids, mask, keep, min_prefix, row_keys)
    options = [s for s in (common, split_repeated_rows(ids, mask, keep, min_prefix, row_keys)) if s is not None]
    best = max(options, key=lambda s: s.saved_tokens) if options else None
    return best if best is not None and best.saved_tokens >= min_saved else None


def layer_parameters(model: nn.Module) -> int:
    """Weights of one decoder layer, from the model's config (attention projections + gated MLP)."""
    config = getattr(model, "config", None)
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    hidden = int(getattr(text, "hidden_size", 0) or 0)
    if not hidden:
        return 0
    heads = int(getattr(text, "num_attention_heads", 1) or 1)
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    kv = int(getattr(text, "num_key_value_heads", None) or heads) * head_dim
    inner = int(getattr(text, "intermediate_size", None) or 4 * hidden)
    return 2 * hidden * heads * head_dim + 2 * hidden * kv + 3 * hidden * inner


def min_saved_tokens(model: nn.Module) -> int:
    """Prompt tokens a cut must save to pay for its extra model call (the expected-cost model above)."""
    return math.ceil(CALL_COST_TOKENS / (1 + layer_parameters(model) / LAYER_PARAMS_SCALE))


def supports_prefix_cache(model: nn.Module) -> bool:
    """Whether `model` (a CausalLM or a bare backbone, possibly PEFT-wrapped) can run the rest on a
    grad-carrying cache."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    if getattr(model, "is_activation_checkpointing", False):
        return False
    return full_attention_decoder(model)


def full_attention_decoder(model: nn.Module) -> bool:
    """Whether `model` is a decoder whose every layer attends to all earlier tokens through an attention kernel
    that reads a layered KV cache as given (no sliding window, no recurrent layer): what the prefix cuts and the
    in-place decoding cache (`cpu/kv_cache.py`) need."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if getattr(text, "is_encoder_decoder", False):
        return False
    if getattr(text, "use_sliding_window", False) or any(
        t != "full_attention" for t in (getattr(text, "layer_types", None) or [])
    ):
        return False
    if getattr(text, "_attn_implementation", "eager") not in _ATTENTION_OK:
        return False
    return True


def cache_keyword(model: nn.Module) -> str:
    """transformers 5.24 renamed the forward's `past_key_values` to `cache` (5.23 knows only the old name)."""
    return cache_keyword_of(type(base_model_of(model)))


@functools.cache
def cache_keyword_of(model_class: type) -> str:
    try:
        params = inspect.signature(model_class.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - exotic wrappers
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def layered_cache(output):
    """The KV cache a forward returned (`cache`; `past_key_values` before transformers 5.24), or None when it
    returned none with layers."""
    cache = getattr(output, "cache", None)
    if cache is None:
        cache = getattr(output, "past_key_values", None)
    return cache if cache is not None and getattr(cache, "layers", None) else None


def split_inputs(model: nn.Module, ids, mask, split: SharedSplit | None, head, use_cache: bool) -> dict:
    """The model inputs for a left-padded batch: the plain forward's (no `head`), or the rest of `split` on its
    head's cache `head` (`head_cache`)."""
    if head is None:
        return dict(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=use_cache)
    return {
        "input_ids": split.rest_ids,
        "attention_mask": split.attention_mask,
        "position_ids": split.rest_positions,
        cache_keyword(model): head,
        "use_cache": True,
    }


def head_cache(model: nn.Module, split: SharedSplit, causal_lm: bool, **head_kwargs):
    """Run the head(s) once and return their KV cache laid out over the batch rows (gradients flow through it)."""
    head = model(
        input_ids=split.head_ids,
        attention_mask=split.head_mask,
        position_ids=split.head_positions,
        use_cache=True,
        **({"logits_to_keep": 1} if causal_lm else {}),
        **head_kwargs,
    )
    cache = layered_cache(head)
    if cache is None:
        return None  # a model that returns no layered KV cache: the caller runs the plain forward
    batch = split.rest_ids.shape[0]
    for layer in cache.layers:
        if split.index is None:  # one head row: views, no copies; the rest's keys are appended by torch.cat
            layer.keys = layer.keys.expand(batch, *layer.keys.shape[1:])
            layer.values = layer.values.expand(batch, *layer.values.shape[1:])
        else:
            layer.keys = layer.keys.index_select(0, split.index)
            layer.values = layer.values.index_select(0, split.index)
    return cache


def forward_last(
    model: nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor,
    keep: int,
    causal_lm: bool,
    min_prefix: int = MIN_PREFIX_TOKENS,
    enabled: bool = True,
    min_saved: int | None = None,
):
    """Logits (causal_lm) or last hidden states of the last `keep` positions of a left-padded batch, (B, keep, ...).

    The same numbers as one plain forward over (ids, mask), computing what rows share once when that is expected to
    be faster (`min_saved`: None for the cost model, a number of tokens to override it).
    """
    split = None
    if enabled and supports_prefix_cache(model):
        min_saved = min_saved_tokens(model) if min_saved is None else min_saved
        split = plan_split(ids, mask, keep, min_prefix, min_saved=min_saved)
    cache = head_cache(model, split, causal_lm) if split is not None else None
    kwargs = split_inputs(model, ids, mask, split, cache, use_cache=False)
    if causal_lm:
        return model(**kwargs, logits_to_keep=keep).logits
    return model(**kwargs).last_hidden_state[:, -keep:]


@torch.no_grad()
def generate_with_prefix(
    model: nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor,
    gen_kwargs: dict,
    min_prefix: int = MIN_PREFIX_TOKENS,
    enabled: bool = True,
    min_saved: int | None = None,
) -> torch.Tensor:
    """`model.generate` on a left-padded batch, prefilling what its rows share once.

    Returns what `generate(input_ids=ids, attention_mask=mask)` returns: the prompt columns of `ids` followed by the
    new tokens. generate() reads a cache it is given as covering the first columns of every row, which both cuts
    satisfy; it numbers positions from the attention mask, as the plain call does. With PEFT's mixed-adapter batches
    (`adapter_names` in `gen_kwargs`, one per row) a head is shared only by rows of the same adapter.
    """
    split, head_kwargs = None, {}
    if enabled and supports_prefix_cache(model):
        names = gen_kwargs.get("adapter_names")
        keys = None
        if names is not None:
            distinct = sorted(set(names))
            keys = torch.tensor([distinct.index(n) for n in names], device=ids.device)
        min_saved = min_saved_tokens(model) if min_saved is None else min_saved
        split = plan_split(ids, mask, 1, min_prefix, row_keys=keys, min_saved=min_saved)
        if split is not None and names is not None:
            head_kwargs["adapter_names"] = [distinct[int(k)] for k in split.head_keys]
    cache = head_cache(model, split, causal_lm=True, **head_kwargs) if split is not None else None
    if cache is None:
        return model.generate(
            input_ids=ids, attention_mask=mask, **decode_cache_kwargs(model, gen_kwargs), **gen_kwargs
        )
    laid_out = split.layout_ids
    out = model.generate(
        input_ids=laid_out,
        attention_mask=split.attention_mask,
        **decode_cache_kwargs(model, gen_kwargs, [la.keys for la in cache.layers], [la.values for la in cache.layers]),
        **gen_kwargs,
    )
    return torch.cat([ids, out[:, laid_out.shape[1] :]], dim=1)


def decode_cache_kwargs(model: nn.Module, gen_kwargs: dict, keys=None, values=None) -> dict:
    """generate()'s cache argument: an in-place decoding cache (`cpu/kv_cache.py`, the same tokens as transformers'
    own cache) with room for the call's new tokens, holding a prefill's per-layer `keys` / `values` when given; for
    a model it does not fit, those in a transformers DynamicCache (or nothing: generate() makes its own)."""
    reserve = int(gen_kwargs.get("max_new_tokens") or 0)
    if full_attention_decoder(model) and reserve > 0:
        return {cache_keyword(model): DecodeCache(reserve, keys, values)}
    if keys is None:
        return {}
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (k, v) in enumerate(zip(keys, values)):
        cache.update(k, v, i)
    return {cache_keyword(model): cache}
