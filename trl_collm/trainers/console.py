"""Throughput and the console: where an iteration's time goes, and what a person watching the run reads.

`PhaseClock` splits an iteration's wall time into generation (the sampler's calls: the rollout's token sampling),
update (the optimizer steps: forwards, backwards, steps) and scoring (the rest: the env's rewards, the scoring
forwards, advantages), and counts the tokens generated. The trainer adds, per iteration, `time/generation_s`,
`time/scoring_s`, `time/update_s`, `throughput/tokens_per_s` and `throughput/episodes_per_s` to its metrics (all of
them reach the logs and the reporters).

`ConsoleCallback` replaces transformers' PrinterCallback / ProgressCallback for the team trainers: one line per
logged iteration, `iteration 3/10 (30%) | 1.2 s/it | ETA 8s | objective/scores 0.5 | ...`, with a few keys, as
floats; every key stays in `state.log_history`, `metrics_history` and the reporters (TensorBoard, W&B ...)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import defaultdict

from transformers import TrainerCallback

from ..generation.sampler import Sampler

# The console's keys, in this order (eval_ variants too): the ones a TRL PPO user watches, plus throughput
CONSOLE_KEYS = (
    "objective/scores",
    "loss/policy_avg",
    "loss/value_avg",
    "objective/kl",
    "policy/entropy_avg",
    "throughput/tokens_per_s",
    "throughput/episodes_per_s",
    "lr",
    "episode",
)


class PhaseClock:
    """Seconds per phase and tokens generated in the current iteration (`reset` at its start)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.tokens = 0

    @contextlib.contextmanager
    def phase(self, name: str):
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - begin

    def count(self, generations: dict) -> None:
        """The tokens one sampler call produced (up to and including each stop token)."""
        self.tokens += int(sum(int(g.response_mask.sum()) for g in generations.values()))

    def metrics(self, iteration_s: float, episodes: int) -> dict:
        generation, update = self.seconds["generation"], self.seconds["update"]
        per_s = 1.0 / max(iteration_s, 1e-9)
        return {
            "time/generation_s": generation,
            "time/scoring_s": max(0.0, iteration_s - generation - update),
            "time/update_s": update,
            "throughput/tokens_per_s": self.tokens / max(generation, 1e-9) if self.tokens else 0.0,
            "throughput/episodes_per_s": episodes * per_s,
        }


@dataclasses.dataclass
class TimedSampler(Sampler):
    """The trainer's sampler, its calls timed (the "generation" phase) and their tokens counted on `clock`."""

    clock: PhaseClock | None = None

    def __call__(self, observations):
        if self.clock is None:
            return super().__call__(observations)
        with self.clock.phase("generation"):
            out = super().__call__(observations)
        self.clock.count(out)
        return out


def is_wall_clock(key: str) -> bool:
    """A metric that measures time (it differs between two runs of the same seed): what run comparisons skip."""
    return key == "eps" or key.startswith(("time/", "throughput/"))


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, s = divmod(seconds, 60)
    return f"{minutes}m{s:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def _number(value) -> float | int:
    """4 significant digits, still a number (transformers' printers turn floats into strings)."""
    return value if isinstance(value, int) else float(f"{value:.4g}")


def console_line(
    logs: dict, step: int, max_steps: int, elapsed: float, started_at_step: int, progress: bool = True
) -> str:
    """The line printed for one log: progress and ETA (from this run's own pace: a resumed run counts from its
    restart; left out with `progress=False`, i.e. disable_tqdm=True), then the console keys present in `logs`."""
    done = max(step - started_at_step, 0)
    parts = [f"iteration {step}/{max_steps} ({100 * step // max(max_steps, 1)}%)"] if progress else []
    if done and progress:
        pace = elapsed / done
        parts += [f"{pace:.3g} s/it", f"ETA {_duration(pace * max(max_steps - step, 0))}"]
    for key in CONSOLE_KEYS:
        for shown in (key, f"eval_{key}"):
            value = logs.get(shown)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                parts.append(f"{shown} {_number(value)}")
    return " | ".join(parts)


class ConsoleCallback(TrainerCallback):
    """One readable line per log on the main process (see the module docstring)."""

    def on_train_begin(self, args, state, control, **kwargs):
        self._begin, self._first_step = time.perf_counter(), state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or not hasattr(self, "_begin"):
            return
        elapsed, progress = time.perf_counter() - self._begin, not args.disable_tqdm
        line = console_line(logs, state.global_step, state.max_steps, elapsed, self._first_step, progress)
        print(line, flush=True)
