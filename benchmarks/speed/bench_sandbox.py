"""Speed of the code sandbox (trl_collm.sandbox), side by side with the sandbox of an earlier commit.

Figures (each for this sandbox and, with ``--old REV``, for REV's ``trl_collm/sandbox.py``, measured alternately):

1. latency: one HumanEval problem judged with its correct (canonical) solution, ``run_tests`` serially over the
   first ``--problems`` problems; median and 90th percentile. "new" is the steady state of a trainer (a warm
   sandbox and judge wait for the call); "new, cold" empties the warm pools before every call;
2. throughput: all 164 problems with 2 concurrent workers (threads, as ``CodeEnv.step_batch`` runs them);
3. with ``--iteration``: the code task's training iteration (tiny offline models, CoLLM-CC preset, batch 8, 2
   turns), where the env scores scripted code instead of the random models' text, so that every episode runs the
   sandbox as a real run would: half the episodes are right at turn 1, the others wrong at turn 1 and right at
   turn 2.

    python benchmarks/speed/bench_sandbox.py                      # 1 + 2 against commit b72b5f6 (the old sandbox)
    python benchmarks/speed/bench_sandbox.py --iteration          # + 3 (about 2 minutes on 2 cores)
    python benchmarks/speed/bench_sandbox.py --old none           # this sandbox only
    python benchmarks/speed/bench_sandbox.py --smoke              # seconds; for CI

A benchmark, not a test: it prints figures (and writes JSON with ``--json PATH``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "benchmarks/speed/bench_sandbox.py"
DEFAULT_OLD = "b72b5f6"  # the last commit with the in-process harness (trl_collm/sandbox.py, one module)


def load_old(rev: str):
    """REV's trl_collm/sandbox.py as a module (it was self-contained), or None."""
    try:
        text = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{rev}:trl_collm/sandbox.py"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        print(f"(no old sandbox at {rev}: {err})")
        return None
    path = Path(tempfile.mkdtemp(prefix="old-sandbox-")) / "old_sandbox.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("old_sandbox", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_sandbox"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def judges(old):
    """name -> judge(row) running the canonical solution; every judge returns (passed, total)."""
    from trl_collm.sandbox import run_tests
    from trl_collm.tasks.code_program import _split_prompt

    def new_judge(row):
        preamble, _ = _split_prompt(row["prompt"], row["entry_point"])
        rep = run_tests(
            row["prompt"] + row["canonical_solution"],
            row["test"],
            entry_point=row["entry_point"],
            trusted_setup=preamble,
            timeout=30.0,
            per_test_timeout=3.0,
        )
        return rep.passed, rep.total

    def cold_judge(row):  # no warm sandbox or judge: both start inside the measured call
        from trl_collm.sandbox import shutdown

        shutdown()
        return new_judge(row)

    out = {"new": new_judge, "new, cold": cold_judge}
    if old is not None:

        def old_judge(row):
            rep = old.run_tests(
                row["prompt"] + row["canonical_solution"],
                row["test"],
                entry_point=row["entry_point"],
                timeout=30.0,
                per_test_timeout=3.0,
            )
            return rep.passed, rep.total

        out["old"] = old_judge
    return out


def latency(judge_fns, rows, repeats: int) -> dict:
    times = {name: [] for name in judge_fns}
    wrong = {name: 0 for name in judge_fns}
    for _ in range(repeats):
        for row in rows:
            for name, judge in judge_fns.items():  # alternating: the same load for both
                t0 = time.perf_counter()
                passed, total = judge(row)
                times[name].append(time.perf_counter() - t0)
                wrong[name] += passed != total
    return {
        name: {
            "median_ms": 1000 * statistics.median(t),
            "p90_ms": 1000 * sorted(t)[int(0.9 * len(t))],
            "n": len(t),
            "not_all_passed": wrong[name],
        }
        for name, t in times.items()
    }


def throughput(judge_fns, rows, workers: int) -> dict:
    out = {}
    for name, judge in judge_fns.items():
        if name.endswith("cold"):
            continue  # emptying the shared pool from 2 threads at once would measure the race, not the sandbox
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(judge, rows))
        seconds = time.perf_counter() - t0
        out[name] = {
            "problems_per_s": len(rows) / seconds,
            "seconds": seconds,
            "not_all_passed": sum(p != t for p, t in results),
        }
    return out


