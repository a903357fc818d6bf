"""torch's thread count on CPU (cli/common.py): CPU runs choose theirs, the command line sets one thread before
loading models, warm starts take a thread count."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_cli_usability import _one_line_error

from trl_collm.cli import UsageError

ROOT = Path(__file__).resolve().parents[1]
CC_CPU = str(ROOT / "examples" / "configs" / "coord-penalty" / "cc-cpu.yaml")


# ---------------------------------------------------------------------------------------------------------------
# 2. threads
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_cpu_runs_choose_their_thread_count(monkeypatch, restore_threads):
    from trl_collm.cli import set_cpu_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    assert set_cpu_threads(None, on_cpu=True) == 1 and torch.get_num_threads() == 1  # the CPU default
    torch.set_num_threads(2)
    assert set_cpu_threads(None, on_cpu=False) is None and torch.get_num_threads() == 2  # GPU: torch's choice
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert set_cpu_threads(None, on_cpu=True) is None and torch.get_num_threads() == 2  # the user's OMP_NUM_THREADS
    assert set_cpu_threads(3, on_cpu=True) == 3 and torch.get_num_threads() == 3  # the flag wins
    with pytest.raises(UsageError, match="--threads 0"):
        set_cpu_threads(0, on_cpu=True)


def test_the_cli_sets_one_thread_on_cpu_before_loading_models(tmp_path, capsys, monkeypatch, restore_threads):
    """`trl-collm ppo` on CPU runs with one thread unless told otherwise; `--threads` is the flag."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    # stop right after the thread choice: an invalid limit is reported just after it
    _one_line_error(capsys, ["ppo", "--config", CC_CPU, "--output_dir", str(tmp_path), "--eval_limit", "0"])
    assert torch.get_num_threads() == 1
    _one_line_error(
        capsys, ["ppo", "--config", CC_CPU, "--output_dir", str(tmp_path), "--eval_limit", "0", "--threads", "2"]
    )
    assert torch.get_num_threads() == 2


def test_warmstart_takes_threads(capsys):
    from trl_collm.warmstart import main as warm_main

    with pytest.raises(SystemExit) as info:
        warm_main(["--out", "unused", "--threads", "0"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--threads 0: give a thread count >= 1" in err, err


def test_auto_takes_the_idle_physical_cores(monkeypatch, restore_threads):
    """`idle_cpu_cores`: physical cores (hyperthread siblings count once) within the affinity, minus the last
    minute's load, at least 1; "auto" as a thread count or in TRL_COLLM_THREADS sets that."""
    from trl_collm import hardware

    four_cores_eight_threads = []
    for cpu in range(8):
        four_cores_eight_threads += [f"processor\t: {cpu}", "physical id\t: 0", f"core id\t\t: {cpu % 4}", ""]
    monkeypatch.setattr(hardware, "_cpuinfo_lines", lambda: four_cores_eight_threads)
    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda pid: set(range(8)))
    for load, idle in [(0.0, 4), (0.4, 4), (1.6, 2), (3.7, 1), (9.0, 1)]:
        monkeypatch.setattr(hardware.os, "getloadavg", lambda load=load: (load, 0.0, 0.0))
        assert hardware.idle_cpu_cores() == idle, load
    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda pid: {0, 1})  # taskset to two CPUs
    monkeypatch.setattr(hardware.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert hardware.idle_cpu_cores() == 2
    monkeypatch.setattr(hardware.os, "getloadavg", lambda: (1.2, 0.0, 0.0))
    assert hardware.pick_cpu_threads("auto", on_cpu=True) == 1 and torch.get_num_threads() == 1
    monkeypatch.setattr(hardware.os, "getloadavg", lambda: (0.1, 0.0, 0.0))
    monkeypatch.setenv(hardware.THREADS_ENV, "auto")
    assert hardware.pick_cpu_threads(None, on_cpu=True) == 2 and torch.get_num_threads() == 2
    monkeypatch.setenv(hardware.THREADS_ENV, "most")
    with pytest.raises(ValueError, match="'auto' for the idle cores"):
        hardware.pick_cpu_threads(None, on_cpu=True)
