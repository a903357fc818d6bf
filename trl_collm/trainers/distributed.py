"""DeepSpeed (ZeRO-2 / ZeRO-3) helpers for the team trainers.

The trainers make one optimizer step per minibatch out of several backward passes (one per agent x turn x
micro-batch, plus the critic's). accelerate's `backward` under DeepSpeed steps the engine at every call, so the
trainers run the engine in DeepSpeed's *unmanaged* gradient-accumulation mode (`managed_gradient_accumulation: false`):
`engine.backward(loss)` only accumulates (ZeRO-2/3 reduce and partition per backward), and `engine.step()` is the one
boundary that finalises the gradients, clips them globally (`gradient_clipping`) and updates.

Everything here is a no-op outside DeepSpeed.
"""

from __future__ import annotations

import contextlib
import os

import torch


def deepspeed_launch_requested() -> bool:
    """`accelerate launch` with a DeepSpeed config exports ACCELERATE_USE_DEEPSPEED=true to the workers."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def keep_deepspeed_unimported(accelerator) -> None:
    """Without DeepSpeed, stop accelerate from importing it (about 20 MB and a second of import) to unwrap models.

    accelerate's `unwrap_model` imports deepspeed whenever it is installed, only to check whether the model is a
    DeepSpeedEngine; transformers.Trainer calls it while it is built. When deepspeed has not been imported, no object
    can be an engine, so the check is skipped (an instance attribute shadows the method, as `engine_backward` does).
    """
    if accelerator.distributed_type == "DEEPSPEED" or str(accelerator.distributed_type).endswith("DEEPSPEED"):
        return
    import sys
    from unittest import mock

    import accelerate.utils.other

    unwrap = accelerator.unwrap_model

    def unwrap_model(model, *args, **kwargs):
        if "deepspeed" in sys.modules:
            return unwrap(model, *args, **kwargs)
        with mock.patch.object(accelerate.utils.other, "is_deepspeed_available", return_value=False):
            return unwrap(model, *args, **kwargs)

    accelerator.unwrap_model = unwrap_model


def prepare_args_for_deepspeed(args) -> None:
    """Checks and CPU fix-ups, before the accelerator is created (trainer `__init__`, before `super().__init__`).

    - `use_cpu=True` (or ACCELERATE_USE_CPU) makes transformers build `Accelerator(cpu=True)`, which silently drops the
      DeepSpeed plugin: refuse it.
    - On a machine without CUDA, accelerate picks no process-group backend for DeepSpeed and then believes it runs
      one process (every rank is rank 0). `ddp_backend="gloo"` fixes it; DeepSpeed itself selects its CPU accelerator.
    - Per-module gradient clipping cannot be expressed to DeepSpeed, which clips the global norm in `engine.step()`.
    """
    if not deepspeed_launch_requested():
        return
    if args.use_cpu or os.environ.get("ACCELERATE_USE_CPU", "false").lower() in ("1", "true", "yes"):
        raise ValueError(
            "DeepSpeed was requested (accelerate launch with a DeepSpeed config) but `use_cpu=True` (or "
            "ACCELERATE_USE_CPU) "
            "is set: accelerate then drops the DeepSpeed plugin and trains without it. Remove `use_cpu`; on a "
            "machine without "
            "a GPU DeepSpeed selects its CPU accelerator by itself."
        )
    if getattr(args, "grad_clip_scope", "global") == "per_module" and args.max_grad_norm and args.max_grad_norm > 0:
        raise ValueError(
            "`grad_clip_scope='per_module'` is not supported under DeepSpeed: DeepSpeed clips the global gradient norm "
            "inside `engine.step()` (`gradient_clipping=max_grad_norm`). Set grad_clip_scope='global' (or "
            "max_grad_norm=0)."
        )
    if not torch.cuda.is_available() and args.ddp_backend is None:
        args.ddp_backend = "gloo"
        if "_setup_devices" in args.__dict__:
            # TrainingArguments set up its distributed state in __post_init__, without a backend: redo it with gloo
            # (the process group DeepSpeed already initialised is reused; only accelerate's view of it changes).
            del args.__dict__["_setup_devices"]
            _ = args.device
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if args.distributed_state is not None and args.distributed_state.num_processes != world:
            raise ValueError(
                f"DeepSpeed on CPU: accelerate sees {args.distributed_state.num_processes} process(es) out of "
                f"WORLD_SIZE={world}; "
                "pass `ddp_backend='gloo'` in the training config."
            )
    plugin = getattr(args, "deepspeed_plugin", None)
    if plugin is not None and plugin.hf_ds_config.is_zero3():
        if plugin.zero3_init_flag:
            raise ValueError(
                "ZeRO-3 with `zero3_init_flag: true` is not supported by the team trainers: they build frozen "
                "reference "
                "copies, value heads and LoRA adapters from the loaded agents before the DeepSpeed engine exists, "
                "which "
                "needs full weights. Set `zero3_init_flag: false` (trl_collm/accelerate_configs/zero3.yaml does); the "
                "engine still partitions every trainable parameter and the references are sharded at `train()`."
            )
        # transformers' TrainingArguments registered the ZeRO-3 config globally, which makes every later
        # `from_pretrained` (the agents, the critic) load partitioned under deepspeed.zero.Init even with the flag off.
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()


def zero_stage(trainer) -> int:
    if not getattr(trainer, "is_deepspeed_enabled", False):
        return -1
    return int(trainer.accelerator.state.deepspeed_plugin.deepspeed_config.get("zero_optimization", {}).get("stage", 0))


def configure_deepspeed(trainer) -> None:
    """Fill the DeepSpeed config from the trainer's arguments, right before `accelerator.prepare(model, optimizer)`.

    One `engine.step()` per trainer optimizer step: DeepSpeed's own accumulation is off (gradient_accumulation_steps=1,
    unmanaged mode); `train_batch_size` = micro batch x world size so DeepSpeed's batch check holds.
    """
    args = trainer.args
    plugin = trainer.accelerator.state.deepspeed_plugin
    cfg = plugin.deepspeed_config
    for block in ("optimizer", "scheduler"):
        if block in cfg:
            raise ValueError(
                f"The DeepSpeed config has an `{block}` block; the team trainers build their own optimizer (one "
                "parameter "
                f"group per agent / critic) and scheduler. Remove `{block}` from the DeepSpeed config."
            )
    micro = max(1, int(args.per_device_train_batch_size))
    cfg["train_micro_batch_size_per_gpu"] = micro
    cfg["gradient_accumulation_steps"] = 1
    cfg["train_batch_size"] = micro * trainer.accelerator.num_processes
    cfg["managed_gradient_accumulation"] = False
    cfg["gradient_clipping"] = float(args.max_grad_norm) if args.max_grad_norm and args.max_grad_norm > 0 else 0.0
    cfg.setdefault("steps_per_print", float("inf"))
    zero = cfg.setdefault("zero_optimization", {})
    if int(zero.get("stage", 0)) == 3 and args.ds3_gather_for_training:
        # The trainers gather each model whole (trainers/zero3_gathering.py), so keeping small parameters unpartitioned
        # saves nothing; it costs a per-parameter all-gather of every such parameter after each optimizer step.
        if zero.get("stage3_param_persistence_threshold", "auto") == "auto":
            zero["stage3_param_persistence_threshold"] = 0
        # DeepSpeed's "memory-efficient" linear (it replaces torch.nn.functional.linear process-wide with a Python
        # autograd Function, for weights that may be re-partitioned between forward and backward) has nothing to
        # save when a model stays whole through its backward, and its per-call Python work doubled the tiny
        # models' generation time.
        zero.setdefault("memory_efficient_linear", False)
    # Unmanaged accumulation supports overlap_comm only with partitioned gradients (stage 2/3).
    if int(zero.get("stage", 0)) < 2:
        zero["overlap_comm"] = False
    if args.bf16:
        cfg["bf16"] = {"enabled": True}
    elif args.fp16:
        cfg["fp16"] = {"enabled": True}
    for key in ("bf16", "fp16"):
        if isinstance(cfg.get(key), dict) and cfg[key].get("enabled") == "auto":
            cfg[key]["enabled"] = False


def prepare_model_and_optimizer(trainer) -> None:
    """`accelerator.prepare` the TeamModel and its optimizer into a DeepSpeed engine (the scheduler stays ours: it
    drives the same parameter-group dicts that the ZeRO optimizer steps, and `_step` steps it once per update)."""
    configure_deepspeed(trainer)
    from .optimizer_state import remember_param_groups

    remember_param_groups(trainer)  # the groups' parameters become ZeRO's flat partitions (checkpoints name them)
    engine, optimizer = trainer.accelerator.prepare(trainer.model, trainer.optimizer)
    trainer.model_wrapped = engine
    trainer.deepspeed = engine
    trainer.optimizer = optimizer
    if zero_stage(trainer) == 3:
        _shard_frozen_models(trainer)
    install_zero3_gathering(trainer)


def _shard_frozen_models(trainer) -> None:
    """ZeRO-3: frozen reference policies become inference engines (sharded, gathered per layer by DeepSpeed's hooks),
    as TRL does with `prepare_deepspeed`. They are built from full weights (the shipped zero3 config keeps
    zero3_init_flag off), so they are never deep copies of partitioned parameters."""
    from trl.models.utils import prepare_deepspeed

    refs = trainer.team._refs
    for name, ref in list(refs.items()):
        if ref is not None:
            refs[name] = prepare_deepspeed(ref, trainer.accelerator)


@contextlib.contextmanager
def generation_context(trainer, module):
    """The module to generate with, for the length of one generation call (`AgentTeam.generate` enters it per agent).

    ZeRO-3 with `ds3_gather_for_training` (the default): the trainer's `Zero3Gathering` gathers the agent once (its
    module hooks replace DeepSpeed's for the whole run). Otherwise, with `ds3_gather_for_generation` (the default):
    the agent's weights are gathered once, and the engine's module hooks are taken off until the call ends, then
    registered again. TRL's `unwrap_model_for_generation` does this only when handed the engine itself; handed an
    agent (a sub-module, which has no `optimizer` attribute) it gathered the weights but left the hooks on, and their
    post-forward release re-partitioned the weights so that every decoding step gathered them again (the ZeRO-3
    profile in docs/benchmarks.md). With both flags False the hooks stay and gather layer by layer (less memory,
    slower). ZeRO-2 and plain runs hold full weights: the module itself.
    """
    gathering = getattr(trainer, "zero3_gathering", None)
    if gathering is not None:
        with torch.no_grad():
            gathering.touch_module(module)
        yield module
        return
    if zero_stage(trainer) != 3 or not trainer.args.ds3_gather_for_generation:
        yield module
        return
    import deepspeed

    from trl_collm.trainers.zero3_gathering import lift_module_hooks, parameter_offload, restore_module_hooks

    offload = parameter_offload(trainer.model_wrapped)
    with deepspeed.zero.GatheredParameters(list(module.parameters())):
        lift_module_hooks(offload)
        try:
            yield module
        finally:
            restore_module_hooks(offload)


def generation_in_lockstep(trainer) -> bool | None:
    """generate()'s `synced_gpus` under ZeRO-3 (None elsewhere: transformers' default).

    Lockstep decoding (every rank runs a forward until all ranks are done, with an all-reduce per token) is needed only
    while DeepSpeed's per-module hooks gather weights during the forward: then every rank must take part in every
    gather. With the agent gathered whole for the call (`ds3_gather_for_generation`, the default) there is no
    collective inside generation, so each rank stops when its own rows are done and the per-token all-reduce goes.
    """
    if zero_stage(trainer) != 3:
        return None
    gathered = getattr(trainer, "zero3_gathering", None) is not None or trainer.args.ds3_gather_for_generation
    return trainer.accelerator.num_processes > 1 and not gathered


def install_zero3_gathering(trainer) -> None:
    """ZeRO-3 with `ds3_gather_for_training`: one gather per model and pass for the TeamModel's engine and the frozen
    reference engines (trainers/zero3_gathering.py); `trainer.zero3_gathering` stays None otherwise."""
    trainer.zero3_gathering = None
    if zero_stage(trainer) != 3 or not trainer.args.ds3_gather_for_training:
        return
    from trl_collm.trainers.zero3_gathering import Zero3Gathering

    refs = [ref for ref in trainer.team._refs.values() if ref is not None and hasattr(ref, "optimizer")]
    trainer.zero3_gathering = Zero3Gathering([trainer.model_wrapped, *refs])
    trainer.zero3_gathering.install()


def release_gathered(trainer) -> None:
    """Re-partition every model `Zero3Gathering` holds whole: after each backward, before each optimizer step and
    before a checkpoint is consolidated (no-op without it)."""
    gathering = getattr(trainer, "zero3_gathering", None)
    if gathering is not None:
        gathering.release()


@contextlib.contextmanager
def engine_backward(trainer):
    """Inside a DeepSpeed `_step`: `accelerator.backward(loss)` (also used by the PPO critic) only accumulates into the
    engine (no `engine.step()`); the caller steps once at the end."""
    engine = trainer.model_wrapped
    accelerator = trainer.accelerator

    def backward(loss, **kwargs):
        engine.backward(loss, **kwargs)

    accelerator.backward = backward  # instance attribute shadows the method for the duration of the step
    try:
        yield engine
    finally:
        del accelerator.backward


def full_state_dict(trainer) -> dict | None:
    """ZeRO-3: the consolidated full state dict of the TeamModel (collective: every rank must call it; only rank 0
    gets the tensors). None when parameters are not partitioned (ZeRO-2 or no DeepSpeed: rank 0 holds full weights)."""
    if zero_stage(trainer) != 3:
        return None
    engine = trainer.model_wrapped
    release_gathered(trainer)  # its gathers must not overlap the consolidation's
    # The gather works whatever `stage3_gather_16bit_weights_on_model_save` says; the tensors keep the engine's dtype.
    return engine._zero3_consolidated_16bit_state_dict()


def average_gradients(trainer) -> None:
    """Several processes without DeepSpeed (accelerate's multi-GPU / multi-CPU launch): the TeamModel is not wrapped
    in DDP (the trainers call its submodules directly, which DDP's reducer does not see), so average the accumulated
    gradients across the processes here, once per optimizer step. Parameters without a gradient on some rank count
    as zero there, so every rank takes part in the same collectives and steps the same parameters."""
    world = trainer.accelerator.num_processes
    if world <= 1:
        return
    params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    has_grad = torch.tensor(
        [p.grad is not None for p in params], dtype=torch.float32, device=trainer.accelerator.device
    )
    torch.distributed.all_reduce(has_grad)
    for p, any_grad in zip(params, has_grad.tolist()):
        if any_grad == 0:
            continue  # no rank produced a gradient: leave it None (the optimizer skips it, as in one process)
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p, flag in zip(params, has_grad.tolist()) if flag > 0]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    torch.distributed.all_reduce(flat)
    flat /= world
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset : offset + n].view_as(g))
        offset += n


def on_any_rank(trainer, flag: bool) -> bool:
    """Whether `flag` holds on any process (one all-reduce when several processes train without DeepSpeed)."""
    if trainer.accelerator.num_processes <= 1 or not torch.distributed.is_initialized():
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=trainer.accelerator.device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return bool(t.item() > 0)
