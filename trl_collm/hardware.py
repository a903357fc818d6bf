"""What this machine's CPU can do, detected at run time (never assumed).

Why it matters: bfloat16 matmuls are fast on a CPU only where it has native bf16 instructions (x86 ``avx512_bf16`` or
``amx_bf16``, Arm ``bf16``); elsewhere PyTorch emulates them and a training iteration ran ~6x slower than float32 on
an AVX2-only machine of this project. One place answers the question for the trainers, the CLI and the benchmarks.
"""

from __future__ import annotations

import functools
import platform
import time

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


def matmul_gflops(dtype, n: int = 1024, seconds: float = 0.5) -> float:
    """Measured GFLOP per CPU-second of an n x n matmul in ``dtype`` (a roofline for benchmarks), from the fastest of
    the calls made in ``seconds``. CPU time, not wall: on a shared machine it is what the cores do while this process
    holds them (on one thread, GFLOP/s); the fastest call, not the mean, because neighbours sharing the caches slow
    some calls, and a roofline read low would put a benchmark's floor above what it measured."""
    import torch

    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    a @ b  # warm-up: first call allocates and picks a kernel
    best, start = float("inf"), time.process_time()
    while True:
        t0 = time.process_time()
        a @ b
        t1 = time.process_time()
        best = min(best, t1 - t0)
        if t1 - start >= seconds:
            break
    return 2 * n**3 / max(best, 1e-9) / 1e9
