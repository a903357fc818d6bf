"""A DeepSpeed run SIGKILLed inside a checkpoint save resumes from the checkpoint before it (issue 29, part 5).

`examples/ds_train.py --kill-in-save 2` kills rank 0 inside DeepSpeed's own save of checkpoint-2, right after the
engine wrote its first file (preemption, the OOM killer). What must hold, judged by what is on disk and by weights:
the half-written folder is never taken for a checkpoint (no completion marker), checkpoint-1 stays complete, and the
resumed run ends with the weights of a run that was never stopped (the same tolerance as a clean stop and resume in
tests/test_deepspeed.py: 1e-9 relative, the same partitions).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install 'trl-collm[deepspeed]')")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_deepspeed import CONFIGS, ROOT, SCRIPT, TIMEOUT, _env, _launch  # noqa: E402

from trl_collm.testing import local_launch_command  # noqa: E402
from trl_collm.trainers import checkpoints  # noqa: E402

pytestmark = pytest.mark.deepspeed


@pytest.mark.timeout(4 * TIMEOUT)
@pytest.mark.parametrize("stage,layout", [(2, "separate"), (3, "shared_base")], ids=["zero2", "zero3-lora"])
def test_a_run_killed_inside_a_deepspeed_save_resumes_from_the_checkpoint_before(stage, layout, tmp_path, model_cache):
    from trl_collm.testing import tiny_model_dir

    tiny_model_dir("tiny-qwen2")
    common = ["--iterations", "3", "--save-steps", "1"]
    straight = _launch(stage, layout, "centralized", tmp_path / "straight", model_cache, common)

    killed = tmp_path / "killed"
    out = killed / f"zero{stage}"
    cmd = local_launch_command(SCRIPT, CONFIGS / f"zero{stage}.yaml", num_processes=2)
    cmd += ["--out", str(out), "--layout", layout, "--critic", "centralized", *common, "--kill-in-save", "2"]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(model_cache), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode != 0, "the run was to be killed inside its save of checkpoint-2"
    half = out / "checkpoint-2.tmp"
    assert (half / "deepspeed").is_dir() and not (half / checkpoints.MARKER).exists()  # killed mid-save
    assert checkpoints.complete_checkpoints(str(out)) == [str(out / "checkpoint-1")]
    assert not (out / "checkpoint-2").exists()

    resumed = _launch(stage, layout, "centralized", killed, model_cache, [*common, "--resume"])
    assert len(resumed["history"]) == 3
    assert checkpoints.complete_checkpoints(str(out))[-1] == str(out / "checkpoint-3")
    assert not half.exists()  # the half-written folder was replaced when checkpoint-2 was written again
    for a, (s, abs_s) in straight["fingerprints"].items():
        got = resumed["fingerprints"][a]
        assert math.isclose(got[0], s, rel_tol=1e-9, abs_tol=1e-9) and math.isclose(got[1], abs_s, rel_tol=1e-9), (
            a,
            got,
            (s, abs_s),
        )
