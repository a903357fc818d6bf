"""Checkpoints that survive a kill: written to a temporary folder, completed with a marker file, then renamed.

A checkpoint `output_dir/checkpoint-<step>/` is laid out as transformers lays out its own, beside the saved team
(loadable like any `save_model()` output):

    optimizer.pt          the optimizer state as one process's torch optimizer holds it (trainers/optimizer_state.py):
                          the same whatever the number of processes, so a run resumes on another world size
    scheduler.pt          the learning-rate scheduler's state dict
    rng_state.pth         the RNG states (python, numpy, cpu, cuda); rng_state_<rank>.pth per process when several
    trainer_state.json    transformers' TrainerState (global_step, log_history, best metric, callbacks)
    resume_state.pt       the trainable weights (fp32), their shapes, the counters, the metrics so far, the
                          trainer's own extra state (value normalisation, MC's generator)
    CHECKPOINT_COMPLETE   written last: a folder without it is never resumed

`train(resume_from_checkpoint=...)` continues exactly where the run stopped (reading a checkpoint back and the checks
before it: trainers/resume.py). A kill during a save leaves only a
`*.tmp` folder behind; the previous checkpoint stays complete and is the one resumed.

Under DeepSpeed every rank also writes its part of ZeRO's own state with the engine's `save_checkpoint` into
`deepspeed/` (output_dir must then be one folder all ranks can write: one machine, or a shared filesystem). A resume
with as many processes loads that (bitwise, and it carries what `optimizer.pt` does not: fp16 loss scaling, offload
buffers); a resume on another number of processes, or without DeepSpeed, writes `optimizer.pt` and the fp32 weights
into the new partitions instead. Checkpoints written before this layout (optimizer, scheduler and RNG inside
resume_state.pt) still resume, on the same number of processes.
"""

from __future__ import annotations

import os
import random
import re
import shutil

import numpy as np
import torch

from ..numerics import first_nonfinite, optimizer_state_nonfinite
from . import distributed, optimizer_state

MARKER = "CHECKPOINT_COMPLETE"
STATE_FILE = "resume_state.pt"
OPTIMIZER_FILE = "optimizer.pt"  # transformers' names
SCHEDULER_FILE = "scheduler.pt"
RNG_FILE = "rng_state.pth"
RANK_RNG_FILE = "rng_state_{rank}.pth"  # each process's RNG states when several processes train
OLD_RANK_RNG_FILE = "rng_state_{rank}.pt"  # before the transformers layout
LAYOUT = 2  # resume_state.pt's "layout": 2 = optimizer / scheduler / RNG in their own files
# Under DeepSpeed: the engine's own checkpoint (ZeRO's partitioned optimizer state and weights, every rank's shard)
ENGINE_DIR = "deepspeed"
ENGINE_TAG = "state"
_NAME = re.compile(r"^checkpoint-(\d+)$")
_ANY_CHECKPOINT = re.compile(r"^checkpoint-\d+(\.tmp|\.old)?$")
# What resume_state.pt always holds (trainers/resume.py refuses a file without one of them)
STATE_KEYS = ("params", "optimizer", "scheduler", "rng", "global_step", "episode", "metrics_history", "log_history")


