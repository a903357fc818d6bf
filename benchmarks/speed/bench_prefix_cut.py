"""When does computing the shared head once pay? Break-even of the shared-prefix training forward, by model size.

    python benchmarks/speed/bench_prefix_cut.py                       # tiny + small, CPU, one thread
    python benchmarks/speed/bench_prefix_cut.py --sizes tiny small medium --json docs/data/bench_prefix_cut_cpu.json

A batch shaped like MC's: E distinct prompts of P tokens, each repeated G times (the G samples), plus R response
tokens per row. For each prompt length P it times a log-prob forward + backward (what the update runs) through
`prefix.forward_last` with the cut forced on and forced off, alternating, and reports the median of each. The cut
saves (G - 1) x E x P prompt tokens and costs a second model call plus the KV copies; `prefix.plan_split` uses the
calibrated cost model (`prefix.min_saved_tokens`) to decide, and the last column says what it decides for that batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    p.add_argument("--lengths", type=int, nargs="+", default=[8, 12, 16, 24, 32, 64, 128, 256])
    p.add_argument("--prompts", type=int, default=2, help="E distinct prompts")
    p.add_argument("--group", type=int, default=4, help="G copies of each prompt")
    p.add_argument("--response", type=int, default=16)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    torch.set_num_threads(1)
    from trl_collm.team import prefix
    from trl_collm.testing import build_causal_lm, build_tokenizer

    results = []
    for size in a.sizes:
        model = build_causal_lm(build_tokenizer(), size=size).train()
        vocab = model.config.vocab_size
        print(
            f"{size}: hidden {model.config.hidden_size}, layers {model.config.num_hidden_layers}, "
            f"{prefix.layer_parameters(model)} parameters per layer, cut pays from "
            f"{prefix.min_saved_tokens(model)} saved tokens"
        )
        print(f"{'P':>5} {'saved tok':>9} {'shared s':>9} {'plain s':>9} {'speed-up':>8} {'plan':>6}")
        for length in a.lengths:
            gen = torch.Generator().manual_seed(length)
            heads = torch.randint(3, vocab, (a.prompts, length), generator=gen).repeat_interleave(a.group, 0)
            tails = torch.randint(3, vocab, (heads.shape[0], a.response), generator=gen)
            ids = torch.cat([heads, tails], 1)
            mask = torch.ones_like(ids)
            keep = a.response + 1

            def run(enabled, ids=ids, mask=mask, keep=keep, model=model):
                model.zero_grad(set_to_none=True)
                t0 = time.perf_counter()
                logits = prefix.forward_last(
                    model, ids, mask, keep, causal_lm=True, min_prefix=1, enabled=enabled, min_saved=0
                )  # forced: both sides run whatever the cost model says
                logits.float().logsumexp(-1).mean().backward()
                return time.perf_counter() - t0

            run(True), run(False)  # warm-up
            times = {True: [], False: []}
            for _ in range(a.repeats):
                for enabled in (True, False):
                    times[enabled].append(run(enabled))
            shared, plain = statistics.median(times[True]), statistics.median(times[False])
            split = prefix.plan_split(ids, mask, keep, min_prefix=1)
            planned = prefix.plan_split(ids, mask, keep, min_saved=prefix.min_saved_tokens(model)) is not None
            saved = split.saved_tokens if split is not None else 0
            print(
                f"{length:>5} {saved:>9} {shared:>9.4f} {plain:>9.4f} {plain / shared:>7.2f}x "
                f"{('cut' if planned else 'plain'):>6}"
            )
            results.append(
                {
                    "size": size,
                    "prompt_tokens": length,
                    "saved_tokens": saved,
                    "shared_s": shared,
                    "plain_s": plain,
                    "planned_cut": planned,
                    "hidden": model.config.hidden_size,
                    "layers": model.config.num_hidden_layers,
                    "rows": int(ids.shape[0]),
                }
            )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
