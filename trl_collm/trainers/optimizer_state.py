"""The optimizer state and trained weights in one form that does not depend on the number of processes.

A checkpoint's `optimizer.pt` is always what one process's torch optimizer would hold for this team: torch's
`Optimizer.state_dict()` layout (`state` by parameter index, `param_groups` with their hyperparameters), plus
`param_names` (the parameter names of each group, in order) so that a resume can check it fits. Without DeepSpeed it
is the optimizer's own state dict. Under ZeRO-2 / ZeRO-3 the state is partitioned across the processes, so at save
time every rank takes part in gathering each parameter's full fp32 master weight and per-element state (`exp_avg`,
`exp_avg_sq` for Adam) with DeepSpeed's `safe_get_full_*` helpers, and rank 0 writes them in that layout.

A resume under DeepSpeed on another number of processes writes the full tensors back into the fresh engine's
partitions (`safe_set_full_*`), whatever the new partitioning is. That is why a ZeRO checkpoint resumes on 1, 2 or 4
processes, and also without DeepSpeed (and a plain checkpoint under DeepSpeed).

The cost: rank 0 holds 12 bytes per trainable parameter in CPU memory (fp32 weight + two Adam moments) while it
writes, and the file has that size. For a LoRA team that is a few MB; for full fine-tuning it is what a one-process
run's checkpoint holds anyway.
"""

from __future__ import annotations

import torch

FORMAT = "trl-collm/optimizer/1"


def param_group_names(trainer) -> list[list[str]]:
    """The trainable parameter names of each optimizer group, in the optimizer's order (recorded before DeepSpeed
    replaced the groups' parameters with its flat partitions: `remember_param_groups`)."""
    recorded = getattr(trainer, "_param_group_names", None)
    if recorded is not None:
        return recorded
    name_of = {id(p): n for n, p in trainer.model.named_parameters()}
    return [[name_of[id(p)] for p in group["params"]] for group in trainer.optimizer.param_groups]


def remember_param_groups(trainer) -> None:
    """Before `accelerator.prepare` hands the optimizer to DeepSpeed: keep each group's parameter names."""
    trainer._param_group_names = None
    trainer._param_group_names = param_group_names(trainer)


def _trainable(trainer) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}


def _inner(trainer):
    """DeepSpeed's ZeRO optimizer and the torch optimizer inside it (which steps the flat fp32 partitions)."""
    zero = trainer.model_wrapped.optimizer
    return zero, zero.optimizer


def _flat_partitions(zero, inner) -> list[torch.Tensor]:
    """The flat fp32 partitions that the inner optimizer steps, and keys its state by. ZeRO-3 (and ZeRO-2) hand them
    to `inner.param_groups` only for the length of a step, so they are read from ZeRO's own lists."""
    for attribute in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):  # ZeRO-1/2, ZeRO-3
        flats = getattr(zero, attribute, None)
        if flats:
            return list(flats)
    return [flat for group in inner.param_groups for flat in group["params"]]


def _state_layout(zero, inner) -> tuple[list[str], dict]:
    """The per-element state keys (tensors shaped like the flat partition) and the scalar entries (Adam's `step`) of
    the inner optimizer; the same on every rank. Empty before the first step (the state is created lazily)."""
    for flat in _flat_partitions(zero, inner):
        state = inner.state.get(flat)
        if state:
            keys = sorted(k for k, v in state.items() if torch.is_tensor(v) and v.dim() > 0)
            return keys, {k: v for k, v in state.items() if k not in keys}
    return [], {}


def _hyperparameters(group: dict) -> dict:
    return {k: v for k, v in group.items() if k != "params"}


def full_state(trainer) -> tuple[dict, dict] | None:
    """(trainable fp32 weights by name, optimizer.pt's dict) of the whole team. Collective under DeepSpeed (every
    rank must call it); rank 0 gets the tensors, the other ranks None."""
    from . import distributed

    names = param_group_names(trainer)
    if not trainer.is_deepspeed_enabled:
        if not trainer.is_world_process_zero():
            return None
        params = {n: p.detach().cpu().clone() for n, p in _trainable(trainer).items()}
        return params, {**trainer.optimizer.state_dict(), "param_names": names, "format": FORMAT}
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    distributed.release_gathered(trainer)  # ZeRO-3: the gathers below must not overlap the trainer's own
    zero, inner = _inner(trainer)
    keys, scalars = _state_layout(zero, inner)
    if keys:
        _link_state(zero)
    live = _trainable(trainer)
    main = trainer.is_world_process_zero()
    params, state, index = {}, {}, 0
    for group_names in names:
        for name in group_names:
            p = live[name]
            weight = safe_get_full_fp32_param(p)  # a collective: all ranks, the same parameter order
            moments = {k: safe_get_full_optimizer_state(p, k) for k in keys}
            if main:
                params[name] = weight.detach().cpu().clone()
                if keys:
                    state[index] = {**_cpu(scalars), **{k: v.detach().cpu().clone() for k, v in moments.items()}}
            index += 1
    if not main:
        return None
    groups, index = [], 0
    for group, group_names in zip(zero.param_groups, names):
        groups.append({**_hyperparameters(group), "params": list(range(index, index + len(group_names)))})
        index += len(group_names)
    return params, {"state": state, "param_groups": groups, "param_names": names, "format": FORMAT}


