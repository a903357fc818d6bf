"""What a person watching a run sees besides the logged lines: a progress bar over the iterations with its ETA from
the first one, and the periodic samples (`num_sample_generations`), kept in a file rather than on the console; and
what a run sets up before that (`threads_and_quiet`: torch's thread count, DeepSpeed's accelerator line off).

`ProgressConsole` is `console.ConsoleCallback` with a bar: on a terminal (or in a notebook) a tqdm bar over the
iterations, opened at the first iteration (a resumed run starts at its step; the time spent before it does not
count towards the ETA), each log line written above it; elsewhere (a log file, CI) the logged lines as before, plus
one progress line after the first iteration when that iteration is not logged, so an ETA is there from the start.
`disable_tqdm=True` turns both off (the log lines stay)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import torch
from transformers import PrinterCallback, ProgressCallback

from ..hardware import pick_cpu_threads
from ..quiet import quiet_deepspeed
from .console import ConsoleCallback, console_line

logger = logging.getLogger(__name__)
SAMPLES_FILE = "samples.jsonl"  # in output_dir: the num_sample_generations tables, one JSON line per entry


def _interactive() -> bool:
    return "ipykernel" in sys.modules or bool(getattr(sys.stderr, "isatty", lambda: False)())


class ProgressConsole(ConsoleCallback):
    """The console line per log, and progress between logs (see the module docstring)."""

    def __init__(self):
        self.bar = None

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        self._at_first_step = True

    def on_step_begin(self, args, state, control, **kwargs):
        if not getattr(self, "_at_first_step", False):
            return
        self._at_first_step = False  # the pace counts from here: not the evaluation on start, nor a resume's loading
        self._begin, self._first_step = time.perf_counter(), state.global_step
        if not args.disable_tqdm and state.is_world_process_zero and _interactive():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc="training", unit="it")

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)
        elif (
            state.global_step == self._first_step + 1
            and not control.should_log
            and not args.disable_tqdm
            and state.is_world_process_zero
        ):
            elapsed = time.perf_counter() - self._begin
            print(console_line({}, state.global_step, state.max_steps, elapsed, self._first_step), flush=True)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is None:
            return super().on_log(args, state, control, logs=logs, **kwargs)
        if state.is_world_process_zero and logs:
            elapsed = time.perf_counter() - self._begin
            self.bar.write(console_line(logs, state.global_step, state.max_steps, elapsed, self._first_step, False))

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def threads_and_quiet(args) -> None:
    """Before a trainer loads anything: torch's threads as the CLI picks them (one on CPU unless TRL_COLLM_THREADS,
    OMP_NUM_THREADS or the user's own torch.set_num_threads says otherwise: `hardware.pick_cpu_threads`; torch's
    default made a Python run 4x costlier in CPU time on a shared 2-core machine), and on CPU no DeepSpeed
    accelerator line (trl_collm/quiet.py)."""
    on_cpu = args.use_cpu or not torch.cuda.is_available()
    pick_cpu_threads(None, on_cpu=on_cpu, keep_user_count=True)
    if on_cpu:
        quiet_deepspeed()


def install_console(trainer) -> None:
    """transformers' printers show every key as a string; ours one line of a few numbers, with a progress bar."""
    for printer in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(printer)
    trainer.add_callback(ProgressConsole)


def sample_due(trainer) -> bool:
    """num_sample_generations tables (on the eval set) spread evenly over the run."""
    samples = trainer.args.num_sample_generations
    if samples <= 0 or trainer.eval_dataset is None:
        return False
    return trainer.state.global_step % max(1, trainer.args.num_total_batches // samples) == 0


def keep_samples(trainer, table: list[dict]) -> str | None:
    """A sampled table of completions during training: appended to output_dir/samples.jsonl (with the iteration)
    and logged at INFO level, not printed (sampled text of a model in training is mostly noise on a console).
    Returns the file written, or None where nothing is saved."""
    if not trainer.is_world_process_zero():
        return None
    logger.info("samples at iteration %d: %s", trainer.state.global_step, table)
    if not trainer.args.should_save:
        return None
    path = os.path.join(trainer.args.output_dir, SAMPLES_FILE)
    os.makedirs(trainer.args.output_dir, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for entry in table:
            f.write(json.dumps({"iteration": trainer.state.global_step, **entry}) + "\n")
    return path
