"""Resuming from a checkpoint (the layout `checkpoints.py` writes): `load_checkpoint` checks that the checkpoint fits
this run (the team's parameters and shapes, the base its adapters were trained on, the global batch, the number of
processes and DeepSpeed), then restores parameters, optimizer, scheduler (the checkpoint's values win, one warning
names what this run asked for instead), the trainer's own state and this process's RNG states. `read_state` reads and
checks `resume_state.pt`; `load_parameters` (load_best_model_at_end) and `load_trainer_state` (best metric, callbacks)
take one part of a checkpoint each.
"""

from __future__ import annotations

import logging
import os

import torch

from ..numerics import first_nonfinite, optimizer_state_nonfinite
from . import distributed, optimizer_state
from .checkpoints import (
    ENGINE_DIR,
    ENGINE_TAG,
    LAYOUT,
    OLD_RANK_RNG_FILE,
    OPTIMIZER_FILE,
    RANK_RNG_FILE,
    RNG_FILE,
    SCHEDULER_FILE,
    STATE_FILE,
    STATE_KEYS,
    set_rng_state,
    trainable_shapes,
)

logger = logging.getLogger(__name__)


def load_checkpoint(trainer, path: str) -> dict:
    """Restore parameters, optimizer, scheduler, RNG and counters; returns the saved state (its "rng": this
    process's own RNG states, None where the checkpoint has none for this process)."""
    state = read_state(path)
    _check_fits_team(trainer, state, path)
    check_same_base(trainer, path)
    _check_same_global_batch(trainer, state, path)
    mode = _resume_mode(trainer, state, path)
    saved_optimizer = None if mode == "state_dict" else _read(path, OPTIMIZER_FILE, optimizer_state_nonfinite)
    if saved_optimizer is not None:
        optimizer_state.check_fits(saved_optimizer, trainer, path)
    changed = _changed_hyperparameters(trainer, saved_optimizer)  # before the checkpoint's values replace ours
    if mode == "engine":
        distributed.release_gathered(trainer)
        loaded, _ = trainer.model_wrapped.load_checkpoint(
            os.path.join(path, ENGINE_DIR),
            tag=ENGINE_TAG,
            load_module_strict=False,  # the frozen weights were not saved: the team was built with them
            load_optimizer_states=True,
            load_lr_scheduler_states=False,  # the scheduler is the trainer's, restored below
        )
        if loaded is None:
            raise ValueError(f"DeepSpeed could not load its state from {os.path.join(path, ENGINE_DIR)!r}.")
    elif mode == "state_dict":  # a checkpoint of the older layout, without DeepSpeed
        _copy_params(trainer, state["params"])
        trainer.optimizer.load_state_dict(state["optimizer"])
    else:
        distributed.release_gathered(trainer)
        optimizer_state.load_full_state(trainer, state["params"], saved_optimizer)
        _say_moved(trainer, state, path)
    scheduler = state["scheduler"] if state.get("layout", 1) < LAYOUT else _read(path, SCHEDULER_FILE)
    _resume_schedule(trainer, scheduler, state, changed, path)
    trainer.load_checkpoint_state(state.get("extra", {}))
    state["rng"] = _rng_for_this_process(trainer, state, path)
    set_rng_state(state["rng"])
    return state


def _say_moved(trainer, state: dict, path: str) -> None:
    """One warning when the checkpoint moved to another number of processes, or into or out of DeepSpeed."""
    saved_world, world = state.get("world_size"), trainer.accelerator.num_processes
    saved_ds = os.path.isdir(os.path.join(path, ENGINE_DIR))
    if (saved_world == world and saved_ds == trainer.is_deepspeed_enabled) or not trainer.is_world_process_zero():
        return
    logger.warning(
        "checkpoint %s was written by %s process(es)%s and this run has %d%s: its weights and optimizer state were "
        "re-partitioned from optimizer.pt (exact); the data position continues; sampled rollouts do not repeat the "
        "old run's draws (docs/deepspeed.md, 'What a resume does')",
        path,
        saved_world,
        " under DeepSpeed" if saved_ds else "",
        world,
        " under DeepSpeed" if trainer.is_deepspeed_enabled else "",
    )


