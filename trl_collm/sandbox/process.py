"""Host side of a child process: start it with nothing inherited, write and read its pipes with deadlines (and
reads with size caps), and end it for sure. No call here blocks past its deadline: a child that never reads its
input, or never writes, costs the host its deadline and no more.

Ending: a sandbox is ended by SIGKILL to the init of its PID namespace (bwrap reports that process's host pid on
``--info-fd``); the kernel then kills every process of the namespace, and bwrap, whose only child it was, exits
and is reaped here. Killing bwrap first would orphan the namespace's init, which then waits as a zombie for the
host's PID 1 to reap it (never, in a container whose PID 1 does not reap). Should bwrap not exit, SIGKILL goes to
its process group. Nothing is left on the host's file system: the sandbox writes only to its own tmpfs mounts,
which vanish with its mount namespace, so there is no cleanup that could follow a symlink.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time

__all__ = ["EOF", "TIMEOUT", "TOO_LONG", "Child"]

EOF, TIMEOUT, TOO_LONG = "eof", "timeout", "too_long"


class Child:
    """One child process with piped stdin / stdout (and stderr, read only at the end)."""

    def __init__(
        self, argv: list[str], *, pass_fds: tuple[int, ...] = (), stderr_cap: int = 16384, info_fd: int | None = None
    ):
        self.info_fd = info_fd  # read end of bwrap's --info-fd pipe (owned by this object from now on)
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=pass_fds,
            close_fds=True,
            env={},
            cwd="/",
            start_new_session=True,
            bufsize=0,
        )
        self.pid = self.proc.pid
        self._buf = bytearray()
        self._err = bytearray()
        self._stderr_cap = stderr_cap
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            os.set_blocking(f.fileno(), False)

    # -- writing -----------------------------------------------------------------------------------------------

    def send(self, data: bytes, deadline: float) -> bool | str:
        """Write all of ``data`` to stdin by ``deadline``: True, or EOF (the child is gone; its reply read will say
        why) or TIMEOUT (it did not take the data in time: a pipe holds only 64 KiB, and a child that never reads
        its input would otherwise block the host forever)."""
        try:
            fd = self.proc.stdin.fileno()
        except ValueError:  # stdin already closed
            return EOF
        view = memoryview(data)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return TIMEOUT
            _, ready, _ = select.select([], [fd], [], remaining)
            if not ready:
                continue
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                continue
            except OSError:  # EPIPE: the child closed its input or is gone
                return EOF
        return True

    # -- reading -----------------------------------------------------------------------------------------------

    def _drain_stderr(self) -> None:
        while len(self._err) < self._stderr_cap:
            try:
                chunk = os.read(self.proc.stderr.fileno(), 65536)
            except (BlockingIOError, OSError, ValueError):
                return
            if not chunk:
                return
            self._err += chunk

    def read_line(self, deadline: float, cap: int) -> bytes | str:
        """The next line of stdout (without the newline), or EOF / TIMEOUT / TOO_LONG (a line over ``cap``
        bytes). Stderr is drained meanwhile (up to its cap) so the child never blocks on a full pipe."""
        out = self.proc.stdout.fileno()
        err = self.proc.stderr.fileno()
        while True:
            i = self._buf.find(b"\n")
            if i >= 0:
                if i > cap:
                    return TOO_LONG
                line = bytes(self._buf[:i])
                del self._buf[: i + 1]
                return line
            if len(self._buf) > cap:
                return TOO_LONG
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return TIMEOUT
            fds = [out] + ([err] if len(self._err) < self._stderr_cap else [])
            ready, _, _ = select.select(fds, [], [], remaining)
            if err in ready:
                self._drain_stderr()
            if out in ready:
                try:
                    chunk = os.read(out, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    return EOF
                self._buf += chunk

    def read_all(self, deadline: float, cap: int) -> tuple[bytes, bytes, bool, bool, str | None]:
        """Everything on stdout and stderr until both close: (stdout, stderr, stdout truncated, stderr truncated,
        None | "timeout" | "output_limit"). Stops at the deadline or as soon as either stream passes ``cap``."""
        streams = {self.proc.stdout.fileno(): bytearray(), self.proc.stderr.fileno(): bytearray()}
        open_fds = set(streams)
        reason = None
        while open_fds:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                reason = "timeout"
                break
            ready, _, _ = select.select(list(open_fds), [], [], remaining)
            for fd in ready:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    open_fds.discard(fd)
                    continue
                streams[fd] += chunk
                if len(streams[fd]) > cap:
                    reason = "output_limit"
            if reason:
                break
        out, err = (bytes(b) for b in streams.values())
        return out[:cap], err[:cap], len(out) > cap, len(err) > cap, reason

    def stderr_text(self) -> str:
        self._drain_stderr()
        return self._err.decode("utf-8", "replace")

    # -- ending ------------------------------------------------------------------------------------------------

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _kill_namespace_init(self) -> bool:
        """SIGKILL the sandbox's PID-namespace init; True when it was sent."""
        if self.info_fd is None:
            return False
        try:
            data = os.read(self.info_fd, 65536)  # written by bwrap before it runs anything of the sandbox
            init = int(json.loads(data.split(b"}")[0] + b"}")["child-pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return False
        try:
            pidfd = os.pidfd_open(init)
        except OSError:
            return False
        try:
            # The pid is only ours if it is still bwrap's child (a reaped pid could have been reused).
            with open(f"/proc/{init}/stat", "rb") as f:
                stat = f.read()
            if int(stat[stat.rfind(b")") + 2 :].split()[1]) != self.pid:
                return False
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            return True
        except (OSError, ValueError, IndexError):
            return False
        finally:
            os.close(pidfd)

    def kill(self) -> int | None:
        """End the child (for a sandbox: its PID namespace first), reap it, close the pipes; returns its exit
        status."""
        if self.proc.poll() is None:
            code = None
            if self._kill_namespace_init():
                try:
                    code = self.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
            if code is None:
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # only if the kernel could not deliver SIGKILL
            code = None
        if self.info_fd is not None:
            os.close(self.info_fd)
            self.info_fd = None
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass
        return code

    def wait(self, deadline: float) -> int | None:
        try:
            return self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None
