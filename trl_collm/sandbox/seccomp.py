"""A seccomp filter (classic BPF, built here without libseccomp) that bubblewrap loads before running Python.

Why: with no new processes and no threads, the sandbox is ONE task, so its address-space limit (``RLIMIT_AS``) is a
memory cap for the whole sandbox even where no cgroup can be created (see docs/security.md), it takes one host PID,
and nothing can outlive a call. The filter refuses:

* process and thread creation: ``fork``, ``vfork``, ``clone`` (threads too: each thread is a host PID, and no
  per-sandbox count of them holds for a root trainer, since ``RLIMIT_NPROC`` does not apply to host uid 0),
  ``clone3``;
* ways around the namespaces and kernel attack surface that a solution never needs: ``ptrace``,
  ``process_vm_readv/writev``, ``unshare``, ``setns``, ``mount`` and the new mount API, ``pivot_root``,
  ``chroot``, ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*``, ``keyctl`` / ``add_key`` /
  ``request_key``, module loading, ``kexec_load``, file handles (``open_by_handle_at``);
* kernel memory and machine-wide tables outside ``RLIMIT_AS``: System V shared memory, semaphores and message
  queues (``shm*``, ``sem*``, ``msg*``: a fresh IPC namespace has the kernel's default limits, hundreds of MiB),
  POSIX message queues (``mq_*``), Linux AIO (``io_setup`` and friends: ``fs.aio-max-nr`` is machine-wide),
  ``inotify`` / ``fanotify`` (instances count against the host user's quota), POSIX timers (``timer_create``),
  ``memfd_secret``, and setting or removing extended attributes (``*setxattr*``, ``*removexattr*``: a tmpfs
  stores them in kernel memory that its size cap does not count);
* ``socket`` / ``socketpair`` (there is no network in the sandbox anyway) and ``memfd_create`` (anonymous files
  are memory that ``RLIMIT_AS`` does not count);
* what the kernel counts per USER of the host rather than per process (the sandbox's user namespace charges every
  count to the trainer's uid too, so a sandbox could starve every other process of that uid): sending signals
  (``kill``, ``tgkill``, ``rt_sigqueueinfo``...; a non-real-time signal is queued past ``RLIMIT_SIGPENDING``),
  interval timers (``alarm``, ``setitimer``), pipes and FIFOs (``pipe*``, ``mknod*``: the user's pipe pages, and
  SIGPIPE), setting a limit (``setrlimit``, ``prlimit64`` with a new limit: a lowered ``RLIMIT_CPU`` raises
  SIGXCPU), and ``fcntl``'s ``F_SETOWN*`` / ``F_SETSIG`` / leases / ``F_NOTIFY`` (signals chosen by the caller),
  ``F_SETPIPE_SZ`` and the record locks ``F_SETLK*`` / ``F_OFD_SETLK*`` (kernel objects no limit counts).
  Real-time signals, POSIX message queues and locked memory are bounded by the runner's rlimits (0 each).

Left allowed: kernel objects that live behind a file descriptor (pipes, ``eventfd``, ``timerfd``, ``signalfd``,
``epoll``), which ``RLIMIT_NOFILE`` bounds in number; what they and a few others still hold is listed in
docs/security.md ("not guaranteed"). ``bubblewrap``'s copy of this filter lets ``mount`` through for the runner's
remount of its tmpfs mounts and its limits; the runner then loads the whole filter itself (``runner._harden``).

Refused calls fail with EPERM; a system-call number of another ABI (x32 on x86-64) or another architecture kills
the process. Tables: x86-64 (run in CI) and aarch64 (from the kernel's asm-generic table).
"""

from __future__ import annotations

import os
import platform
import struct

__all__ = ["filter_bytes", "supported"]

# seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
_OFF_NR, _OFF_ARCH, _OFF_ARGS = 0, 4, 16
_LD_W_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_EPERM = 1

_DENIED = (
    "clone",
    "clone3",
    "fork",
    "vfork",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "open_by_handle_at",
    "name_to_handle_at",
    "socket",
    "socketpair",
    "memfd_create",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "open_tree",
    "move_mount",
    "mount_setattr",
    "shmget",
    "shmat",
    "shmctl",
    "shmdt",
    "semget",
    "semop",
    "semctl",
    "semtimedop",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
    "io_setup",
    "io_destroy",
    "io_submit",
    "io_cancel",
    "io_getevents",
    "io_pgetevents",
    "inotify_init",
    "inotify_init1",
    "inotify_add_watch",
    "fanotify_init",
    "fanotify_mark",
    "timer_create",
    "memfd_secret",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "setxattrat",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
    "removexattrat",
    "open_tree_attr",
    # What charges a per-USER count of the host (kernel ucounts, shared by every process of the trainer's uid)
    # beyond what a per-process limit bounds: sending signals (the sandbox's only target is itself, and a
    # non-real-time signal is queued past RLIMIT_SIGPENDING), interval timers (SIGALRM / SIGVTALRM / SIGPROF, idem),
    # pipes and FIFOs (their buffers count against the user's pipe pages, and a pipe with no reader raises
    # SIGPIPE), and lowering a limit (RLIMIT_CPU's SIGXCPU; see also _DENIED_IF below).
    "kill",
    "tkill",
    "tgkill",
    "rt_sigqueueinfo",
    "rt_tgsigqueueinfo",
    "pidfd_send_signal",
    "alarm",
    "setitimer",
    "setrlimit",
    "pipe",
    "pipe2",
    "mknod",
    "mknodat",
)