def _copy_params(trainer, params: dict) -> None:
    live = dict(trainer.model.named_parameters())
    with torch.no_grad():
        for name, value in params.items():
            live[name].copy_(value.to(live[name].device, live[name].dtype))


def _resume_mode(trainer, state: dict, path: str) -> str:
    """How this run takes the checkpoint's weights and optimizer state: "engine" (DeepSpeed's own checkpoint, same
    number of processes), "full" (optimizer.pt and the fp32 weights, any number of processes, with or without
    DeepSpeed) or "state_dict" (the older layout's optimizer state dict, without DeepSpeed). Refuses, in one line,
    what cannot resume: a checkpoint of the older layout on another number of processes or across DeepSpeed."""
    engine_state = os.path.isdir(os.path.join(path, ENGINE_DIR))
    saved_world, world = state.get("world_size"), trainer.accelerator.num_processes
    if state.get("layout", 1) >= LAYOUT:
        if trainer.is_deepspeed_enabled and engine_state and saved_world == world:
            return "engine"
        return "full"
    if trainer.is_deepspeed_enabled and not engine_state:
        raise ValueError(
            f"checkpoint {path!r} holds no DeepSpeed state (written without DeepSpeed, or by a version that kept no "
            "ZeRO optimizer state): resume it without DeepSpeed, or start over in another output_dir."
        )
    if not trainer.is_deepspeed_enabled and state["optimizer"] is None:
        raise ValueError(
            f"checkpoint {path!r} was written under DeepSpeed by an older trl-collm (no {OPTIMIZER_FILE}): resume it "
            f"under DeepSpeed with the same number of processes ({saved_world})."
        )
    if trainer.is_deepspeed_enabled and saved_world is not None and saved_world != world:
        raise ValueError(
            f"checkpoint {path!r} was written by {saved_world} DeepSpeed processes and this run has {world}: it is "
            f"of the older layout (no {OPTIMIZER_FILE}), whose ZeRO optimizer state is split per process. Resume "
            f"with {saved_world} processes."
        )
    return "engine" if trainer.is_deepspeed_enabled else "state_dict"


def _check_same_global_batch(trainer, state: dict, path: str) -> None:
    """The data position and the schedule count iterations of `batch_size` episodes (over all processes): another
    global batch would play other rows at each step. A change of world size must keep it."""
    saved, now = state.get("batch_size"), trainer.args.batch_size
    if saved is None or saved == now:
        return
    args, world = trainer.args, trainer.accelerator.num_processes
    per_step = world * args.gradient_accumulation_steps * args.num_mini_batches
    hint = (
        f"per_device_train_batch_size={saved // per_step}"
        if saved % per_step == 0
        else "per_device_train_batch_size and gradient_accumulation_steps"
    )
    raise ValueError(
        f"checkpoint {path!r} trained on {saved} episodes per iteration and this run has {now} "
        f"(per_device_train_batch_size x gradient_accumulation_steps x num_mini_batches x {world} processes): set "
        f"{hint} so that the global batch stays {saved}."
    )


# optimizer group hyperparameter -> the config field that sets it
_FIELDS = {"betas": "adam_beta1/adam_beta2", "eps": "adam_epsilon", "weight_decay": "weight_decay"}


def _changed_hyperparameters(trainer, saved_optimizer: dict | None) -> list[str]:
    """The optimizer hyperparameters this run asks for that differ from the checkpoint's (which will win)."""
    if saved_optimizer is None:
        return []
    changed = []
    for i, (live, saved) in enumerate(zip(trainer.optimizer.param_groups, saved_optimizer["param_groups"])):
        for key, field_name in _FIELDS.items():
            if key in live and key in saved and _differ(live[key], saved[key]):
                changed.append(f"{field_name} (group {i}: checkpoint {saved[key]}, this run {live[key]})")
    return changed


def _differ(a, b) -> bool:
    a, b = (list(x) if isinstance(x, (tuple, list)) else [x] for x in (a, b))
    return len(a) != len(b) or any(abs(float(x) - float(y)) > 1e-12 * max(1.0, abs(float(y))) for x, y in zip(a, b))