def _cpu(scalars: dict) -> dict:
    return {k: v.detach().cpu().clone() if torch.is_tensor(v) else v for k, v in scalars.items()}


def check_fits(saved: dict, trainer, path: str) -> None:
    """optimizer.pt's groups must hold this team's parameters in this order (another layout would pair moments with
    the wrong weights)."""
    live = param_group_names(trainer)
    if saved.get("param_names") != live:
        raise ValueError(
            f"checkpoint {path!r}: its optimizer state has {len(saved.get('param_names') or [])} parameter groups "
            f"over other parameters than this run's {len(live)}; it was written by a run with other agents, "
            "per-agent learning rates or critic settings. Resume with the same configuration, or start over."
        )


def load_full_state(trainer, params: dict, saved: dict) -> None:
    """Write full weights and optimizer.pt's state into this run's optimizer, whatever its number of processes.
    Collective under DeepSpeed (every rank loads the same files and calls it)."""
    names = param_group_names(trainer)
    live = _trainable(trainer)
    if not trainer.is_deepspeed_enabled:
        with torch.no_grad():
            for name, value in params.items():
                live[name].copy_(value.to(live[name].device, live[name].dtype))
        trainer.optimizer.load_state_dict({"state": saved["state"], "param_groups": saved["param_groups"]})
        return
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    from . import distributed

    distributed.release_gathered(trainer)
    zero, inner = _inner(trainer)
    first = next(iter(saved["state"].values()), None)
    keys = sorted(k for k, v in (first or {}).items() if torch.is_tensor(v) and v.dim() > 0)
    if first is not None:
        _create_state(zero, inner, keys, {k: v for k, v in first.items() if k not in keys})
    index = 0
    for group_names in names:
        for name in group_names:
            p, value = live[name], params[name]
            _set_model_weight(p, value)
            device = _device_of(p)
            _set_full(zero, p, value.to(device, torch.float32), None, safe_set_full_fp32_param)
            for k in keys:
                full = saved["state"][index][k].to(device, torch.float32)
                _set_full(zero, p, full, k, lambda p, v, k=k: safe_set_full_optimizer_state(p, v, k))
            index += 1
    for group, saved_group in zip(zero.param_groups, saved["param_groups"]):
        group.update(_hyperparameters(saved_group))  # the checkpoint's hyperparameters win, as in load_state_dict


def _set_full(zero, p, value: torch.Tensor, key: str | None, setter) -> None:
    """Write a full fp32 tensor (the weight, or the optimizer state `key`) into this rank's partition. ZeRO-3's own
    setter cuts `value` at rank x partition size without the padding its partitions have, which fails for a
    parameter with fewer elements than processes (a value head's bias on 4 ranks): cut the padded value here."""
    if not hasattr(p, "ds_id"):
        setter(p, value)
        return
    partition, _ = zero._get_fp32_opt_state_partition(p, release_swap_buffers=False, optim_state_key=key)
    size = p.ds_tensor.ds_numel  # every rank's partition size (the last one padded)
    world = zero._get_param_partition_world_size(p)
    flat = torch.nn.functional.pad(value.flatten(), (0, size * world - value.numel()))
    rank = zero._get_param_partition_rank(p)
    partition.data.copy_(flat.narrow(0, size * rank, partition.numel()))


def _device_of(p) -> torch.device:
    return p.ds_tensor.device if hasattr(p, "ds_tensor") else p.device


def _create_state(zero, inner, keys: list[str], scalars: dict) -> None:
    """The optimizer state of every flat partition, as the checkpoint's step left it: per-element entries zeroed here
    (the full values are written per parameter afterwards), the scalars (Adam's step count) copied. A fresh engine
    has none yet (ZeRO-2 creates it at the first step) or its own initial one (ZeRO-3)."""
    # torch keeps Adam's step on the CPU unless the group is fused / capturable (then beside the weights)
    on_device = inner.defaults.get("fused") or inner.defaults.get("capturable")
    for flat in _flat_partitions(zero, inner):
        state = inner.state[flat]
        for k in keys:
            state[k] = torch.zeros_like(flat)
        for k, v in scalars.items():
            state[k] = v.detach().clone().to(flat.device if on_device else "cpu") if torch.is_tensor(v) else v
    _link_state(zero)


def _link_state(zero) -> None:
    """ZeRO-2 reads a parameter's optimizer state through views into the flat state that it links once, lazily;
    in the trainers' unmanaged stepping they can be missing at save time, and a state created here is new: (re)link
    them. ZeRO-3 reads `inner.state` directly."""
    if hasattr(zero, "_lazy_init_hp_params_optimizer_state"):
        zero._hp_optimizer_states_linked = False
        zero._lazy_init_hp_params_optimizer_state()


def _set_model_weight(p, value: torch.Tensor) -> None:
    """The model's (low-precision) copy of a parameter: whole under ZeRO-2; under ZeRO-3 gathered, written, and
    partitioned again."""
    with torch.no_grad():
        if not hasattr(p, "ds_id"):
            p.copy_(value.to(p.device, p.dtype))
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters([p], modifier_rank=0):
            p.data.copy_(value.to(p.data.device, p.data.dtype))