# Calls refused only with some arguments: (argument index, the values refused) or (index, "nonzero").
_F_SETLK, _F_SETLKW, _F_SETOWN, _F_SETSIG, _F_SETOWN_EX, _F_OFD_SETLK, _F_OFD_SETLKW = 6, 7, 8, 10, 15, 37, 38
_F_SETLEASE, _F_NOTIFY, _F_SETPIPE_SZ = 1024, 1026, 1031
_DENIED_IF = {
    # fcntl: choosing who gets SIGIO / which signal it is (F_SETOWN*, F_SETSIG: any of the 31 non-real-time
    # signals, each queued once past the limit), leases and dnotify (they set the owner themselves), a pipe's
    # size (the user's pipe pages), and POSIX record locks (kernel objects that no limit counts).
    "fcntl": (
        1,
        (
            _F_SETLK,
            _F_SETLKW,
            _F_SETOWN,
            _F_SETSIG,
            _F_SETOWN_EX,
            _F_OFD_SETLK,
            _F_OFD_SETLKW,
            _F_SETLEASE,
            _F_NOTIFY,
            _F_SETPIPE_SZ,
        ),
    ),
    # prlimit64 with a new limit (reading one, as getrlimit does, stays allowed): a lowered RLIMIT_CPU would raise
    # SIGXCPU, and the runner sets every limit before its filter.
    "prlimit64": (2, "nonzero"),
}

_ARCHES = {
    # machine: (AUDIT_ARCH_*, {name: number}); fork, vfork, inotify_init, alarm, pipe and mknod do not exist on
    # aarch64.
    "x86_64": (
        0xC000003E,
        {
            "clone": 56,
            "clone3": 435,
            "fork": 57,
            "vfork": 58,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "unshare": 272,
            "setns": 308,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "chroot": 161,
            "bpf": 321,
            "perf_event_open": 298,
            "userfaultfd": 323,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "kexec_load": 246,
            "open_by_handle_at": 304,
            "name_to_handle_at": 303,
            "socket": 41,
            "socketpair": 53,
            "memfd_create": 319,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "open_tree": 428,
            "move_mount": 429,
            "mount_setattr": 442,
            "shmget": 29,
            "shmat": 30,
            "shmctl": 31,
            "shmdt": 67,
            "semget": 64,
            "semop": 65,
            "semctl": 66,
            "semtimedop": 220,
            "msgget": 68,
            "msgsnd": 69,
            "msgrcv": 70,
            "msgctl": 71,
            "mq_open": 240,
            "mq_unlink": 241,
            "mq_timedsend": 242,
            "mq_timedreceive": 243,
            "mq_notify": 244,
            "mq_getsetattr": 245,
            "io_setup": 206,
            "io_destroy": 207,
            "io_submit": 209,
            "io_cancel": 210,
            "io_getevents": 208,
            "io_pgetevents": 333,
            "inotify_init": 253,
            "inotify_init1": 294,
            "inotify_add_watch": 254,
            "fanotify_init": 300,
            "fanotify_mark": 301,
            "timer_create": 222,
            "memfd_secret": 447,
            "setxattr": 188,
            "lsetxattr": 189,
            "fsetxattr": 190,
            "setxattrat": 463,
            "removexattr": 197,
            "lremovexattr": 198,
            "fremovexattr": 199,
            "removexattrat": 466,
            "open_tree_attr": 467,
            "kill": 62,
            "tkill": 200,
            "tgkill": 234,
            "rt_sigqueueinfo": 129,
            "rt_tgsigqueueinfo": 297,
            "pidfd_send_signal": 424,
            "alarm": 37,
            "setitimer": 38,
            "setrlimit": 160,
            "pipe": 22,
            "pipe2": 293,
            "mknod": 133,
            "mknodat": 259,
            "fcntl": 72,
            "prlimit64": 302,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "clone": 220,
            "clone3": 435,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "unshare": 97,
            "setns": 268,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "chroot": 51,
            "bpf": 280,
            "perf_event_open": 241,
            "userfaultfd": 282,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "kexec_load": 104,
            "open_by_handle_at": 265,
            "name_to_handle_at": 264,
            "socket": 198,
            "socketpair": 199,
            "memfd_create": 279,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "open_tree": 428,
            "move_mount": 429,
            "mount_setattr": 442,
            "shmget": 194,
            "shmat": 196,
            "shmctl": 195,
            "shmdt": 197,
            "semget": 190,
            "semop": 193,
            "semctl": 191,
            "semtimedop": 192,
            "msgget": 186,
            "msgsnd": 189,
            "msgrcv": 188,
            "msgctl": 187,
            "mq_open": 180,
            "mq_unlink": 181,
            "mq_timedsend": 182,
            "mq_timedreceive": 183,
            "mq_notify": 184,
            "mq_getsetattr": 185,
            "io_setup": 0,
            "io_destroy": 1,
            "io_submit": 2,
            "io_cancel": 3,
            "io_getevents": 4,
            "io_pgetevents": 292,
            "inotify_init1": 26,
            "inotify_add_watch": 27,
            "fanotify_init": 262,
            "fanotify_mark": 263,
            "timer_create": 107,
            "memfd_secret": 447,
            "setxattr": 5,
            "lsetxattr": 6,
            "fsetxattr": 7,
            "setxattrat": 463,
            "removexattr": 14,
            "lremovexattr": 15,
            "fremovexattr": 16,
            "removexattrat": 466,
            "open_tree_attr": 467,
            "kill": 129,
            "tkill": 130,
            "tgkill": 131,
            "rt_sigqueueinfo": 138,
            "rt_tgsigqueueinfo": 240,
            "pidfd_send_signal": 424,
            "setitimer": 103,
            "setrlimit": 164,
            "pipe2": 59,
            "mknodat": 33,
            "fcntl": 25,
            "prlimit64": 261,
        },
    ),
}


