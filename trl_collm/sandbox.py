"""Run untrusted, model-written Python in a separate, resource-limited process.

This is the ONLY place where code produced by a policy is executed. Layers, outermost first:

1. **A separate process** (``python -I -S -B``: isolated mode, no site-packages, no bytecode files) in a fresh
   temporary directory, its own session / process group, a minimal environment (no proxies, ``HOME`` = the temp
   dir). The parent enforces a wall-clock timeout, caps what it reads from stdout/stderr (reading incrementally and
   killing the process when the cap is hit), and always ends with ``killpg(SIGKILL)`` of the whole group plus a
   ``/proc`` sweep of the session, then removes the temp dir.
2. **Kernel limits**, set by the in-process bootstrap before any model code runs: ``RLIMIT_AS`` (memory),
   ``RLIMIT_CPU``, ``RLIMIT_NPROC``, ``RLIMIT_FSIZE`` (file size), ``RLIMIT_CORE`` = 0, ``RLIMIT_NOFILE``. They are
   set in the child rather than in a ``preexec_fn`` because ``preexec_fn`` is documented as unsafe in a
   multi-threaded parent, and a trainer process (torch, tokenizers) always is.
3. **Best effort OS isolation** when available: a fresh network namespace (no interfaces but a down loopback), and,
   when the parent runs as root, dropping to ``nobody`` (so ``RLIMIT_NPROC`` is actually enforced -- the kernel
   ignores it for root -- and file permissions protect the host). Each layer that was really applied is listed in
   ``SandboxResult.isolation``.
4. **In-process guards** (the bootstrap): ``os.fork``/``forkpty``/``exec*``/``spawn*``/``posix_spawn``/``system``/
   ``popen``, ``subprocess.Popen``, ``_posixsubprocess.fork_exec``, ``multiprocessing`` process start, ``os.kill``
   and ``setsid``/``setpgid`` raise ``PermissionError``; ``socket.socket``/``create_connection``/``socketpair``/
   ``fromfd`` refuse; ``open``/``os.open``/``io.FileIO``/``os.remove``/``os.rename``/``os.mkdir``/``shutil.rmtree``/...
   refuse to write or delete outside the sandbox directory; ``ctypes`` and ``resource`` cannot be imported.

Layer 4 is defence in depth, **not a security boundary**: Python code running in a process can always find a way
around monkeypatches (e.g. by digging the original functions out of closures). Layers 1-3 are what actually contain
a hostile program, and even they are weaker than a VM or a container with seccomp. Run untrusted code at scale inside
such a VM/container as well.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["SandboxResult", "TestOutcome", "TestReport", "run_python", "run_tests", "split_tests"]

_NOBODY = 65534
_TRUNCATION_MARKER = "\n...[output truncated by the sandbox after {n} bytes]"
_SYNTAX_MARKER = "__trl_collm_sandbox_syntax_error__ "
_SYNTAX_EXIT = 3


@dataclass
class SandboxResult:
    """What happened to one ``run_python`` call."""

    ok: bool  # exited with status 0, not killed, not timed out
    returncode: int | None  # negative = killed by that signal
    stdout: str
    stderr: str
    timed_out: bool = False
    killed_reason: str | None = None  # "timeout" | "output_limit" | "cpu_limit" | "signal:<NAME>" | None
    duration: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    memory_error: bool = False  # the program died of a MemoryError (hit the memory limit)
    syntax_error: dict | None = None  # {"line", "offset", "message", "text"} when the code did not compile
    isolation: tuple[str, ...] = ()  # layers actually applied, e.g. ("rlimits", "guards", "netns", "uid:nobody")
    pid: int | None = None  # the sandbox process (= its session and process-group id), for diagnostics
    workdir: str | None = None  # the temp dir it ran in (already removed)


# ----------------------------------------------------------------------------------------------------------------
# The bootstrap: first thing the child runs. Kept as source text because it executes in another interpreter.
# Everything lives inside one function so that, once it returns, no module-level name exposes the originals.
# ----------------------------------------------------------------------------------------------------------------

_BOOTSTRAP = r'''
def _trl_collm_sandbox():
    import builtins, io, _io, json, os, posix, sys
    cfg = json.loads(sys.argv[1])
    root = os.path.realpath(cfg["dir"])
    applied = []

    # --- network namespace (before dropping privileges: needs CAP_SYS_ADMIN or a user namespace) -------------
    if cfg["netns"]:
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
            if libc.unshare(CLONE_NEWNET) == 0:
                applied.append("netns")
            else:
                uid, gid = os.getuid(), os.getgid()
                if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
                    # Map our ids to themselves, else files we create would belong to the overflow uid.
                    for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"),
                                       ("/proc/self/gid_map", f"{gid} {gid} 1")):
                        try:
                            with open(path, "w") as f:
                                f.write(text)
                        except OSError:
                            pass
                    applied.append("netns")
        except Exception:
            pass
        for name in ("ctypes", "_ctypes", "ctypes._endian"):
            sys.modules.pop(name, None)

    # --- drop root -------------------------------------------------------------------------------------------
    if cfg["uid"] is not None:
        uid = gid = cfg["uid"]
        for dirpath, dirnames, filenames in os.walk(root):
            for name in [dirpath] + [os.path.join(dirpath, n) for n in dirnames + filenames]:
                os.chown(name, uid, gid)
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        applied.append("uid:nobody")

    # --- kernel limits ---------------------------------------------------------------------------------------
    import resource
    def limit(which, value):
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            pass
    limit(resource.RLIMIT_AS, cfg["memory"])
    # Soft < hard: SIGXCPU at the soft limit (reported as cpu_limit), SIGKILL one second later if ignored.
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu"], cfg["cpu"] + 1))
    except (ValueError, OSError):
        pass
    limit(resource.RLIMIT_NPROC, cfg["nproc"])
    limit(resource.RLIMIT_FSIZE, cfg["fsize"])
    limit(resource.RLIMIT_CORE, 0)
    limit(resource.RLIMIT_NOFILE, 256)
    applied.append("rlimits")

    # --- guards: processes ------------------------------------------------------------------------------------
    import _posixsubprocess, socket, _socket, shutil, subprocess
    import multiprocessing.process

    def deny(what):
        def denied(*args, **kwargs):
            raise PermissionError(f"sandbox: {what} is not allowed")
        denied.__name__ = denied.__qualname__ = what.rsplit(".", 1)[-1]
        return denied

    process_calls = ("fork", "forkpty", "vfork", "system", "popen", "posix_spawn", "posix_spawnp", "execv", "execve",
                     "execl", "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnv", "spawnve", "spawnvp",
                     "spawnvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe", "kill", "killpg", "setsid", "setpgid",
                     "setpgrp", "setuid", "setgid", "setreuid", "setresuid", "chroot", "pidfd_open")
    for mod in (os, posix):
        for name in process_calls:
            if hasattr(mod, name):
                setattr(mod, name, deny(f"os.{name}"))
    _posixsubprocess.fork_exec = deny("_posixsubprocess.fork_exec")

    class Popen:
        def __init__(self, *args, **kwargs):
            raise PermissionError("sandbox: subprocess.Popen is not allowed")
    subprocess.Popen = Popen
    multiprocessing.process.BaseProcess.start = deny("multiprocessing.Process.start")

    # --- guards: network -------------------------------------------------------------------------------------
    def no_network(*args, **kwargs):
        raise PermissionError("sandbox: network access is not allowed")

    for mod in (socket, _socket):
        base = mod.socket
        # A subclass (not a function) so that `class X(socket.socket)` in the stdlib still works; only
        # instantiating it is refused.
        mod.socket = type("socket", (base,), {"__new__": no_network, "__init__": no_network})
    socket.SocketType = socket.socket
    for name in ("create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo",
                 "gethostbyname", "gethostbyname_ex", "gethostbyaddr"):
        for mod in (socket, _socket):
            if hasattr(mod, name):
                setattr(mod, name, no_network)
    applied.append("guards")

    # --- guards: the file system outside the sandbox dir -----------------------------------------------------
    realpath, join, isabs, fsdecode, fspath = os.path.realpath, os.path.join, os.path.isabs, os.fsdecode, os.fspath
    readlink = os.readlink
    allowed = {os.devnull}

    def inside(path, dir_fd=None):
        if isinstance(path, int):  # an fd the program already holds
            return True
        p = fsdecode(fspath(path))
        if dir_fd is not None and not isabs(p):
            p = join(readlink(f"/proc/self/fd/{dir_fd}"), p)
        real = realpath(p)
        return real == root or real.startswith(root + "/") or real in allowed

    def check(path, what, dir_fd=None):
        if not inside(path, dir_fd):
            raise PermissionError(f"sandbox: {what} outside the sandbox directory is not allowed: {path!r}")

    orig_open = _io.open
    def guarded_open(file, mode="r", *args, **kwargs):
        if isinstance(mode, str) and any(c in mode for c in "wax+"):
            check(file, "writing")
        return orig_open(file, mode, *args, **kwargs)
    for mod in (builtins, io, _io):
        mod.open = guarded_open

    orig_fileio = _io.FileIO
    class FileIO(orig_fileio):
        def __init__(self, file, mode="r", *args, **kwargs):
            if isinstance(mode, str) and any(c in mode for c in "wax+"):
                check(file, "writing")
            super().__init__(file, mode, *args, **kwargs)
    io.FileIO = _io.FileIO = FileIO

    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    orig_os_open = posix.open
    def guarded_os_open(path, flags, *args, dir_fd=None, **kwargs):
        if flags & write_flags:
            check(path, "writing", dir_fd)
        return orig_os_open(path, flags, *args, dir_fd=dir_fd, **kwargs)

    def guard_paths(func, what, npaths):
        # npaths leading positional arguments are paths; dir_fd / src_dir_fd / dst_dir_fd are honoured.
        def guarded(*args, **kwargs):
            fds = [kwargs.get("src_dir_fd", kwargs.get("dir_fd")), kwargs.get("dst_dir_fd", kwargs.get("dir_fd"))]
            for i, path in enumerate(args[:npaths]):
                check(path, what, fds[min(i, 1)])
            return func(*args, **kwargs)
        guarded.__name__ = guarded.__qualname__ = func.__name__
        return guarded

    mutators = {"remove": 1, "unlink": 1, "rmdir": 1, "mkdir": 1, "rename": 2, "replace": 2, "link": 2,
                "chmod": 1, "chown": 1, "lchown": 1, "lchmod": 1, "truncate": 1, "utime": 1, "mkfifo": 1,
                "mknod": 1, "setxattr": 1, "removexattr": 1, "chflags": 1, "lchflags": 1}
    for mod in (os, posix):
        mod.open = guarded_os_open
        for name, n in mutators.items():
            if hasattr(mod, name):
                setattr(mod, name, guard_paths(getattr(posix, name), f"os.{name}", n))
        if hasattr(posix, "symlink"):  # the link's own location must be inside; its target text is harmless
            orig_symlink = posix.symlink
            def symlink(src, dst, *args, **kwargs):
                check(dst, "os.symlink", kwargs.get("dir_fd"))
                return orig_symlink(src, dst, *args, **kwargs)
            mod.symlink = symlink
    shutil.rmtree = guard_paths(shutil.rmtree, "shutil.rmtree", 1)
    shutil.move = guard_paths(shutil.move, "shutil.move", 2)

    # --- modules that would undo the above -------------------------------------------------------------------
    blocked = {"ctypes", "_ctypes", "resource", "cffi"}
    for name in blocked:
        sys.modules.pop(name, None)

    class Blocker:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name.split(".")[0] in blocked:
                raise ImportError(f"sandbox: importing {name} is not allowed")
            return None
    sys.meta_path.insert(0, Blocker)

    # --- the program -----------------------------------------------------------------------------------------
    sys.stderr.write("__trl_collm_sandbox_isolation__ " + ",".join(applied) + "\n")
    main = join(root, "main.py")
    with orig_open(main, encoding="utf-8") as f:
        source = f.read()
    try:
        code = compile(source, "main.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as err:
        info = {"line": getattr(err, "lineno", None), "offset": getattr(err, "offset", None),
                "message": getattr(err, "msg", str(err)), "text": (getattr(err, "text", None) or "").rstrip("\n")}
        sys.stderr.write(f"{type(err).__name__}: {info['message']} (main.py, line {info['line']})\n")
        sys.stderr.write("__trl_collm_sandbox_syntax_error__ " + json.dumps(info) + "\n")
        sys.stderr.flush()
        os._exit(3)
    module = type(sys)("__main__")
    module.__file__ = main
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    sys.argv = [main]
    return code, module.__dict__

_c, _ns = _trl_collm_sandbox()
del _trl_collm_sandbox
exec(_c, _ns)
'''


# ----------------------------------------------------------------------------------------------------------------
# Choosing the interpreter and the uid
# ----------------------------------------------------------------------------------------------------------------


def _world_accessible(path: str) -> bool:
    """True when an unprivileged user could reach ``path`` (every ancestor directory world-searchable)."""
    path = os.path.realpath(path)
    try:
        st = os.stat(path)
    except OSError:
        return False
    if stat.S_ISDIR(st.st_mode):
        if not (st.st_mode & stat.S_IXOTH and st.st_mode & stat.S_IROTH):
            return False
    elif not st.st_mode & stat.S_IROTH:
        return False
    parent = os.path.dirname(path)
    while True:
        try:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        if parent == os.path.dirname(parent):
            return True
        parent = os.path.dirname(parent)


@lru_cache(maxsize=None)
def _interpreter_for_nobody(python: str) -> str | None:
    """An interpreter ``nobody`` can run with the same major.minor as ``python``, or None.

    A venv under /root (mode 700) is unreachable after dropping root, so fall back to a system interpreter of the
    same version: the sandbox only needs the standard library (it runs with -S anyway)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [python, f"/usr/bin/{version}", f"/usr/local/bin/{version}", shutil.which(version) or ""]
    for cand in candidates:
        if not cand:
            continue
        real = os.path.realpath(cand)
        if not (_world_accessible(real) and os.stat(real).st_mode & stat.S_IXOTH):
            continue
        try:
            probe = "import sys, os; print(sys.version_info[:2], os.path.dirname(os.__file__))"
            out = subprocess.run([real, "-I", "-S", "-c", probe],
                                 capture_output=True, text=True, timeout=10, env={"PATH": "/usr/bin:/bin"})
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode != 0 or not out.stdout.startswith(str(tuple(sys.version_info[:2]))):
            continue
        stdlib = out.stdout.strip().split(" ", 2)[-1]
        if _world_accessible(stdlib):
            return real
    return None


