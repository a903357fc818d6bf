"""Checkpoints that survive a kill: written to a temporary folder, completed with a marker file, then renamed.

A checkpoint `output_dir/checkpoint-<step>/` holds the saved team (loadable like any `save_model()` output) and
`resume_state.pt`: every trainable parameter, the optimizer, the scheduler, the RNG states, the metrics so far and
the trainer's counters, so `train(resume_from_checkpoint=...)` continues exactly where the run stopped. A kill
during a save leaves only a `*.tmp` folder behind; the previous checkpoint stays complete and is the one resumed.
"""

from __future__ import annotations

import os
import random
import re
import shutil

import numpy as np
import torch

from ..numerics import first_nonfinite, optimizer_state_nonfinite

MARKER = "CHECKPOINT_COMPLETE"
STATE_FILE = "resume_state.pt"
_NAME = re.compile(r"^checkpoint-(\d+)$")
_ANY_CHECKPOINT = re.compile(r"^checkpoint-\d+(\.tmp|\.old)?$")
_STATE_KEYS = ("params", "optimizer", "scheduler", "rng", "global_step", "episode", "metrics_history", "log_history")


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_state(model: torch.nn.Module) -> dict:
    return {name: p.detach().cpu().clone() for name, p in model.named_parameters() if p.requires_grad}


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
    if not trainer.is_world_process_zero():
        return final
    extra = trainer.checkpoint_state()
    _save_state(
        {
            "params": trainable_state(trainer.model),
            # ZeRO shards the optimizer state across ranks: a rank-0 copy could not resume, so none is kept.
            "optimizer": None if trainer.is_deepspeed_enabled else trainer.optimizer.state_dict(),
            "scheduler": trainer.lr_scheduler.state_dict() if trainer.lr_scheduler is not None else None,
            "rng": _rng_state(),
            "global_step": step,
            "episode": trainer.state.episode,
            "metrics_history": trainer.metrics_history,
            "log_history": trainer.state.log_history,
            "extra": extra,
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


def load_checkpoint(trainer, path: str) -> dict:
    """Restore parameters, optimizer, scheduler, RNG and counters; returns the saved state."""
    state = read_state(path)
    if trainer.is_deepspeed_enabled or state["optimizer"] is None:
        raise ValueError(
            "`resume_from_checkpoint` is not supported under DeepSpeed yet (ZeRO shards the optimizer state); the "
            f"checkpoint's team in {path!r} loads as a model folder, or resume without DeepSpeed from a "
            "non-DeepSpeed run."
        )
    params = dict(trainer.model.named_parameters())
    unknown = [n for n in state["params"] if n not in params]
    untouched = [n for n, p in params.items() if p.requires_grad and n not in state["params"]]
    reshaped = [n for n, v in state["params"].items() if n in params and tuple(v.shape) != tuple(params[n].shape)]
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
    with torch.no_grad():
        for name, value in state["params"].items():
            params[name].copy_(value.to(params[name].device, params[name].dtype))
    trainer.optimizer.load_state_dict(state["optimizer"])
    if state["scheduler"] is not None and trainer.lr_scheduler is not None:
        trainer.lr_scheduler.load_state_dict(state["scheduler"])
    trainer.load_checkpoint_state(state.get("extra", {}))
    set_rng_state(state["rng"])
    return state


def load_parameters(trainer, path: str) -> None:
    """Copy a checkpoint's trainable parameters into the trainer's model (load_best_model_at_end)."""
    state = read_state(path)
    params = dict(trainer.model.named_parameters())
    with torch.no_grad():
        for name, value in state["params"].items():
            params[name].copy_(value.to(params[name].device, params[name].dtype))


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


def read_state(path: str) -> dict:
    """Load and check a checkpoint's resume_state.pt: readable, complete, and free of NaN/inf."""
    file = os.path.join(path, STATE_FILE)
    try:
        state = torch.load(file, map_location="cpu", weights_only=False)
    except Exception as e:  # truncated, overwritten, not a torch file: all mean the same to the user
        raise ValueError(
            f"{file!r} cannot be read: the checkpoint is damaged ({type(e).__name__}: {str(e)[:120]}). Delete "
            f"{path!r} and resume from an earlier checkpoint-* folder, or start over."
        ) from None
    missing = [k for k in _STATE_KEYS if not isinstance(state, dict) or k not in state]
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
