"""Where a DeepSpeed iteration's time goes: ZeRO-3 against ZeRO-2 and plain data parallel, 2 processes.

    python benchmarks/speed/bench_zero3.py                       # 2 CPU processes, 6 iterations of 8 episodes, 2 rounds
    python benchmarks/speed/bench_zero3.py --rounds 3 --json docs/data/bench_zero3_cpu.json

Each round launches `examples/ds_train.py` once per mode, the modes one right after the other (so a busy machine
slows all of them alike): `accelerate launch --num_processes 2 --mixed_precision no --config_file
trl_collm/accelerate_configs/zero3.yaml examples/ds_train.py --iterations 6 --global-batch 8` (zero2.yaml for
ZeRO-2; `torch.distributed.run` with accelerate's multi-CPU state for plain data parallel; `zero3-hooks` adds
`--per-module-fetches`, i.e. `ds3_gather_for_training=False`). ds_train.py records rank 0's seconds in rollout,
scoring and update per iteration; the table gives the median over every iteration after the first (warm-up) of every
round, the ratio of each mode's iteration to ZeRO-2's, and (ZeRO-3) how many times rank 0 gathered partitioned
parameters per phase (DeepSpeed's per-module fetches plus whole-model gathers): a count a busy machine does not change.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "ds_train.py"
CONFIGS = ROOT / "trl_collm" / "accelerate_configs"
# zero3: the default (ds3_gather_for_training: one gather per model and pass); zero3-hooks: scoring and update through
# DeepSpeed's per-module fetches (ds3_gather_for_training=False, the behaviour before it existed).
MODES = ("zero3", "zero3-hooks", "zero2", "plain")


def launch(mode: str, out: Path, extra: list[str]) -> dict:
    from trl_collm.testing import local_launch_command

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "RANK", "LOCAL_RANK", "WORLD_SIZE"))}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT))
    if mode == "plain":
        env["ACCELERATE_USE_CPU"] = "true"
    cmd = local_launch_command(SCRIPT, None if mode == "plain" else CONFIGS / f"{mode.split('-')[0]}.yaml")
    if mode == "zero3-hooks":
        extra = [*extra, "--per-module-fetches"]
    cmd += ["--out", str(out), *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{proc.stderr[-4000:]}")
    return json.loads((out / "metrics.json").read_text())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--json", default=None, help="write the per-mode figures here")
    a = p.parse_args()
    from trl_collm.testing import tiny_model_dir

    tiny_model_dir("tiny-qwen2")  # built once here, not by two processes at the same time
    extra = ["--iterations", str(a.iterations), "--global-batch", str(a.global_batch)]
    samples = {m: {"iteration": [], "rollout": [], "score_rollout": [], "update": []} for m in a.modes}
    fetches = {m: {} for m in a.modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for mode in a.modes:
                info = launch(mode, Path(tmp) / f"{mode}{r}", extra)
                samples[mode]["iteration"] += [h["time/iteration_s"] for h in info["history"]][1:]
                for phase, times in info["phases_s"].items():
                    samples[mode][phase] += times[1:]
                for phase, counts in info.get("zero3_fetches", {}).items():
                    fetches[mode].setdefault(phase, []).extend(counts[1:])
                print(f"round {r} {mode}: {statistics.median(samples[mode]['iteration']):.3f} s", flush=True)
    result = {m: {k: statistics.median(v) for k, v in s.items()} for m, s in samples.items()}
    for m, r in result.items():
        r["fetches"] = {k: statistics.median(v) for k, v in fetches[m].items() if v}
    base = result.get("zero2", {}).get("iteration")
    print(
        f"\n{'mode':<11} {'iteration s':>11} {'x ZeRO-2':>8} {'rollout':>8} {'score':>7} {'update':>7}  ZeRO-3 "
        "fetches r/s/u"
    )
    for m, r in result.items():
        ratio = f"{r['iteration'] / base:.2f}" if base else "-"
        f = r["fetches"]
        counts = "/".join(str(int(f.get(k, 0))) for k in ("rollout", "score_rollout", "update"))
        print(
            f"{m:<11} {r['iteration']:>11.3f} {ratio:>8} {r['rollout']:>8.3f} {r['score_rollout']:>7.3f} "
            f"{r['update']:>7.3f}  {counts}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "median_s": result}, indent=1))


if __name__ == "__main__":
    main()
