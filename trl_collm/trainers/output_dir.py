"""The output_dir of a run: writable before training starts, and held by one run at a time.

A run takes `output_dir/.trl_collm.lock` (its pid, host and start time) for the whole of `train()`; a second run
into the same folder is refused with the holder's pid and host. A lock left by a crashed run on this host (its pid
no longer alive) is taken over; a lock from another host is only ever removed by hand, since no process here can
tell whether that run is alive. A lock this process left behind (a run that failed and could not remove it, e.g. on
a disk turned read-only) is taken over by the next run of this process, unless a run of this process holds it now.

The lock is never left empty by us: its content is written to a private file first and linked into place (one
atomic, exclusive step); where the filesystem has no hard links, a write that fails removes the created file. A
write that fails (a full disk, a read-only one) is said with the lock's path and what to do; a lock that cannot be
removed at the end is a warning, never an error that would hide the run's own.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import tempfile
import time

from . import distributed

logger = logging.getLogger(__name__)

LOCK_FILE = ".trl_collm.lock"
# A lock file still empty after this long was left by a process killed between creating and writing it.
_EMPTY_LOCK_STALE_S = 60.0
# The locks this process holds now (real paths): a lock naming this pid but not in here was left by an earlier run
# of this process, which ended without removing it.
_HELD_HERE: set[str] = set()


class LockWriteError(OSError):
    """The run lock could not be written (a full disk, a read-only one): said with its path and the fix."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def _write_failed(path: str, e: OSError) -> LockWriteError:
    reason = e.strerror or str(e)
    fix = {
        errno.ENOSPC: "free space on that disk (checkpoints and the team are saved there too)",
        errno.EDQUOT: "free space within your disk quota there",
        errno.EROFS: "the filesystem is read-only: remount it read-write",
    }.get(e.errno, "fix that folder's permissions")
    return LockWriteError(
        e.errno,
        f"could not write the run lock {path} ({reason}); {fix}, or choose another output_dir, and run again",
        path,
    )


def check_writable(output_dir: str) -> None:
    """Create output_dir and write a file in it; refuse with the folder named when that cannot be done."""
    try:
        os.makedirs(output_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=output_dir, prefix=".write_test_"):
            pass
    except OSError as e:
        fix = "free space there" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "fix its permissions"
        raise PermissionError(
            f"output_dir {output_dir!r} is not a writable folder ({type(e).__name__}: {e.strerror or e}); checkpoints "
            f"and the team could not be saved there. Choose another output_dir or {fix}."
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
            if self._create():
                self.held = True
                _HELD_HERE.add(os.path.realpath(self.path))
                return
            holder = self._holder()
            if self._stale(holder):
                try:
                    _remove(self.path)
                except OSError as e:
                    raise _write_failed(self.path, e) from None
                continue
            raise RuntimeError(self._busy_message(holder))
        raise RuntimeError(self._busy_message(self._holder()))

    def _create(self) -> bool:
        """Create the lock with its content in one exclusive step; False when a lock is already there."""
        content = json.dumps({**self.me, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")})
        private = f"{self.path}.{self.me['pid']}.{id(self)}"
        try:
            try:
                with open(private, "w") as f:
                    f.write(content)
                os.link(private, self.path)
                return True
            except FileExistsError:
                return False
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                    raise
            return self._create_in_place(content)  # a filesystem without hard links
        except LockWriteError:
            raise
        except OSError as e:
            raise _write_failed(self.path, e) from None
        finally:
            _remove(private, quiet=True)

    def _create_in_place(self, content: str) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        try:
            with os.fdopen(fd, "w") as f:
                f.write(content)
        except OSError as e:
            _remove(self.path, quiet=True)  # never an empty lock that would refuse the next run
            raise _write_failed(self.path, e) from None
        return True

    def release(self) -> None:
        """Remove our own lock (never one another run took over). A removal that fails is a warning: it must not
        replace the error a failed run is raising, and the next run of this process takes the lock over."""
        if not self.held:
            return
        self.held = False
        _HELD_HERE.discard(os.path.realpath(self.path))
        holder = self._holder()
        if (holder.get("pid"), holder.get("host")) != (self.me["pid"], self.me["host"]):
            return
        try:
            _remove(self.path)
        except OSError as e:
            logger.warning(
                "could not remove the run lock %s (%s); the next run of this process takes it over, another "
                "process refuses it while this one lives: delete it by hand once this process has ended",
                self.path,
                e.strerror or e,
            )

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
        if holder["pid"] == self.me["pid"]:  # ours: stale unless a run of this process holds it now
            return os.path.realpath(self.path) not in _HELD_HERE
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


def _remove(path: str, quiet: bool = False) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError:
        if not quiet:
            raise
