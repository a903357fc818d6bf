"""Two accelerate machines x 1 process on 127.0.0.1: what a multi-node launch changes, on CPU.

`examples/ds_train.py` is started twice, as machine 0 and machine 1 of one run (`--num_machines 2 --machine_rank
0/1 --main_process_ip 127.0.0.1`, DeepSpeed's standard multi-node launcher: each node runs its own torchrun agent).
Both machines share one output_dir here, as nodes on a shared filesystem do. The run must end with the weights of
the same run on 2 processes of one machine (the same ranks, the same partitions: equal to 1e-9), save a team that
`load_team` loads, and show the roles: each node has its own main process (local rank 0), one of them is the
global main; checkpoints, the team and Hub pushes are the global main's (`should_save`), and so is the console line
of each iteration; `should_log` (transformers' `log_on_each_node`) is true on each node's main. A per-node
output_dir is refused before training, and a machine whose partner never comes fails at the rendezvous within the
timeout it was given, in one line (`python -m trl_collm.cli.launch`, accelerate launch with that one line).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install 'trl-collm[deepspeed]')")

from test_deepspeed import CONFIGS, ROOT, SCRIPT, _close, _env, _launch  # noqa: E402

pytestmark = pytest.mark.deepspeed

HANG_GUARD = 1800  # a launch that never ends, not a speed limit (see test_deepspeed.TIMEOUT)
RENDEZVOUS_TIMEOUT = 10  # seconds machine 0 waits for machine 1 (--rdzv_conf timeout=...)


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def _machine(rank: int, port: str, stage: int, out: Path, extra=(), module="accelerate.commands.launch") -> list[str]:
    launcher = [module, "--num_machines", "2", "--machine_rank", str(rank), "--num_processes"]
    launcher += ["2", "--main_process_ip", "127.0.0.1", "--main_process_port", port, "--mixed_precision", "no"]
    launcher += ["--rdzv_conf", f"timeout={RENDEZVOUS_TIMEOUT}", "--config_file", str(CONFIGS / f"zero{stage}.yaml")]
    return [sys.executable, "-m", *launcher, str(SCRIPT), "--out", str(out), *extra]


def _two_machines(stage: int, outs: tuple[Path, Path], cache: Path, extra=()) -> list[subprocess.CompletedProcess]:
    """Start machine 0 and machine 1 together; wait for both."""
    port = _free_port()
    procs = [
        subprocess.Popen(
            _machine(rank, port, stage, out, extra),
            cwd=ROOT,
            env=_env(cache),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, out in enumerate(outs)
    ]
    done = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=HANG_GUARD)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return done


@pytest.mark.timeout(3 * HANG_GUARD)
@pytest.mark.parametrize(
    "stage,layout,critic",
    [(2, "separate", "centralized"), (3, "shared_base", "decentralized")],
    ids=["zero2-cc-separate", "zero3-dc-lora"],
)
def test_two_machines_on_loopback_train_as_two_processes_of_one_machine(stage, layout, critic, tmp_path, model_cache):
    from trl_collm.team.saved import load_team
    from trl_collm.testing import tiny_model_dir

    tiny_model_dir("tiny-qwen2")
    args = ["--layout", layout, "--critic", critic, "--save-steps", "1", "--record-roles"]
    out = tmp_path / "shared"
    runs = _two_machines(stage, (out, out), model_cache, args)
    for rank, run in enumerate(runs):
        assert run.returncode == 0, f"machine {rank}:\n{run.stdout[-2000:]}\n{run.stderr[-5000:]}"
    nodes = json.loads((out / "metrics.json").read_text())
    one_machine = _launch(stage, layout, critic, tmp_path / "one-machine", model_cache, args)
    assert nodes["world_size"] == 2 and nodes["zero_stage"] == stage
    for a, (s, abs_s) in one_machine["fingerprints"].items():
        got = nodes["fingerprints"][a]
        assert _close(got[0], s, 1e-9, 1e-9) and _close(got[1], abs_s, 1e-9), (a, got, (s, abs_s))
    assert nodes["history"][-1]["loss/policy_avg"] != 0

    roles = {r["rank"]: r for r in (json.loads((out / f"roles-{k}.json").read_text()) for k in (0, 1))}
    assert [roles[k]["node"] for k in (0, 1)] == [0, 1] and [roles[k]["local_rank"] for k in (0, 1)] == [0, 0]
    assert roles[0]["is_local_main"] and roles[1]["is_local_main"]  # a main process on each node
    assert roles[0]["is_world_main"] and not roles[1]["is_world_main"]  # one global main
    assert roles[0]["should_save"] and not roles[1]["should_save"]  # checkpoints, team, pushes: the global main's
    assert roles[0]["should_log"] and roles[1]["should_log"]  # log_on_each_node: each node's main has its log level
    # the console line of each iteration is the global main's alone (trainers/console.py), on node 0's stdout
    printed = [[ln for ln in run.stdout.splitlines() if "objective/scores" in ln and "episode" in ln] for run in runs]
    assert [len(p) for p in printed] == [3, 0], [run.stdout[-2000:] for run in runs]

    # the checkpoints hold both ranks' shards and the global main's files, once
    checkpoint = out / "checkpoint-3"
    assert (checkpoint / "CHECKPOINT_COMPLETE").is_file() and (checkpoint / "optimizer.pt").is_file()
    assert (checkpoint / "rng_state_0.pth").is_file() and (checkpoint / "rng_state_1.pth").is_file()
    assert len(list((checkpoint / "deepspeed").rglob("*optim_states.pt"))) == 2
    team = load_team(nodes["team_dir"])
    assert list(team.names) == ["agent_0", "agent_1"]


@pytest.mark.timeout(2 * HANG_GUARD)
def test_a_per_node_output_dir_is_refused_before_training(tmp_path, model_cache):
    """Each machine with its own output_dir (a node's local disk): checkpoints could never be complete anywhere.
    Every process refuses at the start of train(), in one line."""
    from trl_collm.testing import tiny_model_dir

    tiny_model_dir("tiny-qwen2")
    outs = (tmp_path / "node0", tmp_path / "node1")
    runs = _two_machines(2, outs, model_cache, ["--save-steps", "1"])
    for run in runs:
        assert run.returncode != 0
        lines = [line for line in run.stderr.splitlines() if "is not one folder for every process" in line]
        assert lines and "shared filesystem" in lines[0] and "save_strategy='no'" in lines[0], run.stderr[-3000:]
    assert not list(outs[0].glob("checkpoint-*")) and not list(outs[1].glob("checkpoint-*"))


@pytest.mark.timeout(HANG_GUARD)
@pytest.mark.parametrize(
    "rank,cause",
    [(0, "1/2 clients joined"), (1, "timed out after 10000ms while trying to connect")],
    ids=["machine0-alone", "machine1-alone"],
)
def test_rendezvous_fails_in_one_line_within_its_timeout_when_the_other_machine_never_comes(
    rank, cause, tmp_path, model_cache
):
    """One machine alone, launched through `trl_collm.cli.launch` (accelerate launch's arguments): its launcher
    gives up after --rdzv_conf timeout=10 (torch's default is 600 s) and says so in one line, no traceback; nothing
    is trained. Machine 0 waits for the others to join its store; machine 1 cannot reach node 0's. (The wall clock
    is not judged: the hang guard only catches a launcher that waits forever.)"""
    out = tmp_path / "alone"
    cmd = _machine(rank, _free_port(), 2, out, module="trl_collm.cli.launch")
    run = subprocess.run(cmd, cwd=ROOT, env=_env(model_cache), capture_output=True, text=True, timeout=HANG_GUARD)
    assert run.returncode == 1, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    ours = [line for line in run.stderr.splitlines() if line.startswith("rendezvous failed")]
    assert len(ours) == 1 and ours[0] == run.stderr.strip().splitlines()[-1], run.stderr[-3000:]
    assert f"on machine {rank} of 2 (127.0.0.1:" in ours[0] and cause in ours[0], ours[0]
    assert "--rdzv_conf timeout=<seconds>" in ours[0]
    assert not out.exists() or not os.listdir(out)