def _rng_state() -> dict:
    """This process's RNG states, under transformers' keys (its Trainer reads the same file)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict | None) -> None:
    """Restore `_rng_state()`'s dict (also the older one with "torch" for the CPU state); None leaves the RNG as it
    is (a process that the checkpoint has no state for)."""
    if state is None:
        return
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["cpu"] if "cpu" in state else state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_state(model: torch.nn.Module) -> dict:
    return {name: p.detach().cpu().clone() for name, p in model.named_parameters() if p.requires_grad}


def trainable_shapes(model: torch.nn.Module) -> dict:
    """Name -> full shape of every trainable parameter (ZeRO-3 keeps the full shape in `ds_shape`)."""
    return {n: tuple(getattr(p, "ds_shape", p.shape)) for n, p in model.named_parameters() if p.requires_grad}


def _save_engine_state(trainer, folder: str) -> tuple[dict, dict] | None:
    """Every rank: its RNG states and, under DeepSpeed, its part of ZeRO's state (optimizer moments, fp32 weights)
    with the engine's own `save_checkpoint` (the frozen weights are left out: the team folder and the base hold
    them). Then the world-size-free weights and optimizer state (a collective under DeepSpeed), which only rank 0
    receives."""
    trainer.accelerator.wait_for_everyone()  # rank 0 has written the team: the folder exists
    if trainer.accelerator.num_processes > 1:
        rank = trainer.accelerator.process_index
        torch.save(_rng_state(), os.path.join(folder, RANK_RNG_FILE.format(rank=rank)))
    if trainer.is_deepspeed_enabled:
        distributed.release_gathered(trainer)  # ZeRO-3: the engine saves partitions, none may be held gathered
        trainer.model_wrapped.save_checkpoint(
            os.path.join(folder, ENGINE_DIR), tag=ENGINE_TAG, save_latest=False, exclude_frozen_parameters=True
        )
    distributed.release_gathered(trainer)  # the save may have gathered (ZeRO-3's consolidated team)
    full = optimizer_state.full_state(trainer)
    trainer.accelerator.wait_for_everyone()  # every shard is on disk before rank 0 completes the folder
    return full


def save_checkpoint(trainer, output_dir: str) -> str:
    """Write checkpoint-<global_step> atomically; returns its path. Refuses (FloatingPointError, nothing written)
    when a trainable parameter or the optimizer state holds NaN/inf: a poisoned checkpoint would be resumed."""
    step = trainer.state.global_step
    bad = first_nonfinite((n, p.detach()) for n, p in trainer.model.named_parameters() if p.requires_grad)
    if bad is None and not trainer.is_deepspeed_enabled:
        bad = optimizer_state_nonfinite(trainer.optimizer.state_dict())
    if bad is not None:
        raise FloatingPointError(
            f"not writing checkpoint-{step}: {bad} holds NaN/inf. The last complete checkpoint in {output_dir!r} "
            "is still good to resume from; lower the learning rate or check the rewards."
        )
    final = os.path.join(output_dir, f"checkpoint-{step}")
    tmp = f"{final}.tmp"
    if trainer.is_world_process_zero():
        shutil.rmtree(tmp, ignore_errors=True)
    # the team, loadable on its own (all ranks join: DeepSpeed gathers weights here); never pushed from here
    trainer.save_model(tmp, _internal_call=True)
    full = _save_engine_state(trainer, tmp)
    if not trainer.is_world_process_zero():
        return final
    params, optimizer = full
    _save_state(optimizer, os.path.join(tmp, OPTIMIZER_FILE))
    scheduler = trainer.lr_scheduler.state_dict() if trainer.lr_scheduler is not None else None
    _save_state(scheduler, os.path.join(tmp, SCHEDULER_FILE))
    if trainer.accelerator.num_processes == 1:
        _save_state(_rng_state(), os.path.join(tmp, RNG_FILE))
    _save_state(
        {
            "layout": LAYOUT,
            "params": params,  # fp32, whole (gathered from ZeRO's partitions under DeepSpeed)
            "param_shapes": trainable_shapes(trainer.model),
            "optimizer": None,  # in OPTIMIZER_FILE
            "scheduler": None,  # in SCHEDULER_FILE
            "rng": None,  # in RNG_FILE / RANK_RNG_FILE
            "world_size": trainer.accelerator.num_processes,
            "batch_size": trainer.args.batch_size,  # episodes per iteration over all processes
            "num_total_batches": trainer.args.num_total_batches,
            "global_step": step,
            "episode": trainer.state.episode,
            "metrics_history": trainer.metrics_history,
            "log_history": trainer.state.log_history,
            "extra": trainer.checkpoint_state(),
        },
        os.path.join(tmp, STATE_FILE),
    )
    trainer.state.save_to_json(os.path.join(tmp, "trainer_state.json"))
    with open(os.path.join(tmp, MARKER), "w") as f:
        f.write(str(step))
    # Swap in the finished folder; an older folder of the same step (a rerun) is moved aside first.
    if os.path.exists(final):
        old = f"{final}.old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _rotate(output_dir, trainer.args.save_total_limit, keep=trainer.state.best_model_checkpoint)
    return final


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a quota): the run's environment, not a bug; the CLI prints it
    as one line."""