def iteration(old, iterations: int, batch: int) -> dict:
    """Median training-iteration time of the code task with each sandbox (see the module docstring)."""
    import torch
    import transformers

    import trl_collm.tasks.code as code_task
    from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer
    from trl_collm.tasks.code import CodeEnv, load_humaneval
    from trl_collm.tasks.code_program import _signature, _split_prompt
    from trl_collm.testing import tiny_model_dir

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()

    def scripted(row, right: bool) -> list[str]:
        entry = row["entry_point"]
        _, entry_src = _split_prompt(row["prompt"], entry)
        aux = entry_src.replace(f"def {entry}(", "def aux(", 1) + row["canonical_solution"]
        sig = _signature(row["prompt"], entry)
        args = ", ".join(a.split(":")[0].split("=")[0].strip() for a in sig.split(",") if a.strip())
        body = f"    result = aux({args})\n    return result\n" if right else "    return None\n"
        return [aux, f"def {entry}({sig}):\n{body}"]

    class ScriptedCodeEnv(CodeEnv):
        """Scores scripted code instead of the tiny random models' text (same sandbox calls as a real run)."""

        def _score(self, completions):
            right = self.turn >= 1 or int(self.row["task_id"].rsplit("/", 1)[-1]) % 2 == 0
            return super()._score(scripted(self.row, right))

    paths = [tiny_model_dir(f"bench-qwen2-tiny-s{seed}", arch="qwen2", size="tiny", seed=seed) for seed in (0, 1)]
    rows = list(load_humaneval("train", limit=batch * (iterations + 1)))
    plain = code_task.run_tests
    sides = {"new": plain}
    if old is not None:

        def old_run_tests(
            code, tests, entry_point=None, timeout=10.0, per_test_timeout=3.0, memory_mb=512, trusted_setup=""
        ):
            return old.run_tests(
                code,
                tests,
                entry_point=entry_point,
                timeout=timeout,
                per_test_timeout=per_test_timeout,
                memory_mb=memory_mb,
            )

        sides["old"] = old_run_tests
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as tmp:
        trainers = {}
        for name in sides:
            args = MultiAgentPPOConfig(
                output_dir=os.path.join(tmp, name),
                agent_names=["aux", "main"],
                num_turns=2,
                preset="collm",
                per_device_train_batch_size=batch,
                response_length=16,
                learning_rate=1e-5,
                use_cpu=True,
                bf16=False,
                report_to=[],
                save_strategy="no",
                logging_steps=1,
                num_sample_generations=0,
                disable_tqdm=True,
                seed=0,
            )
            tr = MultiAgentPPOTrainer(args=args, model=paths, train_dataset=rows, env=ScriptedCodeEnv())
            tr._batch_sizes()
            tr.create_optimizer_and_scheduler(num_training_steps=(iterations + 1) * tr.optimizer_steps_per_iteration())
            trainers[name] = tr
        times = {name: [] for name in sides}
        try:
            for i in range(iterations + 1):  # iteration 0 warms up
                chunk = rows[i * batch : (i + 1) * batch] if i else rows[:batch]
                for name, fn in sides.items():  # alternating
                    code_task.run_tests = fn
                    t0 = time.perf_counter()
                    trainers[name].training_iteration(chunk)
                    if i:
                        times[name].append(time.perf_counter() - t0)
        finally:
            code_task.run_tests = plain
        for name, t in times.items():
            out[name] = {"iteration_s": statistics.median(t), "all_s": t}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", default=DEFAULT_OLD, help="git revision of the old sandbox to compare with, or 'none'")
    p.add_argument("--problems", type=int, default=40, help="problems for the latency figure")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--iteration", action="store_true", help="also time the code task's training iteration")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--json", default=None)
    p.add_argument("--smoke", action="store_true", help="3 problems for latency, 6 for throughput (seconds; for CI)")
    opts = p.parse_args(argv)
    if opts.smoke:
        opts.problems, opts.iteration = 3, False

    from trl_collm.sandbox import require_sandbox
    from trl_collm.tasks.code import load_humaneval

    require_sandbox()
    old = None if opts.old == "none" else load_old(opts.old)
    rows = list(load_humaneval("all"))
    fns = judges(old)
    for row in rows[:2]:  # warm-up: page cache, first bwrap
        for judge in fns.values():
            judge(row)
    result = {
        "latency": latency(fns, rows[: opts.problems], opts.repeats),
        "throughput": throughput(fns, rows[:6] if opts.smoke else rows, opts.workers),
    }
    if opts.iteration:
        result["iteration"] = iteration(old, opts.iterations, opts.batch)

    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print("| sandbox | latency median ms | p90 ms | problems/s, 2 workers | correct solutions not passing |")
    print("|---|---|---|---|---|")
    for name in fns:
        lat, thr = result["latency"][name], result["throughput"].get(name)
        rate = f"{thr['problems_per_s']:.1f}" if thr else "-"
        print(
            f"| {name} | {lat['median_ms']:.0f} | {lat['p90_ms']:.0f} | {rate} | "
            f"{lat['not_all_passed'] + (thr['not_all_passed'] if thr else 0)} |"
        )
    if "old" in fns:
        ratio = result["latency"]["new"]["median_ms"] / result["latency"]["old"]["median_ms"]
        print(f"latency new / old: {ratio:.2f}x")
    if opts.iteration:
        it = result["iteration"]
        print("\n| sandbox | code-task iteration s (median) |\n|---|---|")
        for name in it:
            print(f"| {name} | {it[name]['iteration_s']:.2f} |")
        if "old" in it:
            print(f"iteration new / old: {it['new']['iteration_s'] / it['old']['iteration_s']:.3f}x")
    if opts.json:
        meta = {
            "command": " ".join(["python", SCRIPT, *(argv if argv is not None else sys.argv[1:])]),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        }
        with open(opts.json, "w") as f:
            json.dump({"meta": meta, **result}, f, indent=2)
        print(f"wrote {opts.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
