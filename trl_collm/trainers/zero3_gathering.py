"""ZeRO-3 with one gather per model and pass, instead of DeepSpeed's per-module fetches.

DeepSpeed ZeRO-3 puts a fetch before every module's forward and again before its backward (an all-gather of that
module's partitioned parameters) and a release after. For the team trainers' many short passes (a scoring forward per
agent and turn, a policy and a critic loss per micro-batch) that is hundreds of collectives per iteration, and on
small models their latency and the hooks' Python work cost several times the arithmetic (docs/benchmarks.md, the
ZeRO-3 profile). With `ds3_gather_for_training` (the default) the trainers do what generation already does: the
engine's module hooks come off, and a model's parameters are gathered whole, once, the first time one of its modules
runs; they stay gathered through the backward of the loss that used them and are released right after it, before any
optimizer step, and before a checkpoint is consolidated. Without gradients (generation, scoring) a model stays
gathered until another model is needed, so at most one model is whole at a time outside a loss.

A "model" (a unit) is what the trainer builds as one piece: an agent's causal LM, the shared LoRA base, a value model,
a value head; each parameter belongs to exactly one unit. The memory price is the same as `ds3_gather_for_generation`'s:
one unit's full weights (plus, in a loss, the units it runs through: a critic head and the actor body under it).
Gradients are still reduce-scattered by ZeRO-3's own per-parameter hooks, which stay in place.
"""

from __future__ import annotations

import time

import torch
from torch import nn


def parameter_offload(engine):
    """The object that owns a ZeRO-3 engine's module hooks: DeepSpeedZeRoOffload (an optimizer's `parameter_offload`,
    or, for an engine without an optimizer such as a frozen reference model, the engine's `optimizer` itself)."""
    optimizer = getattr(engine, "optimizer", None)
    for candidate in (getattr(optimizer, "parameter_offload", None), optimizer):
        if candidate is not None and hasattr(candidate, "forward_hooks") and hasattr(candidate, "module"):
            return candidate
    raise RuntimeError(
        "ZeRO-3: the DeepSpeed engine has no parameter-offload hooks to lift (its optimizer is "
        f"{type(optimizer).__name__}); set `ds3_gather_for_generation=False` and `ds3_gather_for_training=False` "
        "to run through DeepSpeed's hooks."
    )


def lift_module_hooks(offload) -> None:
    """Take a ZeRO-3 engine's module hooks off (its per-parameter gradient hooks stay)."""
    for param in offload.module.parameters():
        param.ds_active_sub_modules.clear()
    for hook in offload.forward_hooks + offload.backward_hooks:
        hook.remove()
    offload.forward_hooks, offload.backward_hooks = [], []


def restore_module_hooks(offload) -> None:
    # Registering on the root module also invalidates the prefetch trace recorded before the hooks came off.
    offload._register_deepspeed_module(offload.module)


def _is_unit(module: nn.Module) -> bool:
    from transformers import PreTrainedModel

    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        PeftModel = ()
    return isinstance(module, (PreTrainedModel, PeftModel)) or any(True for _ in module.parameters(recurse=False))


def _units_under(module: nn.Module, seen: set[int]) -> list[nn.Module]:
    if id(module) in seen:
        return []
    seen.add(id(module))
    if _is_unit(module):
        return [module]
    return [unit for child in module.children() for unit in _units_under(child, seen)]


class Zero3Gathering:
    """Per-unit gathering for the ZeRO-3 engines of one trainer (the TeamModel's and any frozen reference models').

    `release()` must be called after every backward and before every optimizer step (`TeamTrainerBase._step` does);
    every rank runs the same forwards in the same order, so the gathers (collectives) line up as DeepSpeed's own do.
    """

    def __init__(self, engines: list):
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        self._not_available = ZeroParamStatus.NOT_AVAILABLE
        self.offloads = [parameter_offload(e) for e in engines]
        self.units: list[list[nn.Parameter]] = []
        owner: dict[int, int] = {}  # id(parameter) -> unit index
        seen: set[int] = set()
        for offload in self.offloads:
            for module in _units_under(offload.module, seen):
                params = [p for p in module.parameters() if id(p) not in owner]
                if not params:
                    continue
                for p in params:
                    owner[id(p)] = len(self.units)
                self.units.append(params)
        self._owner = owner
        self._open: set[int] = set()  # units gathered whole
        self._pinned: set[int] = set()  # units a pending backward needs
        self._hooks: list = []
        self.gathers = 0  # how many unit gathers ran, and their seconds (examples/ds_train.py reports both)
        self.gather_seconds = 0.0

    # ------------------------------------------------------------------ lifecycle
    def install(self) -> None:
        """Lift DeepSpeed's module hooks and put one cheap pre-forward hook on every module that owns parameters."""
        for offload in self.offloads:
            lift_module_hooks(offload)
            for module in offload.module.modules():
                units = sorted({self._owner[id(p)] for p in module.parameters(recurse=False) if id(p) in self._owner})
                if units:
                    self._hooks.append(module.register_forward_pre_hook(self._pre_forward(tuple(units))))

    def uninstall(self) -> None:
        """Release everything and give the engines their module hooks back."""
        self.release()
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        for offload in self.offloads:
            restore_module_hooks(offload)

    def _pre_forward(self, units: tuple[int, ...]):
        def hook(module, args):
            for unit in units:
                self.touch(unit)

        return hook

    # ------------------------------------------------------------------ gathering
    def touch(self, unit: int) -> None:
        grad = torch.is_grad_enabled()
        if unit not in self._open:
            if not grad:  # no backward will need the others: keep one unit whole at a time
                self.release(keep=self._pinned)
            # One flat all-gather for the whole unit (DeepSpeed's coalesced gather, the one its prefetcher uses);
            # `GatheredParameters` would launch one collective per parameter. Parameters DeepSpeed keeps whole
            # (below its persistence threshold, after a step) are skipped.
            needed = [p for p in self.units[unit] if p.ds_status == self._not_available]
            start = time.perf_counter()
            if needed:
                needed[0].all_gather_coalesced(needed).wait()
            self.gather_seconds += time.perf_counter() - start
            self._open.add(unit)
            self.gathers += 1
        if grad:
            self._pinned.add(unit)

    def touch_module(self, module: nn.Module) -> None:
        """Gather the units that hold `module`'s parameters (generation enters its model this way)."""
        for unit in sorted({self._owner[id(p)] for p in module.parameters() if id(p) in self._owner}):
            self.touch(unit)

    def release(self, keep: set[int] | frozenset = frozenset()) -> None:
        """Re-partition every gathered unit but `keep` (local: no communication)."""
        for unit in [u for u in self._open if u not in keep]:
            params = self.units[unit]
            for p in params:
                p.ds_active_sub_modules.clear()
            params[0].partition(param_list=params, has_been_updated=False)
            self._open.discard(unit)
            self._pinned.discard(unit)