def supported(machine: str | None = None) -> bool:
    return (machine or platform.machine()) in _ARCHES


def _argument_check(op, label, number: int, index: int, refused) -> None:
    """Instructions that send ``number`` with a refused argument to EPERM and with any other to ALLOW (the
    accumulator then holds the argument, so no later system-call test may follow a match). The kernel's fcntl
    command is 32 bits wide, so the low word decides; a pointer is NULL only if both of its words are 0."""
    low = _OFF_ARGS + 8 * index  # seccomp_data's args are u64, little-endian on both tables' machines
    op(_JEQ, number, None, f"not {number}")
    op(_LD_W_ABS, low)
    if refused == "nonzero":
        op(_JEQ, 0, None, "eperm")
        op(_LD_W_ABS, low + 4)
        op(_JEQ, 0, "allow", "eperm")
    else:
        for value in refused:
            op(_JEQ, value, "eperm", None)
        op(_RET, _ALLOW)
    label(f"not {number}")


def filter_bytes(machine: str | None = None, *, allow: tuple[str, ...] = ()) -> bytes:
    """The filter as ``struct sock_filter`` records, the format ``bwrap --seccomp FD`` and ``PR_SET_SECCOMP``
    read; ``allow`` names denied calls to let through (bubblewrap's filter lets ``mount`` through for the runner's
    set-up, which then loads the whole filter on top)."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise OSError(f"no seccomp table for the {machine} architecture (supported: {', '.join(_ARCHES)})")
    audit_arch, numbers = _ARCHES[machine]
    prog: list[tuple] = []  # (code, jump-if-true label or None, jump-if-false label or None, k)
    labels: dict[str, int] = {}

    def op(code, k, jt=None, jf=None):
        prog.append((code, jt, jf, k))

    def label(name):
        labels[name] = len(prog)

    op(_LD_W_ABS, _OFF_ARCH)
    op(_JEQ, audit_arch, None, "kill")
    op(_LD_W_ABS, _OFF_NR)
    if machine == "x86_64":
        op(_JGE, 0x40000000, "kill", None)  # the x32 ABI's numbers alias the denied ones
    for name in _DENIED:
        if name in numbers and name not in allow:
            op(_JEQ, numbers[name], "eperm", None)
    for name, (index, refused) in _DENIED_IF.items():
        if name in numbers and name not in allow:
            _argument_check(op, label, numbers[name], index, refused)
    label("allow")
    op(_RET, _ALLOW)
    label("eperm")
    op(_RET, _ERRNO | _EPERM)
    label("kill")
    op(_RET, _KILL_PROCESS)

    out = bytearray()
    for i, (code, jt, jf, k) in enumerate(prog):
        offsets = []
        for name in (jt, jf):
            off = 0 if name is None else labels[name] - (i + 1)
            if not 0 <= off < 256:
                raise AssertionError(f"seccomp: jump out of range at {i}")
            offsets.append(off)
        out += struct.pack("=HBBI", code, offsets[0], offsets[1], k)
    return bytes(out)


def filter_fd(*, allow: tuple[str, ...] = ()) -> int:
    """A pipe's read end holding the filter (bwrap reads it to the end); the caller closes it after spawning."""
    data = filter_bytes(allow=allow)
    r, w = os.pipe()
    try:
        os.write(w, data)  # a few hundred bytes: fits the pipe buffer, never blocks
    finally:
        os.close(w)
    return r
