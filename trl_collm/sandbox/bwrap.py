"""The bubblewrap command line of one sandbox, the start-up check, and the explicit opt-out for trusted code.

Each sandbox is a fresh ``bwrap`` (https://github.com/containers/bubblewrap) with every namespace it supports (user,
PID, network, IPC, UTS, cgroup, mount), nothing of the host but read-only views of the system libraries
(``/usr/lib*``) and the interpreter's installation, private ``tmpfs`` mounts at ``/tmp`` and ``/dev/shm`` capped in
size and in inodes (everything else is read-only), a cleared environment, a new session (no terminal injection),
``--die-with-parent``, and the seccomp filter of ``seccomp.py``. The runner starts with ``CAP_SYS_ADMIN`` in the
sandbox's own user namespace, only to set the inode caps, and drops every capability and loads the whole filter
before it reads the solution (``runner.py``). No further user namespace can be made: ``clone``, ``clone3`` and
``unshare`` are refused. Why bubblewrap and not nsjail or firejail: docs/security.md.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass

from . import programs, seccomp
from .process import Child

__all__ = ["Limits", "SandboxUnavailable", "command", "isolation", "require_sandbox", "spawn", "unsafe_mode"]

logger = logging.getLogger(__name__)

UNSAFE_ENV = "TRL_COLLM_UNSAFE_NO_SANDBOX"
INSTALL_HINT = (
    "install bubblewrap: `sudo apt-get install bubblewrap` (Debian/Ubuntu), `sudo dnf install "
    "bubblewrap` (Fedora), `sudo pacman -S bubblewrap` (Arch); see docs/security.md"
)
USERNS_HINT = (
    "enable unprivileged user namespaces (`sudo sysctl -w user.max_user_namespaces=15000`, on Debian "
    "`kernel.unprivileged_userns_clone=1`, on Ubuntu 24.04+ "
    "`kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile for bwrap; in Docker run "
    "with `--security-opt seccomp=unconfined` or `--privileged`); see docs/security.md"
)
SANDBOX_UID = 65534  # "nobody" inside the sandbox's user namespace
# What bubblewrap's filter lets through for the runner's set-up, its remount and its limits (the runner then loads
# the whole filter on top).
SETUP_SYSCALLS = ("mount", "setrlimit", "prlimit64")


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run on this machine; the message is one line saying how to fix it."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox (see docs/security.md for what they bound together)."""

    memory_mb: int = 512  # RLIMIT_AS of the sandbox's single process
    tmp_mb: int = 16  # size of the private /tmp tmpfs (the disk quota)
    shm_mb: int = 4  # size of the private /dev/shm tmpfs
    cpu_seconds: int = 30  # RLIMIT_CPU
    open_files: int = 64  # RLIMIT_NOFILE
    inodes: int = 1024  # files, directories and links in each of the two tmpfs mounts (nr_inodes)

    def __post_init__(self):
        for name in ("memory_mb", "tmp_mb", "shm_mb", "cpu_seconds", "open_files", "inodes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"sandbox Limits: {name} must be a positive int, got {value!r}.")


def unsafe_mode() -> bool:
    """True when the user explicitly turned isolation off (``TRL_COLLM_UNSAFE_NO_SANDBOX=1``)."""
    return os.environ.get(UNSAFE_ENV, "") == "1"


@functools.cache
def _warn_unsafe() -> None:
    msg = (
        f"{UNSAFE_ENV}=1: model-written code runs WITHOUT bubblewrap isolation (no namespaces, no seccomp, full "
        "view of this machine's files and processes as your user). Use this only for code you trust."
    )
    warnings.warn(msg, RuntimeWarning, stacklevel=3)
    logger.warning(msg)


def interpreter() -> tuple[str, str]:
    """(the real path of this interpreter, its installation prefix): the sandbox runs the same Python."""
    python = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    return python, prefix


@functools.cache
def _site_dirs(prefix: str) -> tuple[str, ...]:
    """The installation's package directories (site-packages, Debian's dist-packages) that exist."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [
        os.path.join(prefix, "lib", version, "site-packages"),
        os.path.join(prefix, "lib", "python3", "dist-packages"),
        os.path.join(prefix, "local", "lib", version, "dist-packages"),
        "/usr/lib/python3/dist-packages",
        f"/usr/local/lib/{version}/dist-packages",
        f"/usr/local/lib/{version}/site-packages",
    ]
    seen = []
    for path in candidates:
        if os.path.isdir(path) and path not in seen:
            seen.append(path)
    return tuple(seen)


def _system_binds() -> list[str]:
    """The system's libraries read-only (the C library, the dynamic loader, what Python's extension modules link
    against, and Debian's stdlib under /usr/lib/pythonX.Y), with the merged-/usr symlinks the loader needs. Not the
    rest of /usr (programs, /usr/local, /usr/share)."""
    args = []
    for lib in ("/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32"):
        if os.path.isdir(lib) and not os.path.islink(lib):
            args += ["--ro-bind", lib, lib]
    for top in ("/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


def command(limits: Limits, *, seccomp_fd: int | None, info_fd: int | None = None) -> list[str]:
    """argv that runs ``python -I -S -B`` inside a new sandbox (the caller appends ``-c <program> ...``)."""
    python, prefix = interpreter()
    if unsafe_mode():
        _warn_unsafe()
        return [python, "-I", "-S", "-B"]
    bwrap = shutil.which("bwrap") or "/usr/bin/bwrap"
    # --as-pid-1: Python is the PID namespace's init (the seccomp filter allows no other process, so no reaper is
    # needed), and bwrap reaps it itself. With bwrap's own init, bwrap exits as soon as init reports the status and
    # leaves init to the host's PID 1, which in many containers never reaps it (a zombie per sandbox).
    args = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",
        "--clearenv",
        "--cap-drop",
        "ALL",
        # For the runner's remount of the tmpfs mounts only (runner._harden); bwrap's --disable-userns would put
        # the runner in a nested user namespace, without this right over the mounts.
        "--cap-add",
        "CAP_SYS_ADMIN",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--hostname",
        "sandbox",
    ]
    mib = 1024 * 1024
    args += _system_binds()
    # The device files Python and the C library may open, bound one by one: bwrap's --dev would also mount devpts,
    # for which bwrap runs the sandbox in a second, nested user namespace, without the right to remount the tmpfs
    # mounts (runner._harden).
    # /dev/null is needed (the runner opens it); the others only where the host has them (a minimal container).
    args += ["--dev-bind", "/dev/null", "/dev/null"]
    for device in ("zero", "full", "random", "urandom"):
        args += ["--dev-bind-try", f"/dev/{device}", f"/dev/{device}"]
    args += [
        "--size",
        str(limits.tmp_mb * mib),
        "--perms",
        "1777",
        "--tmpfs",
        "/tmp",
        "--size",
        str(limits.shm_mb * mib),
        "--perms",
        "1777",
        "--tmpfs",
        "/dev/shm",
    ]

    def inside(path: str, top: str) -> bool:
        return path == top or path.startswith(top.rstrip("/") + "/")

    # The interpreter after the tmpfs mounts, so that one installed under /tmp is not hidden by the private /tmp:
    # its installation (a distribution's Python in /usr has its standard library in /usr/lib, bound above), and its
    # binary when that lies elsewhere (/usr/bin/python3.X, a venv made with --copies).
    if prefix != "/usr" and not inside(prefix, "/usr/lib"):
        args += ["--ro-bind", prefix, prefix]
    if not (inside(python, prefix) and prefix != "/usr") and not inside(python, "/usr/lib"):
        args += ["--ro-bind", python, python]
    # Installed packages are not needed (-S) and are none of the sandbox's business: empty read-only dirs on top.
    bound = ["/usr/lib", "/usr/lib64"] + ([prefix] if prefix != "/usr" else [])
    for path in _site_dirs(prefix):
        if any(inside(path, top) for top in bound):
            args += ["--size", "4096", "--tmpfs", path, "--remount-ro", path]
    args += [
        "--remount-ro",
        "/",  # /dev's directory too (its device files still work)
        "--chdir",
        "/tmp",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/tmp",
        "--setenv",
        "LANG",
        "C.UTF-8",
    ]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    return args + ["--", python, "-I", "-S", "-B"]


def _fix_for(stderr: str) -> str:
    text = stderr.lower()
    if "sandbox set-up:" in text:
        return (
            "the sandbox's runner could not bound its tmpfs mounts or drop its capabilities (it needs a "
            "non-setuid bubblewrap that allows --cap-add inside its user namespace); see docs/security.md"
        )
    if any(
        s in text
        for s in (
            "namespace",
            "uid map",
            "operation not permitted",
            "permission denied",
            "setting up uid",
            "clone",
            "no permissions",
        )
    ):
        return USERNS_HINT
    return "see docs/security.md"


@functools.cache
def _probe(uid: int, machine: str) -> None:
    if not seccomp.supported(machine):
        raise SandboxUnavailable(
            f"the code sandbox has no seccomp table for the {machine} architecture "
            f"(supported: x86_64, aarch64); for trusted code only, set {UNSAFE_ENV}=1"
        )
    if shutil.which("bwrap") is None:
        raise SandboxUnavailable(f"the code sandbox needs bubblewrap (`bwrap`), which is not installed: {INSTALL_HINT}")
    # The whole start-up of a real sandbox, the runner's set-up included, running a one-line script.
    fd = seccomp.filter_fd(allow=SETUP_SYSCALLS)
    try:
        argv = command(Limits(), seccomp_fd=fd) + ["-c", programs.source("runner"), _runner_config(Limits())]
        proc = subprocess.run(
            argv,
            pass_fds=(fd,),
            env={},
            cwd="/",
            capture_output=True,
            timeout=60,
            check=False,
            input=json.dumps({"mode": "script", "code": "print('sandbox-ok')"}).encode() + b"\n",
        )
    except (OSError, subprocess.SubprocessError) as err:
        raise SandboxUnavailable(f"the code sandbox could not start bubblewrap ({err}); {INSTALL_HINT}") from None
    finally:
        os.close(fd)
    if proc.returncode != 0 or proc.stdout.strip() != b"sandbox-ok":
        why = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        why = why[-1] if why else f"exit status {proc.returncode}"
        raise SandboxUnavailable(f"the code sandbox (bubblewrap) does not work here: {why}; {_fix_for(why)}")


def require_sandbox() -> None:
    """Raise ``SandboxUnavailable`` (one line: the cause and the fix) unless sandboxes can start on this machine.
    Checked once per process and user; with the explicit ``TRL_COLLM_UNSAFE_NO_SANDBOX=1`` it only warns."""
    if unsafe_mode():
        _warn_unsafe()
        return
    import platform

    _probe(os.geteuid(), platform.machine())


def isolation() -> tuple[str, ...]:
    """The layers a sandbox started now gets (reported in results)."""
    if unsafe_mode():
        return ("none", "rlimits")
    return ("bwrap", "userns", "pidns", "netns", "ipcns", "mountns", "seccomp", "rlimits")


def _runner_config(limits: Limits) -> str:
    """The runner's command-line argument: its kernel limits, and (in bubblewrap) what its set-up applies."""
    mib = 1024 * 1024
    harden = None
    if not unsafe_mode():
        harden = {
            "tmpfs": [["/tmp", limits.tmp_mb * mib, limits.inodes], ["/dev/shm", limits.shm_mb * mib, limits.inodes]],
            "seccomp_filter": seccomp.filter_bytes().hex(),
        }
    config = {
        "memory_mb": limits.memory_mb,
        "open_files": limits.open_files,
        "cpu_seconds": limits.cpu_seconds,
        "harden": harden,
    }
    return json.dumps(config)


def spawn(limits: Limits) -> Child:
    """A new sandbox running the runner program; it waits for its request line on stdin."""
    cfg = _runner_config(limits)
    if unsafe_mode():
        return Child(command(limits, seccomp_fd=None) + ["-c", programs.source("runner"), cfg])
    fd = seccomp.filter_fd(allow=SETUP_SYSCALLS)
    info_read, info_write = os.pipe()
    os.set_blocking(info_read, False)
    try:
        argv = command(limits, seccomp_fd=fd, info_fd=info_write) + ["-c", programs.source("runner"), cfg]
        return Child(argv, pass_fds=(fd, info_write), info_fd=info_read)
    except BaseException:
        os.close(info_read)
        raise
    finally:
        os.close(fd)
        os.close(info_write)
