"""`trl-collm` command line: train (ppo / mc), score (eval) and run (play) teams; this face re-exports what other code
imports from `trl_collm.cli` (the entry point `main`, `UsageError`, ...). The code is in the modules beside it:
`commands.py` (`main`, the dispatch, `trl-collm tasks`), `training.py` (`trl-collm ppo` / `mc`), `options.py` (the
training parser and its kept / shipped `--help` texts), `evaluate.py` (eval / play), `common.py` (what the commands
share), `precheck.py` (the checks before the parser is built). See docs/cli.md.
"""

from __future__ import annotations

from .commands import list_tasks_text, main
from .common import TaskArguments, UsageError, _resolve_model, set_cpu_threads
from .options import (
    SHIPPED_HELP_DIR,
    _config_cls,
    _help_file,
    _help_key,
    _keep_both,
    _keep_parser,
    _print_help,
    _train_parser,
    field_choices,
)
from .training import _disk_errors, _push, task_record, train, write_curve

__all__ = [
    "main",
    "list_tasks_text",
    "train",
    "task_record",
    "write_curve",
    "TaskArguments",
    "UsageError",
    "set_cpu_threads",
    "field_choices",
    "SHIPPED_HELP_DIR",
    # private names the tests and tools/ship_help_texts.py reach (kept at this path)
    "_resolve_model",
    "_config_cls",
    "_help_file",
    "_help_key",
    "_keep_both",
    "_keep_parser",
    "_print_help",
    "_train_parser",
    "_disk_errors",
    "_push",
]
