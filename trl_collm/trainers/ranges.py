"""The allowed range of every numeric configuration field, checked where the config is made.

A field we declare states its range beside it, in its annotation: `lam: Annotated[float, UNIT] = field(...)`.
(Not in `field(metadata=...)`: transformers' `HfArgumentParser`, and so TRL's `TrlParser` and our CLI, hands every
metadata key to argparse, which refuses an unknown one.) The fields inherited from `TrainingArguments` take theirs
from `INHERITED_RANGES` below. Every int or float field is also checked for finiteness, so a field without a range is
never silently unchecked; `tests/test_config_checks.py` walks every field to keep it so.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import typing
from typing import NamedTuple


class Range(NamedTuple):
    """[low, high] with each end open or closed; None = unbounded on that side."""

    low: float | None
    high: float | None
    low_allowed: bool = True
    high_allowed: bool = True


AT_LEAST_0 = Range(0, None)
ABOVE_0 = Range(0, None, False)
AT_LEAST_1 = Range(1, None)
UNIT = Range(0, 1)
UNIT_OPEN_TOP = Range(0, 1, True, False)
UNIT_OPEN_BOTTOM = Range(0, 1, False, True)
ANY = Range(None, None)
SEED = Range(0, 2**32 - 1)  # numpy's seed range

# transformers.TrainingArguments fields (declared there, so their range cannot sit beside them)
INHERITED_RANGES: dict[str, Range] = {
    "per_device_train_batch_size": AT_LEAST_1,
    "per_device_eval_batch_size": AT_LEAST_1,
    "gradient_accumulation_steps": AT_LEAST_1,
    "num_train_epochs": ABOVE_0,
    "max_steps": Range(-1, None),  # -1: derive from the episodes
    "warmup_steps": AT_LEAST_0,
    "weight_decay": AT_LEAST_0,
    "adam_beta1": UNIT_OPEN_TOP,
    "adam_beta2": UNIT_OPEN_TOP,
    "adam_epsilon": AT_LEAST_0,
    "max_grad_norm": AT_LEAST_0,  # 0 (or None): no clipping
    "label_smoothing_factor": UNIT,
    "neftune_noise_alpha": AT_LEAST_0,
    "torch_empty_cache_steps": AT_LEAST_1,
    "logging_steps": ABOVE_0,
    "eval_steps": ABOVE_0,
    "eval_delay": AT_LEAST_0,
    "eval_accumulation_steps": AT_LEAST_1,
    "save_steps": ABOVE_0,
    "save_total_limit": AT_LEAST_0,
    "seed": SEED,
    "data_seed": SEED,
    "dataloader_num_workers": AT_LEAST_0,
    "dataloader_prefetch_factor": AT_LEAST_1,
    "ddp_bucket_cap_mb": AT_LEAST_1,
    "ddp_timeout": AT_LEAST_1,
    "local_rank": Range(-1, None),
}


@functools.cache
def field_ranges(config_cls: type) -> dict[str, Range]:
    """Each field's range: the one its annotation declares, else `INHERITED_RANGES`'s, else ANY."""
    out = {}
    for name, hint in typing.get_type_hints(config_cls, include_extras=True).items():
        declared = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Range)]
        out[name] = declared[0] if declared else INHERITED_RANGES.get(name, ANY)
    return out


@functools.cache
def numeric_fields(config_cls: type) -> frozenset[str]:
    """The fields whose type is a number (int, float, or one of them or None), whatever their range."""
    out = set()
    for name, hint in typing.get_type_hints(config_cls).items():  # Annotated stripped
        kinds = set(typing.get_args(hint)) - {type(None)} if typing.get_args(hint) else {hint}
        if kinds and kinds <= {int, float}:
            out.add(name)
    return frozenset(out)


def _describe(rng: tuple) -> str:
    lo, hi, lo_in, hi_in = rng
    if lo is not None and hi is not None:
        return f"in {'[' if lo_in else '('}{lo}, {hi}{']' if hi_in else ')'}"
    if lo is not None:
        return f"{'>=' if lo_in else '>'} {lo}"
    if hi is not None:
        return f"{'<=' if hi_in else '<'} {hi}"
    return "a finite number"


def _as_number(text: str) -> str:
    try:
        return repr(float(text))
    except ValueError:
        return "a number"


def _in_range(value: float, rng: tuple) -> bool:
    lo, hi, lo_in, hi_in = rng
    if lo is not None and (value < lo or (value == lo and not lo_in)):
        return False
    if hi is not None and (value > hi or (value == hi and not hi_in)):
        return False
    return True


def check_numeric_fields(config) -> None:
    """Raise ValueError naming the first numeric field that is non-finite or out of its range."""
    ranges = field_ranges(type(config))
    numeric = numeric_fields(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name, None)
        if isinstance(value, str) and f.name in numeric:  # else a bare TypeError from the first arithmetic in train()
            raise ValueError(
                f"`{f.name}`={value!r} is a string; pass a number ({f.name}={_as_number(value)}). YAML reads "
                "1e-3 without a dot as a string: write 1.0e-3."
            )
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue  # None (unset), strings, lists, flags
        rng = ranges.get(f.name, ANY)
        if not math.isfinite(value):
            raise ValueError(f"`{f.name}` must be a finite number ({_describe(rng)}), got {value!r}.")
        if not _in_range(value, rng):
            hint = {"top_k": " (None or 0 switches it off)", "max_grad_norm": " (None switches it off)"}.get(f.name, "")
            raise ValueError(f"`{f.name}` must be {_describe(rng)}{hint}, got {value!r}.")
