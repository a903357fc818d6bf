"""`trl-collm eval` and `trl-collm play`: load a saved team, check it fits the task, play the task's rows with the
generation settings it was trained with, and report (or print, or draw) the episodes."""

from __future__ import annotations

import json
import os

from ..tasks import call_with_supported
from .common import (
    UsageError,
    _check_dataset_args,
    _check_options,
    _count_agents,
    _get_task,
    _options,
    _parser_error,
    _task_turns,
    user_errors,
)


def _eval_parser(prog: str, play: bool):
    import argparse

    p = argparse.ArgumentParser(
        prog=prog,
        description="Generation settings default to those the team was trained "
        "with (team.json); the flags override them.",
    )
    p.add_argument("--team_dir", required=True, help="output_dir of a saved team (a local folder)")
    p.add_argument(
        "--task",
        default=None,
        help="built-in task name, or your own as MODULE:NAME / FILE.py:NAME; default: the task the team was trained "
        "on (team.json), and another one is refused",
    )
    p.add_argument(
        "--task_options", default=None, help="JSON dict of task options; default: the training's (team.json)"
    )
    p.add_argument("--split", default="eval", choices=("train", "eval"))
    p.add_argument(
        "--dataset_source",
        default=None,
        help="the task's dataset source (e.g. building targets 'I,L'); default: the training's (team.json)",
    )
    p.add_argument("--limit", type=int, default=None if not play else 3, help="rows to use")
    p.add_argument("--max_new_tokens", type=int, default=None, help="default: the team's response_length, else 64")
    p.add_argument("--temperature", type=float, default=None, help="with --sample; default: the team's, else 1.0")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument(
        "--batch_size", type=int, default=8, help="rows played together (the progress moves after each batch)"
    )
    p.add_argument(
        "--progress_every",
        type=int,
        default=16,
        help="without a terminal: a progress line every N plays (on a terminal: a bar)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    p.add_argument("--base_model", default=None, help="base model of a LoRA team (overrides team.json)")
    p.add_argument("--device", default=None)
    p.add_argument(
        "--use_transformers_continuous_batching",
        action="store_true",
        help="generate with transformers' continuous batching (generate_batch) instead of generate()",
    )
    p.add_argument(
        "--transformers_continuous_batching_config",
        default=None,
        help="JSON dict for transformers' ContinuousBatchingConfig",
    )
    p.add_argument(
        "--use_vllm",
        action="store_true",
        help="generate with vLLM (docs/generation.md; one engine per agent model, LoRA adapters as vLLM LoRA)",
    )
    p.add_argument("--vllm_max_model_length", type=int, default=None, help="vLLM context window (default: model's)")
    p.add_argument("--vllm_gpu_memory_utilization", type=float, default=0.3, help="GPU memory share of the engine")
    p.add_argument("--vllm_model_impl", default="vllm", choices=["vllm", "transformers"])
    if play:
        p.add_argument(
            "--render",
            default=None,
            metavar="DIR",
            help="building game: write a PNG of the world after every turn into DIR",
        )
    p.error = _parser_error(prog)
    return p


def _check_team_folder(team_dir: str, desc: dict) -> None:
    """Every agent folder team.json names exists and holds a model or an adapter."""
    for a in desc.get("agents", []):
        rel = desc.get("agent_folders", {}).get(a)
        folder = os.path.normpath(os.path.join(team_dir, rel)) if rel is not None else None
        if folder is None or not os.path.isdir(folder):
            raise UsageError(
                f"--team_dir {team_dir}: team.json names agent {a!r} in folder {rel!r}, which is missing; "
                "pass the complete output_dir of a save_model() / training run"
            )
        if not any(os.path.isfile(os.path.join(folder, f)) for f in ("config.json", "adapter_config.json")):
            raise UsageError(
                f"--team_dir {team_dir}: agent {a!r}'s folder {folder} has no config.json or "
                "adapter_config.json; pass the complete output_dir of a save_model() / training run"
            )
        _check_weights(team_dir, folder)


def _check_weights(team_dir: str, folder: str) -> None:
    """A truncated or corrupt weights file (an interrupted copy), named in one line before any model loads."""
    from ..team.weights_files import unreadable_weights

    bad = unreadable_weights(folder)
    if bad is not None:
        raise UsageError(
            f"--team_dir {team_dir}: {bad[0]} cannot be read ({bad[1]}); it is truncated or corrupt: copy the team "
            "folder again or re-save it"
        )


def check_team_fits_task(task, env, row: dict, desc: dict, team_dir: str, explicit_options: bool) -> None:
    """Refuse to score a team on a task it cannot play: other agent names (when the task fixes them), another
    number of agents, or another episode length than the team was trained for (unless the options say so)."""
    team_agents = list(desc["agents"])
    declared = getattr(env, "agent_names", None)
    if declared is not None and list(declared) != team_agents:
        raise UsageError(
            f"the team in {team_dir} has agents {team_agents} but task {task.name!r} is played by "
            f"{list(declared)}; score a team trained on this task"
        )
    seats = _count_agents(task, env, row, team_agents)
    if seats != len(team_agents):
        raise UsageError(
            f"task {task.name!r} has {seats} agents but the team in {team_dir} has "
            f"{len(team_agents)} ({', '.join(team_agents)}); score a team trained on this task"
        )
    trained_turns = desc.get("num_turns")
    if not explicit_options and trained_turns and trained_turns != task.num_turns:
        length = [k for k in ("num_turns", "turns") if k in (task.options or {})]
        hint = f"pass --task_options '{{\"{length[0]}\": {trained_turns}}}' to play it that long, or " if length else ""
        raise UsageError(
            f"the team in {team_dir} was trained for {trained_turns} turn(s) but task {task.name!r} "
            f"runs {task.num_turns}; {hint}score a team trained on this task"
        )


def _task_for_eval(ns, desc: dict, asked):
    """The task, options and dataset source to score a saved team on: the flags, else what team.json records. A
    team that records its task is refused on another task or other options (another reward)."""
    recorded = desc.get("task") if isinstance(desc.get("task"), dict) else None
    if ns.task is None and recorded is None:
        raise UsageError(
            f"--task: {os.path.join(ns.team_dir, 'team.json')} records no task (saved by an older trl-collm or by "
            "Python code); pass --task with the task the team was trained on"
        )
    task = asked if asked is not None else _get_task(recorded["ref"])
    opts = _options(ns.task_options)
    if recorded is None:
        return task, opts, ns.dataset_source
    if task.name != recorded["name"]:
        raise UsageError(
            f"--task {ns.task}: the team in {ns.team_dir} was trained on task {recorded['name']!r}; drop --task to "
            "score it on that task"
        )
    trained = recorded.get("options") or {}
    if ns.task_options is not None and opts != trained:
        raise UsageError(
            f"--task_options {json.dumps(opts)}: the team in {ns.team_dir} was trained with {json.dumps(trained)} "
            "(other options change the reward or the game); drop --task_options to use the training's"
        )
    source = ns.dataset_source if ns.dataset_source is not None else recorded.get("dataset_source")
    return task, trained, source


def evaluate_team(argv: list[str], play_mode: bool = False):
    prog = f"trl-collm {'play' if play_mode else 'eval'}"
    opts_ns = _eval_parser(prog, play_mode).parse_args(argv)
    if opts_ns.use_vllm:  # before any team or task is loaded
        with user_errors():
            from ..generation.vllm_backend import check_vllm_fields

            check_vllm_fields(opts_ns)
    asked = _get_task(opts_ns.task) if opts_ns.task is not None else None  # a wrong name is said first
    if not os.path.isfile(os.path.join(opts_ns.team_dir, "team.json")):
        raise UsageError(
            f"--team_dir {opts_ns.team_dir} has no team.json; pass the output_dir of a `trl-collm ppo` / "
            "`mc` run or of save_model()"
        )
    with user_errors():
        from ..inference import read_team_file

        desc = read_team_file(opts_ns.team_dir)
    _check_team_folder(opts_ns.team_dir, desc)
    task, opts, source = _task_for_eval(opts_ns, desc, asked)
    _check_options(task, opts)
    _check_dataset_args(task, source, {"--limit": opts_ns.limit})
    for flag in ("batch_size", "progress_every"):
        if getattr(opts_ns, flag) < 1:
            raise UsageError(f"--{flag} {getattr(opts_ns, flag)}: give a number >= 1")
    if play_mode and opts_ns.render is not None:
        _check_renderable(task, opts)
    num_turns = _task_turns(task, opts) if opts else (desc.get("num_turns") or task.num_turns)
    with user_errors():
        rows_ds = call_with_supported(
            task.load_dataset, split=opts_ns.split, limit=opts_ns.limit, source=source, **opts
        )
        rows = [rows_ds[i] for i in range(len(rows_ds))]
        if not rows:
            raise UsageError(f"task {task.name!r} has no rows in split {opts_ns.split!r}; check --split / --limit")
        env = call_with_supported(task.make_env, **opts)
    check_team_fits_task(task, env, rows[0], desc, opts_ns.team_dir, explicit_options=bool(opts))

    from ..generation.backends import make_backend
    from ..generation.prompts import PromptSettings
    from ..generation.sampler import SamplingSettings
    from ..inference import load_team, play
    from ..quiet import library_quiet, quiet_deepspeed

    gen = desc.get("generation", {})
    quiet_deepspeed()  # its accelerator line, on every CPU run once deepspeed is installed: nothing to act on
    with user_errors(), library_quiet():  # transformers' weight-loading bars and known FutureWarnings off
        # The training's sampling settings (team.json), greedy unless --sample; the flags given replace them.
        settings = SamplingSettings.from_team_json(
            gen, greedy=not opts_ns.sample, max_new_tokens=opts_ns.max_new_tokens, temperature=opts_ns.temperature
        )
        team = load_team(opts_ns.team_dir, base_model=opts_ns.base_model, device=opts_ns.device)
        backend = make_backend(opts_ns)  # generate(), continuous batching or vLLM (trl_collm/generation/backends.py)
        prompts = PromptSettings.from_team_json(desc)  # agent_context, prompt limits, chat templates: the training's
    progress = PlayProgress(len(rows), quiet=opts_ns.quiet, every=opts_ns.progress_every)
    try:
        transcripts = play(
            team, env, rows, num_turns=num_turns, settings=settings, backend=backend, prompts=prompts,
            batch_size=opts_ns.batch_size, progress=progress,
        )  # fmt: skip
    finally:
        progress.close()
    returns = [sum(t["return"]) / len(t["return"]) for t in transcripts]
    mean = sum(returns) / len(returns)
    if play_mode:
        for tr in transcripts:
            print(f"=== episode {tr['episode']}  return per agent {tr['return']}")
            for turn in tr["turns"]:
                for a, io in turn["agents"].items():
                    print(
                        f"--- turn {turn['turn'] + 1} [{a}] prompt:\n{io['prompt']}\n"
                        f"--- [{a}] answer:\n{io['completion']}"
                    )
                print(f"--- turn {turn['turn'] + 1} reward {turn['reward']}")
        if opts_ns.render is not None:
            from .rendering import render_transcripts

            paths = render_transcripts(task, opts, rows, transcripts, team.names, opts_ns.render)
            print(f"rendered {len(paths)} PNG(s) into {opts_ns.render}")
    summary = {"task": task.name, "episodes": len(rows), "mean_return": mean}
    if task.max_reward:
        summary["percent_of_max"] = 100.0 * mean / task.max_reward
    print(json.dumps(summary))
    return summary, transcripts


class PlayProgress:
    """What eval / play show while the episodes run (on stderr, so stdout stays the results): on a terminal a tqdm
    bar with its ETA, elsewhere one line every `every` plays (`played 16/64 (25%) | 0.81 s/play | ETA 39s`), nothing
    with `quiet`. Called with the plays each batch finished."""

    def __init__(self, total: int, quiet: bool = False, every: int = 16, stream=None):
        import sys
        import time

        self.total, self.done, self.every, self.quiet = total, 0, max(1, every), quiet
        self.stream = stream or sys.stderr
        self.start, self._clock, self.bar = time.monotonic(), time.monotonic, None
        if not quiet and getattr(self.stream, "isatty", lambda: False)():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc="playing", unit="play", file=self.stream)

    def __call__(self, n: int) -> None:
        before, self.done = self.done, self.done + n
        if self.bar is not None:
            self.bar.update(n)
        elif not self.quiet and (self.done // self.every > before // self.every or self.done == self.total):
            pace = (self._clock() - self.start) / max(self.done, 1)
            eta = _duration(pace * (self.total - self.done))
            line = f"played {self.done}/{self.total} ({100 * self.done // max(self.total, 1)}%) | {pace:.3g} s/play"
            print(f"{line} | ETA {eta}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    minutes, s = divmod(seconds, 60)
    return f"{s}s" if not minutes else f"{minutes}m{s:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def _check_renderable(task, opts: dict) -> None:
    with user_errors():
        env = call_with_supported(task.make_env, **opts)
    if not callable(getattr(env, "render_png", None)):
        raise UsageError(
            f"--render draws the building game; task {task.name!r} ({type(env).__name__}) has no render_png(path)"
        )
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--render needs matplotlib: pip install 'trl-collm[plot]'")
