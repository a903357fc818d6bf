"""A seccomp filter (classic BPF, built here without libseccomp) that bubblewrap loads before running Python.

Why: with no new processes, the sandbox is ONE process, so its address-space limit (``RLIMIT_AS``) is a memory cap
for the whole sandbox even where no cgroup can be created (see docs/security.md), and nothing can outlive a call.
The filter refuses:

* process creation: ``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD`` (threads share the address space and
  stay allowed), ``clone3`` (answered ENOSYS so that the C library falls back to ``clone`` for threads);
* ways around the namespaces and kernel attack surface that a solution never needs: ``ptrace``,
  ``process_vm_readv/writev``, ``unshare``, ``setns``, ``mount`` and the new mount API, ``pivot_root``,
  ``chroot``, ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*``, ``keyctl`` / ``add_key`` /
  ``request_key``, module loading, ``kexec_load``, file handles (``open_by_handle_at``);
* ``socket`` / ``socketpair`` (there is no network in the sandbox anyway) and ``memfd_create`` (anonymous files
  are memory that ``RLIMIT_AS`` does not count).

Refused calls fail with EPERM; a system-call number of another ABI (x32 on x86-64) or another architecture kills
the process. Tables: x86-64 (run in CI) and aarch64 (from the kernel's asm-generic table).
"""

from __future__ import annotations

import os
import platform
import struct

__all__ = ["filter_bytes", "supported"]

# seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_EPERM, _ENOSYS = 1, 38
_CLONE_THREAD = 0x00010000

_DENIED = (
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
)

_ARCHES = {
    # machine: (AUDIT_ARCH_*, {name: number}); fork/vfork do not exist on aarch64.
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
        },
    ),
}


def supported(machine: str | None = None) -> bool:
    return (machine or platform.machine()) in _ARCHES


def filter_bytes(machine: str | None = None) -> bytes:
    """The filter as ``struct sock_filter`` records, the format ``bwrap --seccomp FD`` reads."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise OSError(f"no seccomp table for the {machine} architecture (supported: {', '.join(_ARCHES)})")
    audit_arch, numbers = _ARCHES[machine]
    prog: list[tuple] = []  # (code, jump-if-true label or 0, jump-if-false label or 0, k)

    def op(code, k, jt=None, jf=None):
        prog.append((code, jt, jf, k))

    op(_LD_W_ABS, _OFF_ARCH)
    op(_JEQ, audit_arch, None, "kill")
    op(_LD_W_ABS, _OFF_NR)
    if machine == "x86_64":
        op(_JGE, 0x40000000, "kill", None)  # the x32 ABI's numbers alias the denied ones
    op(_JEQ, numbers["clone3"], "enosys", None)
    op(_JEQ, numbers["clone"], "clone", None)
    for name in _DENIED:
        if name in numbers:
            op(_JEQ, numbers[name], "eperm", None)
    op(_RET, _ALLOW)
    labels = {"clone": len(prog)}
    op(_LD_W_ABS, _OFF_ARG0)  # the low 32 bits of the flags (little-endian on both architectures)
    op(_JSET, _CLONE_THREAD, "thread", "eperm")  # BPF jumps only forward: a second ALLOW for threads
    labels["thread"] = len(prog)
    op(_RET, _ALLOW)
    labels["eperm"] = len(prog)
    op(_RET, _ERRNO | _EPERM)
    labels["enosys"] = len(prog)
    op(_RET, _ERRNO | _ENOSYS)
    labels["kill"] = len(prog)
    op(_RET, _KILL_PROCESS)

    out = bytearray()
    for i, (code, jt, jf, k) in enumerate(prog):
        offsets = []
        for label in (jt, jf):
            off = 0 if label is None else labels[label] - (i + 1)
            if not 0 <= off < 256:
                raise AssertionError(f"seccomp: jump out of range at {i}")
            offsets.append(off)
        out += struct.pack("=HBBI", code, offsets[0], offsets[1], k)
    return bytes(out)


def filter_fd() -> int:
    """A pipe's read end holding the filter (bwrap reads it to the end); the caller closes it after spawning."""
    data = filter_bytes()
    r, w = os.pipe()
    try:
        os.write(w, data)  # a few hundred bytes: fits the pipe buffer, never blocks
    finally:
        os.close(w)
    return r