def _resume_schedule(trainer, saved: dict | None, state: dict, changed: list[str], path: str) -> None:
    """The checkpoint's scheduler and optimizer win, as in transformers (its base learning rates, its step count);
    one warning names each field of this run that is therefore not applied. The next learning rate is computed from
    the schedule at the restored step, so a run extended with more episodes continues on the stretched schedule
    instead of stepping once at the finished run's last rate (0.0 for a linear decay)."""
    scheduler = trainer.lr_scheduler
    if saved is None or scheduler is None:
        return
    asked = list(getattr(scheduler, "base_lrs", []))
    scheduler.load_state_dict(saved)
    kept = list(getattr(scheduler, "base_lrs", []))
    if _differ(asked, kept):
        changed.insert(0, f"learning_rate (checkpoint {_rates(kept)}, this run {_rates(asked)})")
    if changed and trainer.is_world_process_zero():
        logger.warning(
            "resuming %s: %s differ from the checkpoint; the checkpoint's optimizer and scheduler win (as in "
            "transformers), so training continues with its values. To train with the new ones, start a new run from "
            "the checkpoint's team (model=%r).",
            path,
            "; ".join(changed),
            path,
        )
    if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        # The same formula as LambdaLR.step, at the restored step and with this run's schedule (its length).
        for group, base, fn in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
            group["lr"] = base * fn(scheduler.last_epoch)
        scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
    saved_total, total = state.get("num_total_batches"), trainer.args.num_total_batches
    if saved_total is not None and saved_total != total and trainer.is_world_process_zero():
        logger.warning(
            "resuming %s: the run now has %d iterations (the checkpoint's had %d: total_episodes or max_steps "
            "changed); the learning-rate schedule spans the new length from step %d, next learning rate %s.",
            path,
            total,
            saved_total,
            state["global_step"],
            _rates(scheduler.get_last_lr()),
        )


def _rates(values) -> str:
    values = [float(v) for v in values]
    return f"{values[0]:g}" if len(set(values)) == 1 else "[" + ", ".join(f"{v:g}" for v in values) + "]"


def _rng_for_this_process(trainer, state: dict, path: str) -> dict | None:
    """This process's saved RNG states: its own rank's file; a one-process checkpoint's file for rank 0; the older
    layout's (rank 0's, inside resume_state.pt) otherwise. None, with a warning, for a process the checkpoint never
    had (a resume on more processes): it keeps the stream the run's seed gave it."""
    rank = trainer.accelerator.process_index
    names = [RANK_RNG_FILE.format(rank=rank), OLD_RANK_RNG_FILE.format(rank=rank)]
    if rank == 0:
        names.append(RNG_FILE)
    for name in names:
        if os.path.isfile(os.path.join(path, name)):
            return _read(path, name)
    if state.get("rng") is not None:
        return state["rng"]
    logger.warning(
        "checkpoint %s holds no RNG state for process %d (it was written by %s): this process's sampling starts "
        "from the run's seed",
        path,
        rank,
        state.get("world_size"),
    )
    return None


def _check_fits_team(trainer, state: dict, path: str) -> None:
    saved = state.get("param_shapes") or {n: tuple(v.shape) for n, v in state["params"].items()}
    live = trainable_shapes(trainer.model)
    unknown = [n for n in saved if n not in live]
    untouched = [n for n in live if n not in saved]
    reshaped = [n for n, shape in saved.items() if n in live and tuple(shape) != live[n]]
    if unknown or untouched or reshaped:
        what = (
            f"parameters this team lacks {unknown[:3]}"
            if unknown
            else f"no value for this team's parameters {untouched[:3]}"
            if untouched
            else f"other shapes for {reshaped[:3]}"
        )
        raise ValueError(
            f"checkpoint {path!r} does not match this team ({what}); it was written by a run with other agents, models "
            "or critic settings. Resume with the same configuration, or start over in another output_dir."
        )