def _choose(python: str | None, drop_privileges: bool | str) -> tuple[str, int | None]:
    python = python or sys.executable
    if drop_privileges is False or os.geteuid() != 0:
        return python, None
    chosen = _interpreter_for_nobody(python)
    if chosen is None:
        if drop_privileges is True:
            raise RuntimeError(
                f"run_python(drop_privileges=True): no Python {sys.version_info.major}.{sys.version_info.minor} "
                f"interpreter that user nobody can execute was found (tried {python} and /usr/bin, /usr/local/bin)."
            )
        return python, None
    return chosen, _NOBODY


# ----------------------------------------------------------------------------------------------------------------
# Process bookkeeping
# ----------------------------------------------------------------------------------------------------------------


def _session_members(sid: int) -> list[int]:
    """Pids (not zombies) whose session id is ``sid``, read from /proc (fields after the ')' of the comm)."""
    pids = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        # fields: state ppid pgrp session ...
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != b"Z":
            pids.append(int(entry))
    return pids


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    # Anything that left the group but not the session (setpgid is guarded, but be thorough).
    for other in _session_members(pid):
        try:
            os.kill(other, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _remove_tree(path: str) -> None:
    def retry(func, p, _exc):
        try:  # a program may have chmod-ed its own files read-only
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)


