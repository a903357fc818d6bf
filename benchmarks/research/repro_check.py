"""Is a seeded real-model run reproducible on this machine? The same MC run (LoRA SmolLM2 team, writing-summary)
twice in fresh processes, one thread each; prints each iteration's training return and whether the final adapter
weights are bitwise equal. Issue 28 saw a re-run match a table run for 3 iterations and then differ: the two
had different budgets, so the linear learning-rate decay stepped them at different rates from the second update
(docs/real_findings.md, tests/test_mc.py); this check runs both at one budget.

    python benchmarks/research/repro_check.py [--iterations 4] [--tokens 16] [--compute fp32|bf16] [--threads 1]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def child(a) -> dict:
    import torch

    torch.set_num_threads(a.threads)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import real_findings

    s = real_findings.settings("writing-summary", budget=4 * a.iterations, batch=4, compute=a.compute)
    s["response_length"] = a.tokens
    trainer, args = real_findings.make_trainer("writing-summary", "mc", 0, 3e-3, s)
    trainer.train()
    digest = hashlib.sha256()
    for p in trainer.team.parameters():
        if p.requires_grad:
            digest.update(p.detach().contiguous().numpy().tobytes())
    curve, _ = real_findings.curves(trainer.metrics_history, args)
    return dict(curve=[v for _, v in curve], weights=digest.hexdigest())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=4)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--compute", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(a)), flush=True)
        return
    runs = []
    for _ in range(2):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--iterations", str(a.iterations)]
        cmd += ["--tokens", str(a.tokens), "--compute", a.compute, "--threads", str(a.threads)]
        out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS=str(a.threads)))
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(out.stderr[-3000:])
        runs.append(json.loads(line[len("RESULT ") :]))
        print(f"run {len(runs)}: returns {[round(v, 4) for v in runs[-1]['curve']]}", flush=True)
    same = runs[0]["weights"] == runs[1]["weights"]
    print(
        f"{a.compute}, {a.threads} thread(s): curves equal {runs[0]['curve'] == runs[1]['curve']}, "
        f"final adapter weights bitwise equal {same}"
    )


if __name__ == "__main__":
    main()
