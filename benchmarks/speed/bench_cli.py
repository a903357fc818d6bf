"""How fast the command line answers: median wall time of `trl-collm --help`, `trl-collm tasks` and `import
trl_collm` (lazy: no torch / transformers / TRL), next to what loading the trainers costs (what every command paid
before the imports became lazy), all measured in the same run. `trl-collm ppo --help` is timed twice: built (a
fresh help cache each run: the parser imports transformers and torch) and kept (the text the first call stored).

    python benchmarks/speed/bench_cli.py            # 7 runs of each
    python benchmarks/speed/bench_cli.py --runs 15

Each figure is a fresh Python process (`python -m trl_collm.cli ...`, as the `trl-collm` script runs it). On a
machine shared with other jobs the absolute numbers move; the ratio between the rows is the stable figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/speed/

CASES = {
    "trl-collm --help": [sys.executable, "-m", "trl_collm.cli", "--help"],
    "trl-collm tasks": [sys.executable, "-m", "trl_collm.cli", "tasks"],
    "import trl_collm": [sys.executable, "-c", "import trl_collm"],
    "python (empty)": [sys.executable, "-c", "pass"],
    "import trl_collm + trainers (eager)": [sys.executable, "-c", "import trl_collm; trl_collm.MultiAgentPPOTrainer"],
    "trl-collm ppo --help (built)": [sys.executable, "-m", "trl_collm.cli", "ppo", "--help"],
    "trl-collm ppo --help (kept)": [sys.executable, "-m", "trl_collm.cli", "ppo", "--help"],
}


def time_once(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=7)
    a = p.parse_args()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1")
    kept = tempfile.mkdtemp(prefix="bench_cli_help_")
    results = {name: [] for name in CASES}
    for _ in range(a.runs):  # interleaved, so a burst of load elsewhere hits every case alike
        for name, cmd in CASES.items():
            cache = tempfile.mkdtemp(prefix="bench_cli_help_") if name.endswith("(built)") else kept
            results[name].append(time_once(cmd, dict(env, TRL_COLLM_CACHE=cache)))
    eager = statistics.median(results["import trl_collm + trainers (eager)"])
    print(f"median of {a.runs} runs, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"{'command':40s} {'median s':>9s} {'min s':>7s} {'x eager':>8s}")
    for name, times in results.items():
        med = statistics.median(times)
        print(f"{name:40s} {med:9.3f} {min(times):7.3f} {med / eager:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
