"""Checkpoints that survive a kill: written to a temporary folder, completed with a marker file, then renamed.

A checkpoint `output_dir/checkpoint-<step>/` holds the saved team (loadable like any `save_model()` output) and
`resume_state.pt`: every trainable parameter, the optimizer, the scheduler, the RNG states, the metrics so far and
the trainer's counters, so `train(resume_from_checkpoint=...)` continues exactly where the run stopped. A kill
during a save leaves only a `*.tmp` folder behind; the previous checkpoint stays complete and is the one resumed.

Under DeepSpeed the weights and optimizer state are ZeRO's, partitioned across the processes: every rank writes its
part with the engine's own `save_checkpoint` into `deepspeed/` inside the same folder (output_dir must then be one
folder all ranks can write, as on one machine or a shared filesystem), and a resume loads it back with
`load_checkpoint` under as many processes. Each process's RNG states are kept too (`rng_state_<rank>.pt`).
"""

from __future__ import annotations

import os
import random
import re
import shutil

import numpy as np
import torch

from ..numerics import first_nonfinite, optimizer_state_nonfinite
from . import distributed

MARKER = "CHECKPOINT_COMPLETE"
STATE_FILE = "resume_state.pt"
# Under DeepSpeed: the engine's own checkpoint (ZeRO's partitioned optimizer state and weights, every rank's shard)
ENGINE_DIR = "deepspeed"
ENGINE_TAG = "state"
RANK_RNG_FILE = "rng_state_{rank}.pt"  # each process's RNG states when several processes train
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


def _trainable_shapes(model: torch.nn.Module) -> dict:
    """Name -> full shape of every trainable parameter (ZeRO-3 keeps the full shape in `ds_shape`)."""
    return {n: tuple(getattr(p, "ds_shape", p.shape)) for n, p in model.named_parameters() if p.requires_grad}


def _save_engine_state(trainer, folder: str) -> None:
    """DeepSpeed: every rank writes its part of ZeRO's state (optimizer moments, fp32 weights) with the engine's own
    `save_checkpoint`, and its RNG states; the frozen weights are left out (the team folder and the base hold them)."""
    trainer.accelerator.wait_for_everyone()  # rank 0 has written the team: the folder exists
    if trainer.accelerator.num_processes > 1:
        rank = trainer.accelerator.process_index
        torch.save(_rng_state(), os.path.join(folder, RANK_RNG_FILE.format(rank=rank)))
    if trainer.is_deepspeed_enabled:
        distributed.release_gathered(trainer)  # ZeRO-3: the engine saves partitions, none may be held gathered
        trainer.model_wrapped.save_checkpoint(
            os.path.join(folder, ENGINE_DIR), tag=ENGINE_TAG, save_latest=False, exclude_frozen_parameters=True
        )
    trainer.accelerator.wait_for_everyone()  # every shard is on disk before rank 0 completes the folder


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
    _save_engine_state(trainer, tmp)
    if not trainer.is_world_process_zero():
        return final
    extra = trainer.checkpoint_state()
    deepspeed = trainer.is_deepspeed_enabled
    _save_state(
        {
            # Under DeepSpeed the weights and the optimizer state are ZeRO's, in ENGINE_DIR/ (partitioned across
            # the ranks); only their names and shapes are kept here, for the check that a resume fits this team.
            "params": {} if deepspeed else trainable_state(trainer.model),
            "param_shapes": _trainable_shapes(trainer.model),
            "optimizer": None if deepspeed else trainer.optimizer.state_dict(),
            "world_size": trainer.accelerator.num_processes,
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
    """Restore parameters, optimizer, scheduler, RNG and counters; returns the saved state (its "rng": this
    process's own RNG states)."""
    state = read_state(path)
    _check_resumable_here(trainer, state, path)
    _check_fits_team(trainer, state, path)
    check_same_base(trainer, path)
    if trainer.is_deepspeed_enabled:
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
    else:
        params = dict(trainer.model.named_parameters())
        with torch.no_grad():
            for name, value in state["params"].items():
                params[name].copy_(value.to(params[name].device, params[name].dtype))
        trainer.optimizer.load_state_dict(state["optimizer"])
    if state["scheduler"] is not None and trainer.lr_scheduler is not None:
        trainer.lr_scheduler.load_state_dict(state["scheduler"])
    trainer.load_checkpoint_state(state.get("extra", {}))
    rank_rng = os.path.join(path, RANK_RNG_FILE.format(rank=trainer.accelerator.process_index))
    if trainer.accelerator.num_processes > 1 and os.path.isfile(rank_rng):
        state["rng"] = torch.load(rank_rng, map_location="cpu", weights_only=False)
    set_rng_state(state["rng"])
    return state


def _check_resumable_here(trainer, state: dict, path: str) -> None:
    """A DeepSpeed checkpoint resumes under DeepSpeed with as many processes (ZeRO's shards are per rank); a plain
    one resumes without DeepSpeed."""
    engine_state = os.path.isdir(os.path.join(path, ENGINE_DIR))
    if trainer.is_deepspeed_enabled and not engine_state:
        raise ValueError(
            f"checkpoint {path!r} holds no DeepSpeed state (written without DeepSpeed, or by a version that kept no "
            "ZeRO optimizer state): resume it without DeepSpeed, or start over in another output_dir."
        )
    if not trainer.is_deepspeed_enabled and state["optimizer"] is None:
        raise ValueError(
            f"checkpoint {path!r} was written under DeepSpeed (its optimizer state is ZeRO's, in {ENGINE_DIR}/): "
            "resume it under DeepSpeed with the same number of processes."
        )
    saved_world, world = state.get("world_size"), trainer.accelerator.num_processes
    if trainer.is_deepspeed_enabled and saved_world is not None and saved_world != world:
        raise ValueError(
            f"checkpoint {path!r} was written by {saved_world} DeepSpeed processes and this run has {world}: ZeRO's "
            f"optimizer state is split per process. Resume with {saved_world} processes."
        )


def _check_fits_team(trainer, state: dict, path: str) -> None:
    saved = state.get("param_shapes") or {n: tuple(v.shape) for n, v in state["params"].items()}
    live = _trainable_shapes(trainer.model)
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
    from ..team.saved import TEAM_FILE, read_team_file

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
            raise ValueError(
                f"checkpoint {path!r} was trained with agent {agent!r} on base model {then.get('model')!r}, but "
                f"this run builds it on {now['model']!r}, whose frozen weights differ. Resume on the base the "
                "checkpoint was trained on, or start over in another output_dir."
            )


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
