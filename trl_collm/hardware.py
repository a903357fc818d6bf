"""What this machine's CPU can do, detected at run time (never assumed).

Why it matters: bfloat16 matmuls are fast on a CPU only where it has native bf16 instructions (x86 ``avx512_bf16`` or
``amx_bf16``, Arm ``bf16``); elsewhere PyTorch emulates them and a training iteration ran ~6x slower than float32 on
an AVX2-only machine of this project. One place answers the question for the trainers, the CLI and the benchmarks.
"""

from __future__ import annotations

import functools
import os
import platform
import time

# The Python path's override: a thread count, "auto" (the idle cores) or "torch" (torch's own choice).
THREADS_ENV = "TRL_COLLM_THREADS"
_chosen_threads: int | None = None  # the count pick_cpu_threads last set (the CLI's, then the trainer sees it stands)

_NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 (AVX-512 / AMX), Arm (FEAT_BF16)


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (``flags`` on x86, ``Features`` on Arm); empty elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return flags_from_cpuinfo(f.read())
    except OSError:
        return frozenset()


def flags_from_cpuinfo(text: str) -> frozenset[str]:
    """The first processor's flags in a ``/proc/cpuinfo`` text."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_has_native_bf16() -> bool:
    """True when the CPU computes bfloat16 matmuls in hardware, so bf16 compute pays on it."""
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return True  # Apple M2 and later have FEAT_BF16; /proc/cpuinfo does not exist there
    return has_native_bf16(cpu_flags())


def has_native_bf16(flags: frozenset[str]) -> bool:
    return bool(flags & _NATIVE_BF16_FLAGS)


def cpu_description() -> str:
    """One line for logs and benchmark headers: the machine, its widest vector unit and whether bf16 is native."""
    flags = cpu_flags()
    vector = next((v for v in ("amx_bf16", "avx512f", "avx2", "asimd") if v in flags), "unknown vector unit")
    bf16 = "native bf16" if cpu_has_native_bf16() else "no native bf16 (bf16 is emulated, slow)"
    return f"{platform.machine()} {vector}, {bf16}"


def fastest_cpu_seconds(call, seconds: float) -> float:
    """CPU seconds of the fastest of the calls to `call` made in `seconds` (after one warm-up call). CPU time, not
    wall: on a shared machine it is what the cores do while this process holds them; the fastest call, not the mean,
    because neighbours sharing the caches slow some calls, and a roofline read low would put a benchmark's floor
    above what it measured."""
    call()  # warm-up: first call allocates, touches the pages, picks a kernel
    best, start = float("inf"), time.process_time()
    while True:
        t0 = time.process_time()
        call()
        t1 = time.process_time()
        best = min(best, t1 - t0)
        if t1 - start >= seconds:
            return max(best, 1e-9)


def matmul_gflops(dtype, n: int = 1024, seconds: float = 0.5) -> float:
    """Measured GFLOP per CPU-second of an n x n matmul in ``dtype`` (a roofline for benchmarks; on one thread,
    GFLOP/s), from the fastest call (`fastest_cpu_seconds`)."""
    import torch

    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    return 2 * n**3 / fastest_cpu_seconds(lambda: a @ b, seconds) / 1e9


def memory_gbs(mib: int = 256, seconds: float = 0.5) -> float:
    """Measured memory bandwidth in GB per CPU-second (one thread): bytes read and written by the fastest copy of a
    `mib` MiB float32 tensor, far larger than the caches (`fastest_cpu_seconds`)."""
    import torch

    src = torch.randn(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / fastest_cpu_seconds(lambda: dst.copy_(src), seconds) / 1e9


def idle_cpu_cores() -> int:
    """The physical cores this process may run on that the last minute's load leaves idle, at least 1: a thread
    count that uses an idle machine's cores without spin-waiting for cores that other processes hold (the
    1-minute load average lags: a job that stopped seconds ago still counts)."""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    physical = _physical_cores()
    cores = min(allowed, physical) if physical else allowed
    try:
        load = os.getloadavg()[0]
    except OSError:  # not on this platform: assume the cores are busy
        return 1
    return max(1, min(cores, round(cores - load)))


def _torch_default_threads() -> set[int]:
    """The counts torch starts with on this machine (one per core: physical or logical, within this process's
    affinity). A count outside them was set by someone: the user's own torch.set_num_threads."""
    counts = {os.cpu_count() or 1}
    if hasattr(os, "sched_getaffinity"):
        counts.add(len(os.sched_getaffinity(0)))
    cores = _physical_cores()
    if cores:
        counts.add(cores)
    return counts


def _physical_cores() -> int:
    """Physical cores as /proc/cpuinfo lists them (distinct (socket, core id) pairs: hyperthread siblings once);
    0 where it lists none."""
    pairs, socket = set(), None
    for line in _cpuinfo_lines():
        if line.startswith("physical id"):
            socket = line.split(":")[1].strip()
        elif line.startswith("core id"):
            pairs.add((socket, line.split(":")[1].strip()))
    return len(pairs)


def _cpuinfo_lines() -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []


def pick_cpu_threads(threads: int | str | None, on_cpu: bool, keep_user_count: bool = False) -> int | None:
    """torch's intra-op thread count for a run, the one rule of the CLI (`--threads`) and the trainers (Python):
    `threads` when given ("auto": `idle_cpu_cores()`); else TRL_COLLM_THREADS (a count, "auto", or "torch" to keep
    torch's choice); else, on CPU, 1 unless OMP_NUM_THREADS is set (torch read it at import); on GPU, torch's
    default. torch's own CPU default (one thread per core) made the tiny-model CPU runs 5-25x slower on a shared
    machine: its threads spin-wait for cores other processes hold. `keep_user_count` (the trainers): a count the
    user set with torch.set_num_threads (one that is not torch's default here), or one this function set before
    (the CLI's `--threads`), stands. Returns the count set, or None when the count is left as it is. A count < 1 is
    a ValueError."""
    global _chosen_threads
    import torch

    if threads is None and os.environ.get(THREADS_ENV, "").strip():
        value = os.environ[THREADS_ENV].strip()
        if value.lower() == "torch":
            return None
        if value.lower() != "auto" and not value.isdigit():
            raise ValueError(
                f"{THREADS_ENV}={value!r}: give a thread count >= 1, 'auto' for the idle cores, or 'torch' for "
                "torch's own choice"
            )
        threads = int(value) if value.isdigit() else "auto"
    if threads == "auto":
        threads = idle_cpu_cores()
    if threads is not None and threads < 1:
        raise ValueError(f"a torch thread count must be >= 1, got {threads}")
    if threads is None:
        if not on_cpu or os.environ.get("OMP_NUM_THREADS"):
            return None
        now = torch.get_num_threads()
        if keep_user_count and (now == _chosen_threads or now not in _torch_default_threads()):
            return None
    torch.set_num_threads(threads or 1)
    _chosen_threads = threads or 1
    return _chosen_threads
