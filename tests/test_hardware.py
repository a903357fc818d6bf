"""CPU feature detection: the flags parsed from /proc/cpuinfo texts of the machines this project has met."""

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