def _save_state(state: dict, path: str) -> None:
    """torch.save, with a full disk said as such: torch reports it as `enforce fail ... unexpected pos`."""
    try:
        torch.save(state, path)
    except (RuntimeError, OSError) as e:
        folder = os.path.dirname(path)
        shutil.rmtree(folder, ignore_errors=True)  # the unfinished .tmp checkpoint: never resumed, only space
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointWriteError(
            f"writing {path} failed ({first[:200]}): is the disk full? Free space in "
            f"{os.path.dirname(folder) or '.'}; its last complete checkpoint is still good to resume from"
        ) from e


def complete_checkpoints(output_dir: str) -> list[str]:
    """Finished checkpoints, oldest first (folders without the marker are ignored)."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        m = _NAME.match(name)
        path = os.path.join(output_dir, name)
        if m and os.path.isfile(os.path.join(path, MARKER)):
            found.append((int(m.group(1)), path))
    return [p for _, p in sorted(found)]


def _rotate(output_dir: str, limit: int | None, keep: str | None = None) -> None:
    """Keep the newest `limit` checkpoints, and `keep` (the best one) besides them, as transformers does."""
    if not limit or limit < 1:
        return
    found = complete_checkpoints(output_dir)
    kept = {os.path.normpath(p) for p in found[-limit:]} | ({os.path.normpath(keep)} if keep else set())
    for path in found:
        if os.path.normpath(path) not in kept:
            shutil.rmtree(path, ignore_errors=True)


def refuse_to_clobber(output_dir: str, overwrite: bool, delete: bool = True) -> None:
    """A run that does not resume must not mix its checkpoints with an older run's (the transformers convention):
    refuse, or with `overwrite` delete the old checkpoint-* folders (nothing else in output_dir is touched).
    Every process checks, so all of them refuse together; only the one with `delete` removes folders."""
    if not os.path.isdir(output_dir):
        return
    old = sorted(n for n in os.listdir(output_dir) if _ANY_CHECKPOINT.match(n))
    if not old:
        return
    if not overwrite:
        raise ValueError(
            f"output_dir {output_dir!r} already holds checkpoints "
            f"({', '.join(old[:3])}{', ...' if len(old) > 3 else ''}) "
            "from an earlier run. Pass `resume_from_checkpoint=True` (CLI: --resume_from_checkpoint true) to "
            "continue it, "
            "or `overwrite_output_dir=True` (--overwrite_output_dir) to delete them and start over, or choose another "
            "output_dir."
        )
    if delete:
        for name in old:
            shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)


def resolve(resume_from_checkpoint, output_dir: str) -> str | None:
    """The checkpoint folder to resume from: None, a folder, or True (also the strings 'true' / 'True', as the
    command line gives it) for the newest complete one in output_dir."""
    if isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.strip().lower() in ("true", "false", ""):
        resume_from_checkpoint = resume_from_checkpoint.strip().lower() == "true"
    if not resume_from_checkpoint:
        return None
    if resume_from_checkpoint is True:
        found = complete_checkpoints(output_dir)
        if not found:
            raise ValueError(f"`resume_from_checkpoint=True` but {output_dir!r} holds no complete checkpoint-* folder.")
        return found[-1]
    path = str(resume_from_checkpoint)
    if not os.path.isfile(os.path.join(path, MARKER)):
        raise ValueError(
            f"`resume_from_checkpoint`={path!r} is not a complete checkpoint (no {MARKER} file); pass another "
            "checkpoint-* folder or True for the latest complete one."
        )
    return path
