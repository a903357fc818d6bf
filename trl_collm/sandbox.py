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
from dataclasses import dataclass, field
from functools import lru_cache

__all__ = ["SandboxResult", "TestOutcome", "TestReport", "run_python", "run_tests"]

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
            out = subprocess.run([real, "-I", "-S", "-c", "import sys, os; print(sys.version_info[:2], os.path.dirname(os.__file__))"],
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
    )
