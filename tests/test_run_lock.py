"""The run lock (trainers/output_dir.py) when the disk fails: a full disk or a read-only one is said with the lock's
path and the fix, the lock is never left empty (a next run would be refused), a lock that cannot be removed never
hides the run's own error, and a retry in the same process is not refused as "another run". Disk failures are
simulated (a patched `open` / `os.remove` / `os.link`), never a real full disk."""

from __future__ import annotations

import builtins
import errno
import json
import os

import pytest
from test_numerics import ok_reward

from trl_collm.trainers import output_dir
from trl_collm.trainers.output_dir import LOCK_FILE, LockWriteError, OutputDirLock


class _FailingWriter:
    """A file whose data never reaches the disk: write or close fails with `code` (as a full disk does)."""

    def __init__(self, real, code: int):
        self.real, self.code = real, code

    def write(self, data):
        raise OSError(self.code, os.strerror(self.code))

    def close(self):
        self.real.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _disk_fails_under(monkeypatch, folder, code: int = errno.ENOSPC) -> None:
    """Files opened for writing under `folder` are created, but their data fails with `code`."""
    real_open, real_fdopen = builtins.open, os.fdopen

    def fake_open(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        if "w" in mode and str(path).startswith(str(folder)):
            return _FailingWriter(f, code)
        return f

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "fdopen", lambda fd, mode="r", *a, **k: _FailingWriter(real_fdopen(fd, mode), code))


@pytest.mark.parametrize("hard_links", [True, False], ids=["linked", "no-hard-links"])
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS], ids=["full", "read-only"])
def test_a_failed_lock_write_names_the_path_and_the_fix_and_leaves_no_lock(tmp_path, monkeypatch, hard_links, code):
    lock = OutputDirLock(str(tmp_path))
    with monkeypatch.context() as m:
        _disk_fails_under(m, tmp_path, code)
        if not hard_links:
            m.setattr(os, "link", lambda *a: (_ for _ in ()).throw(OSError(errno.EPERM, "no hard links here")))
        with pytest.raises(LockWriteError) as info:
            lock.acquire()
    message = str(info.value)
    fix = "free space on that disk" if code == errno.ENOSPC else "remount it read-write"
    assert f"could not write the run lock {tmp_path / LOCK_FILE}" in message and fix in message, message
    assert info.value.errno == code and info.value.filename == str(tmp_path / LOCK_FILE)
    assert os.listdir(tmp_path) == []  # neither an empty lock nor the private file it was written in
    lock.acquire()  # the disk has room again: the next run is not refused
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_lock_that_cannot_be_removed_is_a_warning_and_this_process_takes_it_over(tmp_path, monkeypatch, caplog):
    lock = OutputDirLock(str(tmp_path))
    lock.acquire()
    with monkeypatch.context() as m:
        m.setattr(output_dir.os, "remove", lambda p: (_ for _ in ()).throw(OSError(errno.EROFS, "Read-only")))
        lock.release()  # no exception: it would replace the error of the run that is ending
    assert (tmp_path / LOCK_FILE).exists() and "could not remove the run lock" in caplog.text
    again = OutputDirLock(str(tmp_path))
    again.acquire()  # left by this process, which holds it no more: not "another run (pid <ours>)"
    with pytest.raises(RuntimeError, match=rf"in use by another run \(pid {os.getpid()} on host"):
        OutputDirLock(str(tmp_path)).acquire()  # while `again` holds it, a third run of this process is refused
    again.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_full_disk_at_train_is_said_with_the_lock_path_and_a_retry_runs(
    tmp_path, monkeypatch, make_config, prompts_dataset, qwen_path
):
    from trl_collm import MultiAgentPPOTrainer

    args = make_config(tmp_path)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        _disk_fails_under(m, out)
        with pytest.raises(OSError, match=rf"could not write the run lock {out / LOCK_FILE} \(No space left"):
            tr.train()
    assert not (out / LOCK_FILE).exists()
    assert tr.train().global_step == 2  # the same trainer, in the same process, once the disk has room


def test_a_read_only_disk_mid_run_keeps_the_run_error_and_a_retry_in_this_process_runs(
    tmp_path, monkeypatch, make_config, prompts_dataset, qwen_path
):
    from trl_collm import MultiAgentPPOTrainer

    args = make_config(tmp_path)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    iterate = tr.training_iteration
    real_remove = os.remove

    def read_only_remove(path):
        raise OSError(errno.EROFS, "Read-only file system", path)

    def disk_turns_read_only(rows):
        monkeypatch.setattr(output_dir.os, "remove", read_only_remove)
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "out" / "checkpoint-1"))

    tr.training_iteration = disk_turns_read_only
    with pytest.raises(OSError, match="checkpoint-1"):  # the run's own error, not the lock's removal
        tr.train()
    assert (tmp_path / "out" / LOCK_FILE).exists()  # could not be removed
    monkeypatch.setattr(output_dir.os, "remove", real_remove)
    tr.training_iteration = iterate
    assert tr.train().global_step == 2  # not "in use by another run (pid <this process>)"
    assert not (tmp_path / "out" / LOCK_FILE).exists()
