"""A sandbox takes nothing from its host's per-user quotas (issue 29, part 2).

Some kernel counts are kept per USER, not per process, and a sandbox's user namespace charges each of them to the
trainer's uid as well: a sandboxed program that queued real-time signals left another process of the trainer's user
0-1 of its 32. Here one sandbox tries every way we know to hold such a resource (pending signals by every source,
inotify instances, POSIX message queues, locked memory, pipes and FIFOs, record locks, a new user namespace), then
names itself with a random marker and waits. Once the host sees the marker, it measures, while the sandbox still
holds whatever it got:

* from the sandbox's side, in /proc/<pid> on the host: its count of pending signals (``SigQ``, which is charged to
  the host user too), its inotify and pipe descriptors, its locked memory, its record locks in /proc/locks;
* from a second host process of the same uid: it queues its full 32 real-time signals (its limit set to what the
  user's count was before the sandbox started, plus 32), and opens as many inotify instances as before the sandbox.

Then it kills the sandbox. Every verdict is a count; the waits only guard against a hang.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from trl_collm.sandbox import SandboxUnavailable, require_sandbox, run_python

try:
    require_sandbox()
    _UNAVAILABLE = None
except SandboxUnavailable as err:
    _UNAVAILABLE = str(err)
pytestmark = [
    pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"no sandbox on this machine: {_UNAVAILABLE}"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-user kernel counts are Linux's"),
]

SIGNALS_WANTED = 32

# The attack. It refuses to run unless it is isolated (PID 1 of its own namespace, no /proc, /etc or /home), so a
# broken sandbox cannot let it loose on this machine; it only ever targets itself.
ATTACK = textwrap.dedent(
    """
    import os as _o
    if not (_o.getpid() == 1 and not any(map(_o.path.exists, ('/proc', '/etc', '/home')))):
        raise SystemExit('NOT ISOLATED: the attack refused to run')
    import ctypes, fcntl, json, resource, signal, sys, threading, time
    libc = ctypes.CDLL(None, use_errno=True)
    got = {}

    def attempt(name, fn, times=1):
        ok = 0
        for _ in range(times):
            try:
                if fn() in (-1,):
                    break
                ok += 1
            except (OSError, ValueError):
                break
        got[name] = ok

    catchable = set(range(1, signal.NSIG)) - {signal.SIGKILL, signal.SIGSTOP, 32, 33}
    signal.pthread_sigmask(signal.SIG_BLOCK, catchable)
    for sig in catchable:
        try:
            signal.signal(sig, lambda *a: None)  # a handler, so a blocked signal to an init is not dropped
        except (OSError, ValueError, RuntimeError):
            pass
    me = threading.get_ident()
    # pending signals: real-time ones queue many times, the others once per queue (process and thread)
    for sig in range(signal.SIGRTMIN, signal.SIGRTMAX + 1):
        attempt(f'kill rt {sig}', lambda: _o.kill(1, sig), 256)
        attempt(f'tgkill rt {sig}', lambda: signal.pthread_kill(me, sig), 256)
    for sig in sorted(catchable):
        if sig < signal.SIGRTMIN:
            attempt(f'kill {sig}', lambda: _o.kill(1, sig))
            attempt(f'tgkill {sig}', lambda: signal.pthread_kill(me, sig))
    for which in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF):
        attempt(f'itimer {which}', lambda: signal.setitimer(which, 0.001))
    attempt('lower RLIMIT_CPU', lambda: resource.setrlimit(resource.RLIMIT_CPU, (1, 1000)))
    attempt('lower RLIMIT_FSIZE', lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1, 1 << 40)))
    try:
        with open('/tmp/big', 'wb') as f:
            f.write(b'x' * 4096)  # past a lowered RLIMIT_FSIZE: SIGXFSZ
    except OSError:
        pass
    fifo_fds = []
    def sigpipe_by_fifo():
        _o.mkfifo('/tmp/fifo')
        both = _o.open('/tmp/fifo', _o.O_RDWR)
        w = _o.open('/tmp/fifo', _o.O_WRONLY)
        _o.close(both)
        fifo_fds.append(w)
        _o.write(w, b'x')
    attempt('sigpipe by fifo', sigpipe_by_fifo)
    pipes = []
    def sigpipe_by_pipe():
        r, w = _o.pipe()
        pipes.append((r, w))
        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ: 1 MiB of the user's pipe pages
        _o.close(r)
        _o.write(w, b'x')
    attempt('sigpipe and pipe pages', sigpipe_by_pipe)
    for fd in (0, 1, 2):
        attempt(f'F_SETOWN {fd}', lambda: fcntl.fcntl(fd, fcntl.F_SETOWN, 1))
        attempt(f'F_SETSIG {fd}', lambda: fcntl.fcntl(fd, 10, signal.SIGRTMIN))
        attempt(f'F_SETPIPE_SZ {fd}', lambda: fcntl.fcntl(fd, 1031, 1 << 20))
    # inotify instances and watches, POSIX message queues, locked memory, record locks, user namespaces
    inotify = []
    def one_inotify():
        fd = libc.inotify_init1(0)
        if fd >= 0:
            inotify.append(fd)
            libc.inotify_add_watch(fd, b'/tmp', 0xFFF)
        return fd
    attempt('inotify', one_inotify, 16)
    mq = libc if hasattr(libc, 'mq_open') else ctypes.CDLL('librt.so.1', use_errno=True)  # glibc < 2.34: librt
    attempt('mq_open', lambda: mq.mq_open(b'/trlq', _o.O_CREAT | _o.O_RDWR, 0o600, None), 1)
    buf = ctypes.create_string_buffer(1 << 16)
    attempt('mlock', lambda: libc.mlock(buf, len(buf)))
    attempt('mlockall', lambda: libc.mlockall(3))
    fd = _o.open('/tmp/locks', _o.O_CREAT | _o.O_RDWR)
    _o.write(fd, b'x' * 64)
    attempt('lockf', lambda: fcntl.lockf(fd, fcntl.LOCK_EX, 1, 0), 1)
    attempt('OFD lock', lambda: fcntl.fcntl(fd, 37, bytes(32)), 1)
    attempt('unshare user', lambda: libc.unshare(0x10000000))
    pending = signal.sigpending()
    got['pending (distinct)'] = len(pending)
    print(json.dumps(got), flush=True)
    libc.prctl(15, __MARKER__, 0, 0, 0)  # PR_SET_NAME: the host's cue that everything is held
    while True:
        time.sleep(0.05)
    """
)

BYSTANDER = textwrap.dedent(
    """
    import ctypes, json, os, resource, signal, sys, threading
    limit, want = int(sys.argv[1]), int(sys.argv[2])
    hard = resource.getrlimit(resource.RLIMIT_SIGPENDING)[1]
    resource.setrlimit(resource.RLIMIT_SIGPENDING, (limit, hard))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN})
    queued = 0
    for _ in range(want):
        try:
            signal.pthread_kill(threading.get_ident(), signal.SIGRTMIN)
            queued += 1
        except OSError:
            break
    libc = ctypes.CDLL(None, use_errno=True)
    cap = int(open('/proc/sys/fs/inotify/max_user_instances').read())
    resource.setrlimit(resource.RLIMIT_NOFILE, (cap + 64, max(cap + 64, resource.getrlimit(resource.RLIMIT_NOFILE)[1])))
    instances = 0
    while instances <= cap and libc.inotify_init1(0) >= 0:
        instances += 1
    print(json.dumps({"queued": queued, "inotify": instances}))
    """
)


def _sigq(pid: int | str = "self") -> int:
    """The pending-signal count of a process's user (its own user namespace's level), from /proc/<pid>/status."""
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^SigQ:\s*(\d+)/", f.read(), re.M).group(1))


def _bystander(limit: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", BYSTANDER, str(limit), str(SIGNALS_WANTED)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


def _find(marker: str, runner: threading.Thread) -> int | None:
    """The host pid of the process that named itself ``marker`` (None if the sandbox ended first)."""
    guard = time.monotonic() + 60  # a hang guard only: the verdicts never depend on how long this took
    while runner.is_alive() and time.monotonic() < guard:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() == marker:
                        return int(pid)
            except OSError:
                continue
        time.sleep(0.02)
    return None


def _held(pid: int) -> dict:
    """What the sandbox holds right now, read by the host."""
    fds = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            fds[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
    with open(f"/proc/{pid}/status") as f:
        locked_kb = int(re.search(r"^VmLck:\s*(\d+)", f.read(), re.M).group(1))
    with open("/proc/locks") as f:  # "1: POSIX  ADVISORY  WRITE <pid> <dev:inode> <start> <end>"
        locks = [line for line in f if len(line.split()) > 4 and line.split()[4] == str(pid)]
    return {
        "sigq": _sigq(pid),
        "inotify": sum("inotify" in t for t in fds.values()),
        "pipes_beyond_stdio": sorted({t for fd, t in fds.items() if t.startswith("pipe:") and fd > 2}),
        "locked_kb": locked_kb,
        "locks": locks,
    }


@pytest.fixture(scope="module")
def siege():
    return run_siege()


def run_siege() -> dict:
    """Run the attack; measure from the host while it holds; kill it."""
    base_sigq = _sigq()
    before = _bystander(base_sigq + SIGNALS_WANTED)
    marker = "q" + secrets.token_hex(6)
    result = {}
    runner = threading.Thread(
        target=lambda: result.update(r=run_python(ATTACK.replace("__MARKER__", repr(marker.encode())), timeout=120.0))
    )
    runner.start()
    try:
        pid = _find(marker, runner)
        assert pid is not None, f"the attack never reached its marker: {result.get('r')}"
        held = _held(pid)
        during = _bystander(base_sigq + SIGNALS_WANTED)
        os.kill(pid, signal.SIGKILL)  # the sandbox's init, which this test created
    finally:
        runner.join(timeout=60)
    r = result["r"]
    attempts = json.loads(r.stdout.splitlines()[0])
    return {"before": before, "during": during, "held": held, "attempts": attempts, "stdout": r.stdout}


def test_bystander_keeps_its_real_time_signals(siege):
    assert siege["before"]["queued"] == SIGNALS_WANTED  # the measurement works with no sandbox around
    assert siege["during"]["queued"] == SIGNALS_WANTED, siege


def test_sandbox_holds_no_pending_signal(siege):
    """SigQ of the sandbox counts what it charges the host user; every source was tried (see ATTACK)."""
    assert siege["held"]["sigq"] == 0, siege
    refused = [k for k in siege["attempts"] if k.startswith(("kill", "tgkill", "itimer", "lower", "F_SET"))]
    assert refused and all(siege["attempts"][k] == 0 for k in refused), siege["attempts"]


def test_bystander_keeps_its_inotify_instances(siege):
    assert siege["during"]["inotify"] == siege["before"]["inotify"] > 0, siege
    assert siege["held"]["inotify"] == 0 and siege["attempts"]["inotify"] == 0


def test_sandbox_holds_no_pipe_lock_locked_memory_queue_or_namespace(siege):
    held, tried = siege["held"], siege["attempts"]
    assert held["pipes_beyond_stdio"] == [] and held["locks"] == [] and held["locked_kb"] == 0, held
    assert tried["sigpipe and pipe pages"] == tried["sigpipe by fifo"] == 0
    assert tried["mq_open"] == tried["mlock"] == tried["mlockall"] == 0
    assert tried["lockf"] == tried["OFD lock"] == tried["unshare user"] == 0
