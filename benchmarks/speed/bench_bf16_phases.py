"""Where CPU bf16 autocast pays on the real model and where it does not: one LoRA agent of issue 28's workload (the
trainer bench_workload.py builds), a prefill of 8 x 300 tokens and decode steps against its KV cache, float32 vs
bf16 autocast (as training runs it), alternated twice; CPU milliseconds, one thread.

    python benchmarks/speed/bench_bf16_phases.py [--rows 8] [--prompt 300] [--steps 8]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt", type=int, default=300, help="prompt tokens per row")
    p.add_argument("--steps", type=int, default=8, help="decode steps timed")
    a = p.parse_args()
    import bench_workload
    import torch

    from trl_collm.hardware import cpu_description

    torch.set_num_threads(1)
    trainer, _ = bench_workload.workload_trainer("cc", a.rows, 8, True, "/tmp/bench-bf16-phases")
    with contextlib.ExitStack() as stack:
        model = stack.enter_context(trainer.team.active(trainer.args.agent_names[0]))
        ids = torch.randint(0, 1000, (a.rows, a.prompt))
        mask = torch.ones_like(ids)
        print(f"{cpu_description()}; one thread; {a.rows} rows x {a.prompt} prompt tokens")
        for mode in ("fp32", "bf16", "fp32", "bf16"):
            compute = trainer.accelerator.autocast() if mode == "bf16" else contextlib.nullcontext()
            with torch.no_grad(), compute:
                c0 = time.process_time()
                past = model(input_ids=ids, attention_mask=mask, use_cache=True).past_key_values
                prefill = time.process_time() - c0
                tok = torch.randint(0, 1000, (a.rows, 1))
                c0 = time.process_time()
                for i in range(a.steps):
                    step_mask = torch.ones(a.rows, a.prompt + 1 + i, dtype=torch.long)
                    past = model(input_ids=tok, attention_mask=step_mask, past_key_values=past).past_key_values
                decode = (time.process_time() - c0) / a.steps
            print(f"{mode}: prefill {1000 * prefill:8.0f} CPU ms   decode step {1000 * decode:6.1f} CPU ms", flush=True)


if __name__ == "__main__":
    main()