def _decode(data: bytes, truncated: bool, cap: int) -> str:
    text = data.decode("utf-8", errors="replace")
    return text + _TRUNCATION_MARKER.format(n=cap) if truncated else text


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)


# ----------------------------------------------------------------------------------------------------------------
# run_python
# ----------------------------------------------------------------------------------------------------------------


def run_python(
    code: str,
    timeout: float = 5.0,
    memory_mb: int = 512,
    cpu_seconds: int | None = None,
    max_output_bytes: int = 65536,
    *,
    stdin: str | bytes | None = None,
    max_file_mb: int = 16,
    max_processes: int = 64,
    network_namespace: bool = True,
    drop_privileges: bool | str = "auto",
    python: str | None = None,
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in a fresh sandboxed interpreter and report what happened.

    ``timeout`` is wall-clock seconds; ``cpu_seconds`` (default: the timeout rounded up, plus one) is the CPU-time
    limit; ``memory_mb`` the address-space limit; ``max_output_bytes`` caps stdout and stderr each (the process is
    killed when either overflows); ``max_file_mb`` caps any file the program writes (inside its temp dir);
    ``stdin`` is fed to the program. ``drop_privileges``: "auto" runs as ``nobody`` when the parent is root and a
    suitable interpreter exists, True requires it, False never does. The host is never modified outside a temp dir
    that is removed before returning.
    """
    if not isinstance(code, str):
        raise TypeError(f"run_python: code must be a str, got {type(code).__name__}")
    timeout = float(timeout)
    cpu = int(cpu_seconds) if cpu_seconds is not None else int(math.ceil(timeout)) + 1
    interpreter, uid = _choose(python, drop_privileges)
    workdir = tempfile.mkdtemp(prefix="trl_collm_sandbox_")
    with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
        f.write(code)
    cfg = {
        "dir": workdir,
        "memory": int(memory_mb) * 1024 * 1024,
        "cpu": max(1, cpu),
        "nproc": int(max_processes),
        "fsize": int(max_file_mb) * 1024 * 1024,
        "netns": bool(network_namespace),
        "uid": uid,
    }
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",  # repeatable set/dict orders -> repeatable rewards
    }
    argv = [interpreter, "-I", "-S", "-B", "-X", "utf8", "-c", _BOOTSTRAP, json.dumps(cfg)]
    data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=workdir,
        env=env,
        start_new_session=True,  # own session + process group: one killpg reaches everything it starts
        close_fds=True,
    )
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    truncated = {fd: False for fd in bufs}
    killed_reason = None
    timed_out = False
    try:
        if data is not None:
            try:
                proc.stdin.write(data)
            except (BrokenPipeError, OSError):
                pass
            finally:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        sel = selectors.DefaultSelector()
        for fd in bufs:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        deadline = start + timeout
        exit_seen_at = None
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out, killed_reason = True, "timeout"
                break
            if proc.poll() is not None:
                # The program is gone; whatever still holds the pipes gets a short grace period.
                exit_seen_at = exit_seen_at or now
                if now - exit_seen_at > 0.5:
                    break
            for key, _ in sel.select(timeout=min(0.05, deadline - now)):
                fd = key.fd
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    sel.unregister(fd)
                    continue
                buf = bufs[fd]
                room = max_output_bytes - len(buf)
                buf += chunk[:room]
                if len(chunk) > room:
                    truncated[fd] = True
                    killed_reason = killed_reason or "output_limit"
            if killed_reason == "output_limit":
                break
        sel.close()
    finally:
        pid = proc.pid
        _kill_session(pid)  # in ALL cases, also after a clean exit: nothing of the sandbox outlives the call
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for stream in (proc.stdout, proc.stderr):
            stream.close()
        _remove_tree(workdir)
    duration = time.monotonic() - start
    out_fd, err_fd = list(bufs)
    stderr_bytes = bytes(bufs[err_fd])
    # Pull the bootstrap's own lines out of stderr.
    isolation: tuple[str, ...] = ()
    syntax_error = None
    kept = []
    for line in stderr_bytes.decode("utf-8", errors="replace").splitlines(keepends=True):
        if line.startswith("__trl_collm_sandbox_isolation__ ") and not isolation:
            isolation = tuple(x for x in line.split(" ", 1)[1].strip().split(",") if x)
        elif line.startswith(_SYNTAX_MARKER) and syntax_error is None:
            try:
                syntax_error = json.loads(line[len(_SYNTAX_MARKER):])
            except ValueError:
                pass
        else:
            kept.append(line)
    stderr_text = "".join(kept)
    if truncated[err_fd]:
        stderr_text += _TRUNCATION_MARKER.format(n=max_output_bytes)
    rc = proc.returncode
    if rc is not None and rc < 0 and killed_reason is None:
        killed_reason = "cpu_limit" if -rc == signal.SIGXCPU else f"signal:{_signal_name(-rc)}"
    if rc != _SYNTAX_EXIT:
        syntax_error = None
    memory_error = bool(re.search(r"^MemoryError\b", stderr_text, re.M))
    return SandboxResult(
        ok=rc == 0 and killed_reason is None,
        returncode=rc,
        stdout=_decode(bytes(bufs[out_fd]), truncated[out_fd], max_output_bytes),
        stderr=stderr_text,
        timed_out=timed_out,
        killed_reason=killed_reason,
        duration=duration,
        stdout_truncated=truncated[out_fd],
        stderr_truncated=truncated[err_fd],
        memory_error=memory_error,
        syntax_error=syntax_error,
        isolation=isolation,
        pid=pid,
        workdir=workdir,
    )


# ----------------------------------------------------------------------------------------------------------------
# run_tests: per-test results for a solution
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class TestOutcome:
    """One test unit: an assert-bearing statement plus the setup statements just before it."""

    __test__ = False  # not a pytest test class

    index: int
    source: str
    status: str = "not_run"  # "passed" | "failed" | "error" | "timeout" | "not_run"
    message: str = ""  # failing assert (with the value obtained when it is a comparison) or the exception
    got: str | None = None  # repr of the left side of a failing comparison

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass
class TestReport:
    """Per-test results of ``run_tests``."""

    __test__ = False

    outcomes: list[TestOutcome]
    syntax_error: dict | None = None  # {"line", "offset", "message", "text"} of the solution
    load_error: str | None = None  # exception raised while defining the solution (module level)
    entry_point_missing: bool = False
    timed_out: bool = False  # the whole run hit its wall-clock limit
    sandbox: SandboxResult | None = None

    @property
    def total(self) -> int:
        return len(self.outcomes)

    @property
    def passed(self) -> int:
        return sum(o.passed for o in self.outcomes)

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total

    def failures(self) -> list[TestOutcome]:
        return [o for o in self.outcomes if not o.passed]

    def summary(self, max_failures: int = 3) -> str:
        """Short human-readable feedback (used in multi-turn prompts)."""
        if self.syntax_error is not None:
            se = self.syntax_error
            text = f"\n    {se['text']}" if se.get("text") else ""
            return f"SyntaxError at line {se['line']}: {se['message']}{text}"
        lines = [f"{self.passed}/{self.total} tests passed."]
        if self.load_error:
            lines.append(f"Defining the code raised: {self.load_error}")
        if self.entry_point_missing:
            lines.append("The function under test is not defined.")
        if self.timed_out:
            lines.append("The run was stopped: it exceeded the time limit.")
        fails = self.failures()
        for o in fails[:max_failures]:
            lines.append(f"- {o.message or o.source} [{o.status}]")
        if len(fails) > max_failures:
            lines.append(f"- ... and {len(fails) - max_failures} more")
        return "\n".join(lines)


def _unparse(node: ast.AST) -> str:
    return ast.unparse(node)


def _is_trivial_assert(stmt: ast.stmt) -> bool:
    """`assert True, "..."` (HumanEval's debugging placeholders) tests nothing and is not counted."""
    return isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant) and bool(stmt.test.value)


def _has_assert(stmt: ast.stmt) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(stmt))


