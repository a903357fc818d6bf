"""``run_python``: run a whole untrusted program in a fresh sandbox and report what happened (exit status, capped
output, time-out, memory error, syntax error). The code task does not use it for scoring (``run_tests`` does);
it is the general entry point and what the attack suite drives."""

from __future__ import annotations

import json
import math
import signal
import time
from dataclasses import dataclass

from .bwrap import Limits, isolation
from .pool import start

__all__ = ["SandboxResult", "run_python"]

_TRUNCATION_MARKER = "\n...[output truncated by the sandbox after {n} bytes]"
_SYNTAX_MARKER = "__trl_collm_sandbox_syntax_error__ "


@dataclass
class SandboxResult:
    """What happened to one ``run_python`` call."""

    ok: bool  # exited with status 0, not killed, not timed out
    returncode: int | None  # the program's exit status; 128 + N when signal N ended it
    stdout: str
    stderr: str
    timed_out: bool = False
    killed_reason: str | None = None  # "timeout" | "output_limit" | "cpu_limit" | "signal:<NAME>" | None
    duration: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    memory_error: bool = False  # the program died of a MemoryError (hit the memory limit)
    syntax_error: dict | None = None  # {"line", "offset", "message", "text"} when the code did not compile
    isolation: tuple[str, ...] = ()  # the layers applied, e.g. ("bwrap", "userns", "pidns", ..., "seccomp")
    pid: int | None = None  # the sandbox's bwrap process on the host (gone when this returns)


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)


def run_python(
    code: str,
    timeout: float = 5.0,
    memory_mb: int = 512,
    cpu_seconds: int | None = None,
    max_output_bytes: int = 65536,
    *,
    tmp_mb: int = 16,
    shm_mb: int = 4,
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in a new sandbox (see docs/security.md) and wait at most ``timeout`` seconds.

    ``memory_mb`` caps the sandbox's address space, ``cpu_seconds`` its CPU time (default: the timeout rounded
    up, plus one), ``tmp_mb`` / ``shm_mb`` the sizes of its private ``/tmp`` and ``/dev/shm``. Stdout and stderr
    are kept up to ``max_output_bytes`` each; past that the sandbox is ended (``killed_reason="output_limit"``).
    """
    if not timeout > 0:
        raise ValueError(f"run_python: timeout must be > 0 seconds, got {timeout!r}.")
    cpu = int(cpu_seconds) if cpu_seconds is not None else math.ceil(timeout) + 1
    limits = Limits(memory_mb=int(memory_mb), tmp_mb=int(tmp_mb), shm_mb=int(shm_mb), cpu_seconds=cpu)
    begin = time.monotonic()
    child = start(limits)
    try:
        # Not taken by the deadline: the reads below find the deadline passed and report a time-out.
        child.send(
            (json.dumps({"mode": "script", "code": code}) + "\n").encode("utf-8", "surrogatepass"), begin + timeout
        )
        try:
            child.proc.stdin.close()
        except OSError:
            pass
        out, err, out_cut, err_cut, reason = child.read_all(begin + timeout, max_output_bytes)
        code_ = child.wait(begin + timeout) if reason is None else None
        if code_ is None and reason is None:
            reason = "timeout"
    finally:
        final = child.kill()
    returncode = code_ if reason is None else final
    stdout = out.decode("utf-8", "replace") + (_TRUNCATION_MARKER.format(n=max_output_bytes) if out_cut else "")
    stderr = err.decode("utf-8", "replace") + (_TRUNCATION_MARKER.format(n=max_output_bytes) if err_cut else "")
    killed = reason
    if killed is None and returncode is not None and returncode != 0:
        # bwrap reports a program ended by signal N as 128 + N (and a negative code is bwrap itself killed).
        signum = returncode - 128 if returncode > 128 else (-returncode if returncode < 0 else None)
        if signum in (signal.SIGXCPU, signal.SIGKILL) and cpu_seconds is not None:
            killed = "cpu_limit"
        elif signum is not None:
            killed = "cpu_limit" if signum == signal.SIGXCPU else f"signal:{_signal_name(signum)}"
    syntax_error = None
    for line in stderr.splitlines():
        if line.startswith(_SYNTAX_MARKER):
            try:
                syntax_error = json.loads(line[len(_SYNTAX_MARKER) :])
            except ValueError:
                pass
    tail = stderr.strip().splitlines()[-1:] if stderr.strip() else []
    return SandboxResult(
        ok=reason is None and returncode == 0,
        returncode=returncode,
        stdout=stdout,
        stderr=stderr,
        timed_out=reason == "timeout",
        killed_reason=killed,
        duration=time.monotonic() - begin,
        stdout_truncated=out_cut,
        stderr_truncated=err_cut,
        memory_error=bool(tail) and tail[0].startswith("MemoryError"),
        syntax_error=syntax_error,
        isolation=isolation(),
        pid=child.pid,
    )
