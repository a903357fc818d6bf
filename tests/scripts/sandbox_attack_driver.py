"""Host side of the sandbox attack suite: plays the trainer, runs attack samples through the sandbox, and records
what the HOST saw. Started by tests/test_sandbox_attacks.py as root or (dropped with setpriv) as user nobody.

    python sandbox_attack_driver.py PACKAGE_PARENT SAMPLES_JSON RESULTS_JSON

PACKAGE_PARENT holds a copy of the ``sandbox`` package (imported as the top-level package ``sandbox``, so that an
unprivileged user needs to read nothing of the project). Every sample's sandboxes, and anything they might start,
are watched by a thread that walks /proc every few milliseconds: it records every process below this one and the
summed resident memory of each sample's processes. Samples run 2 at a time ("phase" 0), then one by one in order
("phase" 1: persistence and memory measurements), then in the pairs of "phase" 2 (neighbours run concurrently).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def proc_table() -> dict[int, tuple[int, int, int, int]]:
    """pid -> (ppid, start time, rss pages, threads) of every process now (ignores the ones that vanish
    meanwhile)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), int(fields[19]), int(fields[21]), int(fields[17]))
    return table


def descendants(table, root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = set(), [root]
    while stack:
        for c in children.get(stack.pop(), []):
            if c not in out:
                out.add(c)
                stack.append(c)
    return out


class Watcher(threading.Thread):
    """Records every (pid, start time) below this process, and while ``measuring`` the peak summed RSS and the
    peak number of tasks (each thread is a task, and takes a host PID)."""

    def __init__(self, exclude: set[int]):
        super().__init__(daemon=True)
        self.seen: set[tuple[int, int]] = set()
        self.exclude = exclude
        self.peak_kib = 0
        self.peak_tasks = 0
        self.measuring = False
        self.stop = False
        self.page_kib = os.sysconf("SC_PAGE_SIZE") // 1024

    def run(self):
        me = os.getpid()
        while not self.stop:
            table = proc_table()
            below = descendants(table, me) - self.exclude
            for pid in below:
                self.seen.add((pid, table[pid][1]))
            if self.measuring:
                total = sum(table[p][2] for p in below if p in table) * self.page_kib
                self.peak_kib = max(self.peak_kib, total)
                self.peak_tasks = max(self.peak_tasks, sum(table[p][3] for p in below if p in table))
            time.sleep(0.005)


def run_sample(sandbox, s: dict) -> dict:
    begin = time.monotonic()
    if s["mode"] == "tests":
        rep = sandbox.run_tests(
            s["code"],
            s["tests"],
            entry_point=s["entry_point"],
            trusted_setup=s.get("trusted_setup", ""),
            **s.get("kwargs", {}),
        )
        out = {
            "passed": rep.passed,
            "total": rep.total,
            "statuses": [o.status for o in rep.outcomes],
            "messages": [o.message for o in rep.outcomes],
            "load_error": rep.load_error,
            "judge_error": rep.judge_error,
            "sandbox_pids": rep.sandbox_pids,
            "timed_out": rep.timed_out,
            "text": json.dumps([o.message for o in rep.outcomes]) + str(rep.load_error),
        }
    else:
        r = sandbox.run_python(s["code"], **s.get("kwargs", {}))
        out = {
            "returncode": r.returncode,
            "stdout": r.stdout,
            "stderr": r.stderr,
            "timed_out": r.timed_out,
            "killed_reason": r.killed_reason,
            "memory_error": r.memory_error,
            "sandbox_pids": [r.pid],
            "text": r.stdout + r.stderr,
        }
    out["duration"] = time.monotonic() - begin
    out["driver_alive"] = True  # we got here: the trainer survived the sample
    return out


def main() -> None:
    package_parent, samples_path, results_path = sys.argv[1:4]
    sys.path.insert(0, package_parent)
    import sandbox  # the copied package

    with open(samples_path) as f:
        samples = json.load(f)
    # A bystander process of the same user as the trainer (a second trainer, the user's shell): samples try to
    # kill or trace it; it must be alive and not stopped at the end.
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    watcher = Watcher(exclude={victim.pid})
    watcher.start()
    results = {"driver_pid": os.getpid(), "victim_pid": victim.pid, "uid": os.getuid(), "samples": {}}
    for s in samples:  # the pids the attacks aim at exist only now
        s["code"] = s["code"].replace("__DRIVER_PID__", str(os.getpid())).replace("__VICTIM_PID__", str(victim.pid))
    sandbox.require_sandbox()
    phases = {p: [s for s in samples if s.get("phase", 0) == p] for p in (0, 1, 2)}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for s, out in zip(phases[0], pool.map(lambda s: run_sample(sandbox, s), phases[0])):
            results["samples"][s["id"]] = out
    for s in phases[1]:
        watcher.peak_kib, watcher.peak_tasks = 0, 0
        watcher.measuring = bool(s.get("measure_memory") or s.get("measure_tasks"))
        time.sleep(0.02)
        out = run_sample(sandbox, s)
        watcher.measuring = False
        out["peak_rss_mb"] = watcher.peak_kib / 1024
        out["peak_tasks"] = watcher.peak_tasks
        results["samples"][s["id"]] = out
    pairs: dict[str, list[dict]] = {}
    for s in phases[2]:
        pairs.setdefault(s["pair"], []).append(s)
    for group in pairs.values():
        with ThreadPoolExecutor(max_workers=len(group)) as pool:
            for s, out in zip(group, pool.map(lambda s: run_sample(sandbox, s), group)):
                results["samples"][s["id"]] = out
    sandbox.shutdown()  # the warm sandboxes and judges kept for later calls (they never received a sample)
    time.sleep(0.1)
    watcher.stop = True
    watcher.join()
    table = proc_table()
    results["survivors"] = sorted(pid for pid, start in watcher.seen if pid in table and table[pid][1] == start)
    results["watched_processes"] = len(watcher.seen)
    info = []
    for pid in results["survivors"]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")[:200].decode("utf-8", "replace")
            info.append(f"{pid} ppid={table[pid][0]}: {cmd}")
        except OSError:
            info.append(f"{pid}: gone")
    results["survivor_info"] = info
    try:
        with open(f"/proc/{victim.pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0].decode()
    except OSError:
        state = "gone"
    results["victim_state"] = state
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    with open(results_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
