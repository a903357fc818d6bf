"""CPU feature detection: the flags parsed from /proc/cpuinfo texts of the machines this project has met."""

import pytest
import torch

from trl_collm import hardware

AVX2_ONLY = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\n"
AVX512_BF16 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 fma\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n"


def test_flags_are_read_from_the_first_processor():
    assert hardware.flags_from_cpuinfo(AVX2_ONLY) == {"fpu", "sse2", "avx", "avx2", "fma"}
    assert hardware.flags_from_cpuinfo("processor\t: 0\n") == frozenset()


def test_native_bf16_is_told_from_the_flags():
    assert not hardware.has_native_bf16(hardware.flags_from_cpuinfo(AVX2_ONLY))
    assert hardware.has_native_bf16(hardware.flags_from_cpuinfo(AVX512_BF16))
    assert hardware.has_native_bf16(hardware.flags_from_cpuinfo(ARM))


def test_this_machine_is_described_and_measured():
    line = hardware.cpu_description()
    assert ("native bf16" in line) and (("no native" in line) != hardware.cpu_has_native_bf16())
    assert hardware.matmul_gflops(torch.float32, n=128, seconds=0.01) > 0
    assert hardware.memory_gbs(mib=8, seconds=0.01) > 0


def test_the_roofline_is_the_fastest_call_not_the_mean(monkeypatch):
    # a scripted CPU clock: the process starts at 0; the first timed call takes 1.0 s (a neighbour in the caches),
    # the second 0.5 s, and the budget (1.2 s) is spent after it
    clock = iter([0.0, 0.0, 1.0, 1.0, 1.5])
    monkeypatch.setattr(hardware.time, "process_time", lambda: next(clock))
    rate = hardware.matmul_gflops(torch.float32, n=128, seconds=1.2)
    assert rate == pytest.approx(2 * 128**3 / 0.5 / 1e9)  # the mean would give 2 calls / 1.5 s: 2/3 of it
