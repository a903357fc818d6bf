"""`python -m trl_collm.cli.launch <accelerate launch arguments>`: accelerate launch, with a failed rendezvous said in
one line.

It takes `accelerate launch`'s arguments unchanged and runs it. When the machines of a multi-node run do not all reach
node 0 within the rendezvous timeout (`--rdzv_conf timeout=<s>`; torch's default is 600 s), accelerate's launcher
raises from inside torch's elastic agent, before any training process starts, and Python prints a 40-line traceback
whose last line is the message. This prints that message as one line, with what to check, and exits with status 1.
Everything else (the training processes' own errors included: they fail in the children) is accelerate's, unchanged.
"""

from __future__ import annotations

import sys


def rendezvous_failure(error: BaseException, args) -> str:
    """The one line for a launcher whose rendezvous failed (`args`: accelerate launch's parsed arguments)."""
    message = (str(error).strip().splitlines() or [type(error).__name__])[0]
    where = f"{args.main_process_ip or '127.0.0.1'}:{args.main_process_port or 29500}"
    return (
        f"rendezvous failed on machine {args.machine_rank} of {args.num_machines} ({where}): {message} Start the same "
        "command on every node with its own --machine_rank, check that node 0's address and port are reachable from "
        "each node, or wait longer with --rdzv_conf timeout=<seconds>."
    )


def main(argv: list[str] | None = None) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed import DistError
    from torch.distributed.elastic.rendezvous import RendezvousError

    args = launch_command_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        launch_command(args)
    except (DistError, RendezvousError) as e:  # raised by the launcher itself: only its rendezvous talks to others
        print(rendezvous_failure(e, args), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
