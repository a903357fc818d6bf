"""`trl-collm` command line: train (ppo / mc), score (eval) and run (play) teams on the built-in tasks or your own.

    trl-collm ppo  --config examples/configs/coord-penalty/cc-cpu.yaml [--learning_rate 1e-2 ...]
    trl-collm mc   --config examples/configs/coord-penalty/mc-cpu.yaml
    trl-collm eval --team_dir outputs/coord-penalty-cc --task coord-penalty [--limit 32]
    trl-collm play --team_dir outputs/coord-penalty-cc --task coord-penalty [--limit 3] [--render DIR]
    trl-collm tasks

Training configs follow TRL's convention (TrlParser): a YAML file whose keys are the fields of `TaskArguments`,
the trainer config and TRL's `ModelConfig`; command-line flags override the file. `model_name_or_path: tiny` uses
the offline tiny-model factory (no download). `--task` takes a built-in name or your own task as MODULE:NAME /
path/to/file.py:NAME (`trl-collm tasks` says what NAME must be); `--agent_models A B` gives each agent its own model.

A mistake in the arguments prints one line `trl-collm: error: ...` and exits with status 2; `--debug` (or the
environment variable TRL_COLLM_DEBUG=1) shows the full traceback instead. See docs/cli.md.
"""

from __future__ import annotations

import os
import sys

from .common import DEBUG_ENV, USAGE, UsageError
from .evaluate import evaluate_team
from .training import train


def list_tasks_text() -> str:
    """The `trl-collm tasks` listing: the built-ins from the catalogue (no task module is imported), then how to
    use your own."""
    from ..tasks import BUILTIN_TASKS, IMPORT_PATH_HELP

    lines = [
        f"{name:18s} {agents} agents, {turns} turn(s)  {desc}"
        for name, (_, agents, turns, desc) in sorted(BUILTIN_TASKS.items())
    ]
    lines += [
        "",
        f"Or {IMPORT_PATH_HELP}; e.g. trl-collm ppo --task my_tasks.py:TASK --model_name_or_path tiny --use_cpu true.",
        "Mixed team: --agent_models MODEL_1 MODEL_2 (one model per agent, in agent order). See docs/cli.md.",
    ]
    return "\n".join(lines)


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\n" + USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command in ("ppo", "mc"):
        train(command, rest)
    elif command == "eval":
        evaluate_team(rest)
    elif command == "play":
        evaluate_team(rest, play_mode=True)
    elif command == "tasks":
        print(list_tasks_text())
    else:
        raise UsageError(f"unknown command {command!r}; {USAGE.removeprefix('usage: ')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get(DEBUG_ENV, "").lower() in ("1", "true", "yes")
    argv = [a for a in argv if a != "--debug"]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return _dispatch(argv)
    except UsageError as e:
        if debug:
            raise
        message = " ".join(str(e).split())  # one line, whatever the message held
        print(f"trl-collm: error: {message}", file=sys.stderr)
        return 2
