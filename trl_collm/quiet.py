"""Library output a user of the team trainers cannot act on, kept off the console; nothing of what a run does.

- DeepSpeed's "Setting accelerator to CPU. If you have GPU ..." line, printed on every CPU run once deepspeed is
  installed (accelerate and transformers ask it for its accelerator): dropped on CPU runs only (`quiet_deepspeed`).
- transformers' "Loading weights" / "Writing model shards" progress bars (a few milliseconds each for the tiny
  models, several per team), and the FutureWarnings raised inside transformers / PEFT by code that is not ours
  (`KNOWN_WARNINGS`): off inside `library_quiet()` only, the state the user had restored on leaving.

Set TRL_COLLM_VERBOSE=1 to see all of it. Imports nothing of ours (floor 0 of docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings

VERBOSE_ENV = "TRL_COLLM_VERBOSE"
DEEPSPEED_CPU_LINE = "Setting accelerator to CPU"
# (category, message regex): warnings raised by libraries' own code on calls we make as documented
KNOWN_WARNINGS = (
    # PEFT reads `model.is_gradient_checkpointing` when it wraps a model; transformers 5 deprecated the name
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated"),
)


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "").lower() in ("1", "true", "yes")


class _DropDeepSpeedCpuLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return DEEPSPEED_CPU_LINE not in record.getMessage()


def quiet_deepspeed() -> None:
    """Drop DeepSpeed's accelerator line (a CPU run: there is no GPU to find). A filter on DeepSpeed's own logger,
    added once; its other messages are untouched."""
    if verbose():
        return
    ds_logger = logging.getLogger("DeepSpeed")
    if not any(isinstance(f, _DropDeepSpeedCpuLine) for f in ds_logger.filters):
        ds_logger.addFilter(_DropDeepSpeedCpuLine())


@contextlib.contextmanager
def library_quiet():
    """Inside: transformers' progress bars off and `KNOWN_WARNINGS` ignored; both as they were afterwards."""
    if verbose():
        yield
        return
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            for category, message in KNOWN_WARNINGS:
                warnings.filterwarnings("ignore", message=message, category=category)
            yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()
