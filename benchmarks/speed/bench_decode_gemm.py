"""Why a decode step runs below the matmul roofline on a CPU: the same small-M products from cache and from memory.

A decode step multiplies a few rows (the batch's new tokens) by every weight of the model once. This script times
SmolLM2-135M's shapes (30 layers of q / k / v / o and the MLP's three projections, 576 -> 1536; the 49,152-word
vocabulary projection) at M rows, float32, one thread, two ways:
- **in cache**: one layer's weights, multiplied again and again (they stay in the CPU's caches: what a matmul
  benchmark measures);
- **streamed**: all 30 layers' distinct weights in turn, 425 MB in float32, as a decode step reads them (from memory).
It prints GFLOP per CPU-second of each and the bytes of weights read per CPU-second while streaming, and the streamed
layers and the vocabulary head once more with the weights in oneDNN's packed layout (`torch.ops.mkldnn`, what
`cpu/autocast_cache.py` gives a frozen weight of at least PACK_MIN_WEIGHT elements for decoding steps).

    python benchmarks/speed/bench_decode_gemm.py                  # M = 8, 16, 64
    python benchmarks/speed/bench_decode_gemm.py --rows 16 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

HIDDEN, INTER, KV, LAYERS, VOCAB = 576, 1536, 192, 30, 49152  # SmolLM2-135M
SHAPES = [
    (HIDDEN, HIDDEN),
    (KV, HIDDEN),
    (KV, HIDDEN),
    (HIDDEN, HIDDEN),
    (INTER, HIDDEN),
    (INTER, HIDDEN),
    (HIDDEN, INTER),
]


def _cpu_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        c0 = time.process_time()
        fn()
        times.append(time.process_time() - c0)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[8, 16, 64], help="M: rows per product (decode batch)")
    p.add_argument("--repeats", type=int, default=3)
    opts = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = [[torch.randn(n, k) for n, k in SHAPES] for _ in range(LAYERS)]
    head = torch.randn(VOCAB, HIDDEN)
    layer_flops_per_row = 2 * sum(n * k for n, k in SHAPES)
    layer_bytes = 4 * sum(n * k for n, k in SHAPES)
    print(
        f"float32, one thread; {LAYERS} layers x {layer_bytes / 1e6:.1f} MB of weights, vocabulary head "
        f"{4 * head.numel() / 1e6:.0f} MB"
    )
    packed = [[torch.ops.mkldnn._reorder_linear_weight(w, None) for w in weights] for weights in layers]
    head_packed = torch.ops.mkldnn._reorder_linear_weight(head, None)
    print(
        f"{'rows':>4} {'layers in cache':>16} {'layers streamed':>16} {'streamed GB/s':>13} {'vocab head':>11}"
        f" {'streamed, packed':>17} {'head, packed':>13}"
    )
    for m in opts.rows:
        xs = {k: torch.randn(m, k) for k in (HIDDEN, INTER)}

        def one_layer(weights):
            for w in weights:
                torch.nn.functional.linear(xs[w.shape[1]], w)

        cached = _cpu_seconds(lambda: [one_layer(layers[0]) for _ in range(LAYERS)], opts.repeats)
        streamed = _cpu_seconds(lambda: [one_layer(w) for w in layers], opts.repeats)
        vocab = _cpu_seconds(lambda: torch.nn.functional.linear(xs[HIDDEN], head), opts.repeats)

        def one_packed(weights, plain):
            for w, p in zip(weights, plain):
                torch.ops.mkldnn._linear_pointwise(xs[p.shape[1]], w, None, "none", [], "")

        streamed_packed = _cpu_seconds(lambda: [one_packed(w, p) for w, p in zip(packed, layers)], opts.repeats)
        vocab_packed = _cpu_seconds(
            lambda: torch.ops.mkldnn._linear_pointwise(xs[HIDDEN], head_packed, None, "none", [], ""), opts.repeats
        )
        flops, head_flops = LAYERS * layer_flops_per_row * m, 2 * m * head.numel()
        print(
            f"{m:>4} {flops / cached / 1e9:>10.0f} GF/s {flops / streamed / 1e9:>10.0f} GF/s "
            f"{LAYERS * layer_bytes / streamed / 1e9:>13.1f} {head_flops / vocab / 1e9:>6.0f} GF/s"
            f" {flops / streamed_packed / 1e9:>12.0f} GF/s {head_flops / vocab_packed / 1e9:>8.0f} GF/s"
        )


if __name__ == "__main__":
    main()
