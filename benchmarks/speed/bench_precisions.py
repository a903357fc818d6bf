"""Which number formats this CPU multiplies faster than float32, at the products a real-model iteration runs.

Issue 28's 3x target (fewer CPU seconds per generated token at equal work) is out of float32's reach on a CPU
without native bf16: the iteration's arithmetic alone, at the best GEMM's rate, is above the target (docs/benchmarks.md,
"The arithmetic floor"). A lower precision is the lever that remains; this script measures each one the CPU offers,
on SmolLM2-135M's linear layers (30 layers of q / k / v / o and the MLP, 576 -> 1536), one thread:
- **decode**: 16 rows (the workload's 8 episodes x 2 agents) against all 30 layers' distinct weights in turn, as a
  decode step streams them from memory;
- **update**: 2,330 rows (one agent's update forward of the workload: the shared prompt head once, then 8 rests)
  against one layer's weights.
Formats: float32; bfloat16 and float16 (`torch.matmul` in that dtype: native only where the CPU has the instructions,
e.g. avx512_bf16 / AMX, emulated elsewhere); int8 weights with dynamically quantized activations (torch.ao's
`quantize_dynamic` Linear, fbgemm / x86 engine). int8 is forward only: that module has no gradient to its input,
which a LoRA update's backward needs through every frozen layer, so at most the rollout and the update's forward
could use it.

    python benchmarks/speed/bench_precisions.py            # prints GFLOP per CPU-second and the ratio to float32
"""

from __future__ import annotations

import argparse
import functools
import time
import warnings

import torch

HIDDEN, INTER, KV, LAYERS = 576, 1536, 192, 30  # SmolLM2-135M
SHAPES = [
    (HIDDEN, HIDDEN),
    (KV, HIDDEN),
    (KV, HIDDEN),
    (HIDDEN, HIDDEN),
    (INTER, HIDDEN),
    (INTER, HIDDEN),
    (HIDDEN, INTER),
]
ROWS = {"decode": 16, "update": 2330}


def cpu_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        c0 = time.process_time()
        fn()
        times.append(time.process_time() - c0)
    return min(times)  # the least disturbed run: neighbours on a shared machine only ever slow a run down


def linears(dtype: str, weights: list[torch.Tensor]):
    """One callable per weight, x -> x @ w.T in `dtype`."""
    if dtype == "int8":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao's deprecation notice
            out = []
            for w in weights:
                lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
                lin.weight.data = w
                # Wrapped: quantize_dynamic swaps a module's children, never the module it is given.
                q = torch.ao.quantization.quantize_dynamic(
                    torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8
                )
                if type(q[0]) is torch.nn.Linear:
                    raise RuntimeError("quantize_dynamic left the layer in float32: no int8 engine in this torch build")
                out.append(q)
            return out
    dt = getattr(torch, dtype)
    return [functools.partial(lambda w, x: torch.nn.functional.linear(x, w), w.to(dt)) for w in weights]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--formats", nargs="+", default=["float32", "bfloat16", "float16", "int8"])
    opts = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    weights = [torch.randn(n, k) / k**0.5 for _ in range(LAYERS) for n, k in SHAPES]
    flops_per_row = 2 * sum(n * k for n, k in SHAPES)
    rates: dict[str, dict[str, float]] = {}
    for fmt in opts.formats:
        dt = torch.float32 if fmt == "int8" else getattr(torch, fmt)  # int8's activations stay float32
        for case, m in ROWS.items():
            layers = LAYERS if case == "decode" else 1  # decode streams all layers; the update reuses one
            fns = linears(fmt, weights[: len(SHAPES) * layers])
            xs = {k: torch.randn(m, k).to(dt) for k in (HIDDEN, INTER)}
            pairs = [(f, xs[w.shape[1]]) for f, w in zip(fns, weights)]
            with torch.no_grad():
                s = cpu_seconds(lambda pairs=pairs: [f(x) for f, x in pairs], opts.repeats)
            rates.setdefault(fmt, {})[case] = layers * flops_per_row * m / s / 1e9
    print(
        f"one thread; GFLOP per CPU-second (ratio to float32); decode {ROWS['decode']} rows x {LAYERS} layers "
        f"streamed, update {ROWS['update']} rows x 1 layer"
    )
    print(f"{'format':>9} {'decode':>16} {'update':>16}")
    for fmt, r in rates.items():
        base = rates.get("float32", r)
        print(f"{fmt:>9} " + " ".join(f"{r[c]:>7.1f} ({r[c] / base[c]:4.2f}x)" for c in ROWS))


if __name__ == "__main__":
    main()