def _group_units(stmts: list[ast.stmt]) -> tuple[list[str], list[str]]:
    """Split statements into test units: each assert-bearing statement with the setup lines just before it.
    Returns (units, trailing setup). Trivial asserts are dropped."""
    units, pending = [], []
    for stmt in stmts:
        if _is_trivial_assert(stmt):
            continue
        pending.append(_unparse(stmt))
        if _has_assert(stmt):
            units.append("\n".join(pending))
            pending = []
    return units, pending


def split_tests(tests: list[str] | str, entry_point: str | None = None) -> tuple[str, list[str], list[str]]:
    """(module setup source, test unit sources, names bound to the function under test).

    * a list of strings: each is one test (e.g. ``"assert add(1, 2) == 3"``);
    * a HumanEval-style program defining ``check(candidate)``: the module-level lines are setup and each
      assert-bearing statement of ``check``'s body is one test (``candidate`` = the entry point);
    * any other program: each assert-bearing module-level statement is one test.
    """
    names = [entry_point] if entry_point else []
    if not isinstance(tests, str):
        tests = [str(t) for t in tests]
        for t in tests:
            ast.parse(t)  # a malformed test is the caller's bug: fail loudly here, not as a "failed test"
        return "", tests, names
    module = ast.parse(tests)
    check = next((n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is not None:
        setup = "\n".join(_unparse(n) for n in module.body if n is not check)
        if check.args.args:
            names = names + [check.args.args[0].arg]
        units, _trailing = _group_units(check.body)  # lines after the last assert test nothing
        return setup, units, names
    units, trailing = _group_units(module.body)
    return "\n".join(trailing), units, names


_HARNESS = r'''
def _trl_collm_harness():
    import ast, builtins, json, operator, os, signal, sys, traceback
    # The nonce and the payload come on stdin, not in this file, so the solution cannot read the tests (or the
    # nonce) back from disk or argv.
    nonce = sys.stdin.readline().strip()
    payload = json.loads(sys.stdin.readline())
    sys.stdin.close()
    user_code, setup, units, names = payload["code"], payload["setup"], payload["units"], payload["names"]
    entry_point, per_test_timeout, strict = payload["entry_point"], payload["per_test_timeout"], payload["strict"]
    # Results go to a private duplicate of stdout; the program's own prints go to /dev/null so they can neither
    # flood the output cap nor be confused with results.
    out_fd = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    write, dumps, repr_, type_, len_, isinstance_ = os.write, json.dumps, repr, type, len, isinstance

    def emit(**rec):
        write(out_fd, (nonce + dumps(rec) + "\n").encode("utf-8", "replace"))

    def short(text, n=300):
        return text if len_(text) <= n else text[: n - 3] + "..."

    def describe(err):
        return short("".join(traceback.format_exception_only(type_(err), err)).strip().splitlines()[-1])

    class TestTimeout(BaseException):
        pass

    def on_alarm(signum, frame):
        raise TestTimeout()
    signal.signal(signal.SIGALRM, on_alarm)

    def arm():
        signal.setitimer(signal.ITIMER_REAL, per_test_timeout)

    def disarm():
        signal.setitimer(signal.ITIMER_REAL, 0)

    # Snapshots taken before the solution runs, restored before every test, so a solution cannot make the tests
    # pass by patching builtins (abs, sorted, ...) or the modules the tests use (math.isclose, ...).
    test_builtins = dict(builtins.__dict__)
    imported = set()
    for src in [setup] + list(units):
        for node in ast.walk(ast.parse(src)):
            if isinstance_(node, ast.Import):
                imported.update(a.name for a in node.names)
            elif isinstance_(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module)
    saved_modules = {}
    for name in sorted(imported):
        try:
            __import__(name)
            saved_modules[name] = (sys.modules[name], dict(sys.modules[name].__dict__))
        except BaseException:
            pass

    def restore():
        for name, (mod, d) in saved_modules.items():
            sys.modules[name] = mod
            if mod.__dict__ != d:
                mod.__dict__.clear()
                mod.__dict__.update(d)

    plain_scalars = (int, float, bool, str, bytes, complex, type_(None))
    plain_containers = (list, tuple, set, frozenset)

    def plain(x, depth=0):
        t = type_(x)
        if t in plain_scalars:
            return True
        if depth > 50:
            return False
        if t in plain_containers:
            return all(plain(v, depth + 1) for v in x)
        if t is dict:
            return all(plain(k, depth + 1) and plain(v, depth + 1) for k, v in x.items())
        return False

    # --- the solution ---------------------------------------------------------------------------------------
    try:
        code = compile(user_code, "solution.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as err:
        emit(kind="syntax_error", line=getattr(err, "lineno", None), offset=getattr(err, "offset", None),
             message=getattr(err, "msg", str(err)), text=(getattr(err, "text", None) or "").rstrip("\n"))
        return
    user_ns = {"__name__": "__main__", "__builtins__": builtins}
    try:
        arm()
        exec(code, user_ns)
        disarm()
    except TestTimeout:
        emit(kind="load_error", error="defining the code timed out")
    except BaseException as err:
        disarm()
        emit(kind="load_error", error=describe(err))
    restore()

    real = user_ns.get(entry_point) if entry_point else None
    if entry_point and not callable(real):
        emit(kind="entry_point_missing")

    returned = []  # the latest value returned by the function under test, for "got ..." messages

    def candidate(*args, **kwargs):
        if not callable(real):
            raise NameError(f"name {entry_point!r} is not defined")
        result = real(*args, **kwargs)
        restore()
        returned[:] = [result]
        if strict and not plain(result):
            raise TypeError(f"{entry_point} returned a {type_(result).__name__}, not a plain built-in value")
        return result

    test_ns = {k: v for k, v in user_ns.items() if not k.startswith("__") and k not in test_builtins}
    test_ns["__builtins__"] = test_builtins
    test_ns["__name__"] = "__tests__"
    for name in names:
        test_ns[name] = candidate
    try:
        exec(compile(setup, "tests.py", "exec"), test_ns)
    except BaseException as err:
        emit(kind="setup_error", error=describe(err))
    for name in names:  # the setup must not shadow the function under test
        test_ns[name] = candidate

    ops = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
           ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}

    for index, src in enumerate(units):
        restore()
        returned.clear()
        status, message, got = "passed", "", None
        body = ast.parse(src).body
        last = body[-1]
        head = ast.Module(body=body[:-1], type_ignores=[])
        summary = ast.unparse(last).splitlines()[0]
        try:
            arm()
            exec(compile(head, "tests.py", "exec"), test_ns)
            test = last.test if isinstance_(last, ast.Assert) else None
            if isinstance_(test, ast.Compare) and len_(test.ops) == 1 and type_(test.ops[0]) in ops:
                left = eval(compile(ast.Expression(test.left), "tests.py", "eval"), test_ns)
                right = eval(compile(ast.Expression(test.comparators[0]), "tests.py", "eval"), test_ns)
                restore()
                if not ops[type_(test.ops[0])](left, right):
                    got = short(repr_(returned[0] if returned else left), 200)
                    raise AssertionError(None)
            else:
                exec(compile(ast.Module(body=[last], type_ignores=[]), "tests.py", "exec"), test_ns)
            disarm()
        except TestTimeout:
            status, message = "timeout", f"{summary}  # timed out after {per_test_timeout}s"
        except AssertionError as err:
            disarm()
            status = "failed"
            message = summary + (f"  # got {got}" if got is not None else "")
            if err.args and err.args[0] is not None:
                message += f"  ({short(str(err.args[0]), 200)})"
        except BaseException as err:
            disarm()
            status, message = "error", f"{summary}  # raised {describe(err)}"
        emit(kind="test", index=index, status=status, message=message, got=got)
    emit(kind="done")
'''


def run_tests(
    code: str,
    tests: list[str] | str,
    entry_point: str | None = None,
    timeout: float = 10.0,
    per_test_timeout: float = 3.0,
    memory_mb: int = 512,
    strict_returns: bool = True,
    **sandbox_kwargs,
) -> TestReport:
    """Run ``tests`` against ``code`` in ONE sandboxed process and report each test separately.

    ``tests`` is a list of test statements or a test program (see ``split_tests``); ``entry_point`` names the
    function under test (bound to ``candidate`` in HumanEval-style checks). ``timeout`` bounds the whole run,
    ``per_test_timeout`` each test. With ``strict_returns`` the function under test must return plain built-in
    values (numbers, strings, lists, dicts, ... of exact built-in types): an object with an ``__eq__`` that always
    says True is reported as an error, not as a pass. Tests also see builtins and imported modules as they were
    before the solution ran. These checks make naive reward hacks fail; they are not a proof against a
    determined adversary (see the module docstring).
    """
    setup, units, names = split_tests(tests, entry_point)
    outcomes = [TestOutcome(index=i, source=u) for i, u in enumerate(units)]
    nonce = "@@" + secrets.token_hex(16) + "@@"
    program = _HARNESS + "\n_trl_collm_harness()\n"
    payload = json.dumps({"code": code, "setup": setup, "units": units, "names": names, "entry_point": entry_point,
                          "per_test_timeout": float(per_test_timeout), "strict": bool(strict_returns)})
    result = run_python(program, timeout=timeout, memory_mb=memory_mb, stdin=nonce + "\n" + payload + "\n",
                        **sandbox_kwargs)
    report = TestReport(outcomes=outcomes, timed_out=result.timed_out, sandbox=result)
    done = False
    for line in result.stdout.splitlines():
        if not line.startswith(nonce):
            continue
        try:
            rec = json.loads(line[len(nonce):])
        except ValueError:
            continue
        kind = rec.get("kind")
        if kind == "syntax_error":
            report.syntax_error = {k: rec.get(k) for k in ("line", "offset", "message", "text")}
        elif kind == "load_error":
            report.load_error = rec.get("error")
        elif kind == "entry_point_missing":
            report.entry_point_missing = True
        elif kind == "test" and 0 <= rec.get("index", -1) < len(outcomes):
            o = outcomes[rec["index"]]
            o.status, o.message, o.got = rec.get("status", "error"), rec.get("message", ""), rec.get("got")
        elif kind == "done":
            done = True
    if report.syntax_error is not None:
        for o in outcomes:
            o.status, o.message = "error", "the code does not compile"
    elif not done:
        # The process died (os._exit, crash, memory, wall clock) before reporting these tests.
        why = result.killed_reason or (f"exit status {result.returncode}" if result.returncode else "an early exit")
        if result.memory_error:
            why = "MemoryError"
        for o in outcomes:
            if o.status == "not_run":
                o.status = "timeout" if result.timed_out else "not_run"
                o.message = f"{o.source.splitlines()[-1]}  # not completed: {why}"
    return report
