"""The allowed range of every numeric configuration field, checked where the config is made.

Every int or float field of a team config (ours, TRL's and `TrainingArguments`') is checked for finiteness; the
table below adds its range. A field missing from the table is still refused when non-finite, so a new field is
never silently unchecked; `tests/test_robustness.py` walks every field to keep it so.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

# (lowest, highest, lowest allowed itself, highest allowed itself); None = unbounded on that side.
_AT_LEAST_0 = (0, None, True, True)
_ABOVE_0 = (0, None, False, True)
_AT_LEAST_1 = (1, None, True, True)
_UNIT = (0, 1, True, True)
_UNIT_OPEN_TOP = (0, 1, True, False)
_UNIT_OPEN_BOTTOM = (0, 1, False, True)
_ANY = (None, None, True, True)

RANGES: dict[str, tuple] = {
    # transformers.TrainingArguments
    "per_device_train_batch_size": _AT_LEAST_1,
    "per_device_eval_batch_size": _AT_LEAST_1,
    "gradient_accumulation_steps": _AT_LEAST_1,
    "num_train_epochs": _ABOVE_0,
    "max_steps": (-1, None, True, True),  # -1: derive from the episodes
    "learning_rate": _AT_LEAST_0,
    "warmup_steps": _AT_LEAST_0,
    "weight_decay": _AT_LEAST_0,
    "adam_beta1": _UNIT_OPEN_TOP,
    "adam_beta2": _UNIT_OPEN_TOP,
    "adam_epsilon": _AT_LEAST_0,
    "max_grad_norm": _AT_LEAST_0,  # 0 (or None): no clipping
    "label_smoothing_factor": _UNIT,
    "neftune_noise_alpha": _AT_LEAST_0,
    "torch_empty_cache_steps": _AT_LEAST_1,
    "logging_steps": _ABOVE_0,
    "eval_steps": _ABOVE_0,
    "eval_delay": _AT_LEAST_0,
    "eval_accumulation_steps": _AT_LEAST_1,
    "save_steps": _ABOVE_0,
    "save_total_limit": _AT_LEAST_0,
    "seed": (0, 2**32 - 1, True, True),  # numpy's seed range
    "data_seed": (0, 2**32 - 1, True, True),
    "dataloader_num_workers": _AT_LEAST_0,
    "dataloader_prefetch_factor": _AT_LEAST_1,
    "ddp_bucket_cap_mb": _AT_LEAST_1,
    "ddp_timeout": _AT_LEAST_1,
    "local_rank": (-1, None, True, True),
    # shared by the team trainers (TRL PPOConfig names)
    "dataset_num_proc": _AT_LEAST_1,
    "num_mini_batches": _AT_LEAST_1,
    "total_episodes": _AT_LEAST_1,
    "local_rollout_forward_batch_size": _AT_LEAST_1,
    "num_sample_generations": _AT_LEAST_0,
    "response_length": _AT_LEAST_1,
    "stop_token_id": _AT_LEAST_0,
    "temperature": _ABOVE_0,
    "missing_eos_penalty": _ANY,
    "num_total_batches": _AT_LEAST_1,
    "micro_batch_size": _AT_LEAST_1,
    "local_batch_size": _AT_LEAST_1,
    "batch_size": _AT_LEAST_1,
    "local_mini_batch_size": _AT_LEAST_1,
    "mini_batch_size": _AT_LEAST_1,
    "gamma": _UNIT,
    "max_prompt_length": _AT_LEAST_1,
    "num_agents": _AT_LEAST_1,
    "num_turns": _AT_LEAST_1,
    "top_p": _UNIT_OPEN_BOTTOM,
    "top_k": _AT_LEAST_1,  # None (or 0, made None by TeamConfig) switches top-k off
    "early_termination_threshold": _ANY,
    "vllm_gpu_memory_utilization": _UNIT_OPEN_BOTTOM,
    "vllm_max_model_length": _AT_LEAST_1,
    "vllm_importance_sampling_clip_max": _ABOVE_0,
    "vllm_importance_sampling_clip_min": _AT_LEAST_0,
    "max_nonfinite_steps": _AT_LEAST_1,
    # PPO
    "num_ppo_epochs": _AT_LEAST_1,
    "kl_coef": _AT_LEAST_0,
    "cliprange": _ABOVE_0,
    "vf_coef": _AT_LEAST_0,
    "cliprange_value": _ABOVE_0,
    "lam": _UNIT,
    "critic_learning_rate": _AT_LEAST_0,
    "advantage_norm_std_floor": _ABOVE_0,
    # Monte-Carlo
    "num_generations": _AT_LEAST_1,
    "max_joint_combinations": _AT_LEAST_1,
    "num_iterations": _AT_LEAST_1,
    "epsilon": _ABOVE_0,
    "beta": _AT_LEAST_0,
}


def _describe(rng: tuple) -> str:
    lo, hi, lo_in, hi_in = rng
    if lo is not None and hi is not None:
        return f"in {'[' if lo_in else '('}{lo}, {hi}{']' if hi_in else ')'}"
    if lo is not None:
        return f"{'>=' if lo_in else '>'} {lo}"
    if hi is not None:
        return f"{'<=' if hi_in else '<'} {hi}"
    return "a finite number"


def _in_range(value: float, rng: tuple) -> bool:
    lo, hi, lo_in, hi_in = rng
    if lo is not None and (value < lo or (value == lo and not lo_in)):
        return False
    if hi is not None and (value > hi or (value == hi and not hi_in)):
        return False
    return True


def check_numeric_fields(config) -> None:
    """Raise ValueError naming the first numeric field that is non-finite or out of its range."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name, None)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue  # None (unset), strings, lists, flags
        rng = RANGES.get(f.name, _ANY)
        if not math.isfinite(value):
            raise ValueError(f"`{f.name}` must be a finite number ({_describe(rng)}), got {value!r}.")
        if not _in_range(value, rng):
            hint = {"top_k": " (None or 0 switches it off)", "max_grad_norm": " (None switches it off)"}.get(f.name, "")
            raise ValueError(f"`{f.name}` must be {_describe(rng)}{hint}, got {value!r}.")
