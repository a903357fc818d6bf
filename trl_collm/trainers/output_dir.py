"""The output_dir of a run: writable before training starts, and held by one run at a time.

A run takes `output_dir/.trl_collm.lock` (its pid, host and start time, created exclusively) for the whole of
`train()`; a second run into the same folder is refused with the holder's pid and host. A lock left by a crashed
run on this host (its pid no longer alive) is taken over; a lock from another host is only ever removed by hand,
since no process here can tell whether that run is alive.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time

from . import distributed

LOCK_FILE = ".trl_collm.lock"
# A lock file still empty after this long was left by a process killed between creating and writing it.
_EMPTY_LOCK_STALE_S = 60.0


def check_writable(output_dir: str) -> None:
    """Create output_dir and write a file in it; refuse with the folder named when that cannot be done."""
    try:
        os.makedirs(output_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=output_dir, prefix=".write_test_"):
            pass
    except OSError as e:
        raise PermissionError(
            f"output_dir {output_dir!r} is not a writable folder ({type(e).__name__}: {e.strerror or e}); checkpoints "
            "and the team could not be saved there. Choose another output_dir or fix its permissions."
        ) from None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


class OutputDirLock:
    """`acquire()` / `release()` the run lock of one output_dir (the main process of a run holds it)."""

    def __init__(self, output_dir: str):
        self.path = os.path.join(output_dir, LOCK_FILE)
        self.me = {"pid": os.getpid(), "host": socket.gethostname()}
        self.held = False

    def acquire(self) -> None:
        for _ in range(3):  # a stale lock is removed and the exclusive create tried again
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if self._stale(holder):
                    _remove(self.path)
                    continue
                raise RuntimeError(self._busy_message(holder)) from None
            with os.fdopen(fd, "w") as f:
                json.dump({**self.me, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}, f)
            self.held = True
            return
        raise RuntimeError(self._busy_message(self._holder()))

    def release(self) -> None:
        holder = self._holder()
        if self.held and (holder.get("pid"), holder.get("host")) == (self.me["pid"], self.me["host"]):
            _remove(self.path)  # only our own lock: never one another run took over
        self.held = False

    def _holder(self) -> dict:
        try:
            with open(self.path) as f:
                holder = json.load(f)
            return holder if isinstance(holder, dict) else {}
        except (OSError, ValueError):
            return {}

    def _stale(self, holder: dict) -> bool:
        if not holder:  # empty or unreadable: stale once old enough that no writer is still at it
            try:
                return time.time() - os.path.getmtime(self.path) > _EMPTY_LOCK_STALE_S
            except OSError:
                return True  # gone meanwhile
        if holder.get("host") != self.me["host"] or not isinstance(holder.get("pid"), int):
            return False
        return not _alive(holder["pid"])

    def _busy_message(self, holder: dict) -> str:
        who = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, since {holder.get('started', '?')}"
        return (
            f"output_dir {os.path.dirname(self.path)!r} is in use by another run ({who}): two runs would overwrite "
            f"each other's checkpoints. Wait for it to finish or choose another output_dir; if that run is gone "
            f"(e.g. it ran on another host and was killed), delete {self.path!r}."
        )


def claim_output_dir(trainer) -> OutputDirLock:
    """Before anything is trained: output_dir must be writable (every process checks; a failure at the first
    save would come after hours), and this run alone may use it (the main process takes the lock). Every
    process raises together, so none waits in a collective for the others."""
    folder = trainer.args.output_dir
    lock = OutputDirLock(folder)
    problem = None
    try:
        check_writable(folder)
        if trainer.is_world_process_zero():
            lock.acquire()
    except (OSError, RuntimeError) as e:
        problem = e
    if distributed.on_any_rank(trainer, problem is not None):
        lock.release()
        if problem is not None:
            raise problem
        raise RuntimeError(f"another process of this run could not use output_dir {folder!r}; see its error.")
    _check_shared(trainer, lock)
    return lock


def _check_shared(trainer, lock: OutputDirLock) -> None:
    """Checkpoints are one folder written by every process (DeepSpeed's shards, the main process's state and team):
    on several nodes output_dir must be the same folder for all of them (a shared filesystem). A node whose
    output_dir is its own local disk does not see the lock file the main process just wrote: refuse, on every
    process together, before anything is trained (a per-node folder would fail at the first save, or leave
    checkpoints no node can resume from)."""
    if trainer.accelerator.num_processes <= 1 or trainer.args.save_strategy in ("no", None):
        return
    unseen = not os.path.isfile(lock.path)
    if distributed.on_any_rank(trainer, unseen):  # after the main process wrote the lock (the previous all-reduce)
        lock.release()
        raise RuntimeError(
            f"output_dir {trainer.args.output_dir!r} is not one folder for every process: "
            f"{'this process' if unseen else 'a process on another node'} does not see the lock file the main "
            "process wrote in it. Checkpoints need a folder all nodes mount (a shared filesystem); or set "
            "save_strategy='no' and save the team with save_model() (the global main process writes it)."
        )


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
