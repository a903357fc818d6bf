"""What the test-suite's and the tools' training runs share: the CPU run settings (`CPU_RUN_SETTINGS`) and the command
that launches a script in several local processes (`local_launch_command`).
"""

from __future__ import annotations

# Trainer settings every CPU run of the toy and test setups needs, PPO or MC: no bf16, no logging integrations, no
# checkpoints, no sample generations, a log line per iteration (the test-suite and tools/record_runs.py share them).
CPU_RUN_SETTINGS = dict(
    use_cpu=True,
    bf16=False,
    report_to=[],
    save_strategy="no",
    num_sample_generations=0,
    disable_tqdm=True,
    logging_steps=1,
)


def local_launch_command(script: str, config_file: str | None = None, num_processes: int = 2) -> list[str]:
    """The command that runs `script` in `num_processes` local processes, on a fresh rendezvous port (no reuse of an
    earlier run's): `accelerate launch --config_file` with a DeepSpeed config, or `torch.distributed.run` (plain data
    parallel; the caller sets ACCELERATE_USE_CPU=true for accelerate's multi-CPU state) without one. Arguments for
    the script go after it."""
    import socket
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    if config_file is None:
        launcher = ["torch.distributed.run", "--nproc_per_node", str(num_processes), "--master_port", port]
    else:
        launcher = ["accelerate.commands.launch", "--num_processes", str(num_processes), "--num_machines", "1"]
        launcher += ["--mixed_precision", "no", "--main_process_port", port, "--config_file", str(config_file)]
    return [sys.executable, "-m", *launcher, str(script)]