def check_same_base(trainer, path: str) -> None:
    """A checkpoint stores only trained weights: resumed onto another base (of the same shapes) it would train on
    silently. Compare each agent's frozen-weight fingerprint with the one the checkpoint's team.json records."""
    from ..team.saved import TEAM_FILE, read_team_file, resolve_base_ref

    needs_base = {a: now for a, now in trainer.base_identity.items() if now["frozen_fingerprint"]}
    if not needs_base:
        return  # nothing frozen (full models) or partitioned (ZeRO-3): the checkpoint holds every weight it needs
    # A missing record is a refusal, never a pass: the trained weights alone cannot say which base they belong to.
    if not os.path.isfile(os.path.join(path, TEAM_FILE)):
        raise ValueError(
            f"checkpoint {path!r} has no {TEAM_FILE}, so the base model its adapters were trained on cannot be "
            f"checked; restore {TEAM_FILE} from a copy of the checkpoint, or start over in another output_dir."
        )
    saved = read_team_file(path).get("base") or {}
    unrecorded = [a for a in needs_base if not (saved.get(a) or {}).get("frozen_fingerprint")]
    if unrecorded:
        raise ValueError(
            f"checkpoint {path!r}'s {TEAM_FILE} records no base fingerprint for agents {unrecorded} (written before "
            "trl-collm recorded one, or under ZeRO-3), so their base cannot be checked; resume with the version "
            "and settings that wrote it, or start over in another output_dir."
        )
    for agent, now in needs_base.items():
        then = saved[agent]
        if then["frozen_fingerprint"] != now["frozen_fingerprint"]:
            was = then.get("model")  # recorded relative to the checkpoint (team/saved.py's portable_model_ref)
            was = resolve_base_ref(was, path) if isinstance(was, str) else was
            raise ValueError(
                f"checkpoint {path!r} was trained with agent {agent!r} on base model {was!r}, but "
                f"this run builds it on {now['model']!r}, whose frozen weights differ. Resume on the base the "
                "checkpoint was trained on, or start over in another output_dir."
            )


def load_parameters(trainer, path: str) -> None:
    """Copy a checkpoint's trainable parameters into the trainer's model (load_best_model_at_end)."""
    _copy_params(trainer, read_state(path)["params"])


def load_trainer_state(state, path: str) -> None:
    """Take the best metric so far and the callbacks' saved states from the checkpoint's trainer_state.json."""
    from transformers import TrainerState

    file = os.path.join(path, "trainer_state.json")
    if not os.path.isfile(file):
        return
    saved = TrainerState.load_from_json(file)
    state.best_metric, state.best_global_step = saved.best_metric, saved.best_global_step
    state.best_model_checkpoint = saved.best_model_checkpoint
    state.stateful_callbacks = saved.stateful_callbacks or state.stateful_callbacks


def _read(path: str, name: str, nonfinite=None):
    """torch.load one file of a checkpoint; a damaged file (or one with NaN/inf, by `nonfinite`) is one line."""
    file = os.path.join(path, name)
    try:
        value = torch.load(file, map_location="cpu", weights_only=False)
    except Exception as e:  # missing, truncated, overwritten, not a torch file: all mean the same to the user
        raise ValueError(
            f"{file!r} cannot be read: the checkpoint is damaged ({type(e).__name__}: {str(e)[:120]}). Delete "
            f"{path!r} and resume from an earlier checkpoint-* folder, or start over."
        ) from None
    bad = nonfinite(value) if nonfinite is not None and isinstance(value, dict) else None
    if bad is not None:
        raise ValueError(
            f"checkpoint {path!r} holds non-finite numbers ({name}: {bad}); it cannot be resumed. Delete it and "
            "resume from an earlier checkpoint-* folder."
        )
    return value


def read_state(path: str) -> dict:
    """Load and check a checkpoint's resume_state.pt: readable, complete, and free of NaN/inf."""
    file = os.path.join(path, STATE_FILE)
    state = _read(path, STATE_FILE)
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(
            f"{file!r} is damaged: it lacks {missing}. Delete {path!r} and resume from another checkpoint."
        )
    bad = first_nonfinite(state["params"].items())
    if bad is None and state["optimizer"] is not None:
        bad = optimizer_state_nonfinite(state["optimizer"])
    if bad is not None:
        raise ValueError(
            f"checkpoint {path!r} holds non-finite numbers ({bad}); it cannot be resumed. Delete it and resume from an "
            "earlier checkpoint-* folder."
        )
    return state
