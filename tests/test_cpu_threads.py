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
