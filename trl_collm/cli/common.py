"""What every `trl-collm` command shares: the one-line `UsageError` and `user_errors`, the task arguments, task
options, model names and torch's thread count. Imports no torch (the `--help` and `tasks` answers stay fast)."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
from dataclasses import dataclass, field

TINY = "tiny"
DEBUG_ENV = "TRL_COLLM_DEBUG"
USAGE = "usage: trl-collm {ppo,mc,eval,play,tasks} ... [--debug] (trl-collm <command> --help for its options)"


class UsageError(Exception):
    """A mistake in what the user asked for. `main` prints it as one line and exits with status 2."""


@contextlib.contextmanager
def user_errors(context: str = ""):
    """Inside this block (argument parsing, config validation, building the trainer: before any training step),
    ValueError / OSError (FileNotFoundError, a model path that does not exist, ...) are the user's to fix and
    become UsageError. Training, evaluation and saving run outside it: an error there is a bug and keeps its
    traceback. A missing optional package (ImportError) is the user's to install."""
    try:
        yield
    except UsageError:
        raise
    except (ValueError, OSError, ImportError) as e:  # ImportError: an optional package is missing (vLLM)
        raise UsageError(f"{context}{e}") from e
    except RuntimeError as e:  # the code sandbox missing on this machine: its message already says the fix
        from ..sandbox.bwrap import SandboxUnavailable

        if isinstance(e, SandboxUnavailable):
            raise UsageError(f"{context}{e}") from e
        raise


@dataclass
class TaskArguments:
    task: str = field(
        default="coord-penalty",
        metadata={
            "help": "A built-in task name (`trl-collm tasks` lists them) or your own task as MODULE:NAME or "
            "path/to/file.py:NAME, NAME being a trl_collm.tasks.TaskSpec or a no-argument function returning one."
        },
    )
    task_options: str | None = field(
        default=None, metadata={"help": "JSON dict of task options, e.g. '{\"turns\": 4}'."}
    )
    agent_models: list[str] | None = field(
        default=None,
        metadata={
            "help": "One model path or Hub id per agent, in agent order (a mixed team: each agent its own model and "
            "tokenizer); default: model_name_or_path for every agent."
        },
    )
    dataset_source: str | None = field(
        default=None, metadata={"help": "The task's dataset source (a Hub dataset, or e.g. building targets 'I,L')."}
    )
    train_limit: int | None = field(default=None, metadata={"help": "Use at most this many training rows."})
    eval_limit: int | None = field(default=None, metadata={"help": "Use at most this many evaluation rows."})
    plot: bool = field(
        default=True, metadata={"help": "Write learning_curve.png / .json into output_dir after training."}
    )
    threads: int | None = field(
        default=None,
        metadata={
            "help": "torch's intra-op thread count. Default on CPU: OMP_NUM_THREADS when it is set, else 1 (the CPU "
            "configs' tiny models run fastest on one thread, and more threads spin-wait on a shared machine); "
            "default on GPU: torch's own choice."
        },
    )


def _options(task_options) -> dict:
    if not task_options:
        return {}
    if isinstance(task_options, str):
        try:
            opts = json.loads(task_options)
        except json.JSONDecodeError as e:
            raise UsageError(
                f"--task_options {task_options!r} is not valid JSON ({e.msg}); pass a JSON object, "
                "e.g. '{\"turns\": 4}'"
            ) from e
    else:
        opts = dict(task_options)
    if not isinstance(opts, dict):
        raise UsageError(f"--task_options must be a JSON object, e.g. '{{\"turns\": 4}}', got {task_options!r}")
    return opts


def set_cpu_threads(threads: int | str | None, on_cpu: bool) -> int | None:
    """Choose torch's intra-op thread count for a command (`hardware.pick_cpu_threads`, the rule the trainers apply
    to a run started from Python too): `threads` when given; on CPU, OMP_NUM_THREADS when set (torch read it at
    import), else 1; on GPU, torch's default. Returns the count set, or None when torch's choice stands."""
    if threads is not None and threads != "auto" and threads < 1:
        raise UsageError(f"--threads {threads}: give a thread count >= 1, or leave it unset for the default")
    from ..hardware import pick_cpu_threads

    try:
        return pick_cpu_threads(threads, on_cpu)
    except ValueError as e:
        raise UsageError(str(e)) from e


def _task_turns(task, opts: dict) -> int:
    return int(opts.get("num_turns", opts.get("turns", task.num_turns)))


def looks_local(path: str) -> bool:
    """A path a user means as a local folder (absolute, relative with ./ or ../, ~, or deeper than 'org/name'),
    never a Hub repo id: missing, it is a missing folder, not a malformed repo id."""
    return path.startswith(("/", "./", "../", "~")) or path.count("/") > 1 or path.endswith("/") or "\\" in path


def _resolve_model(path: str | None, flag: str = "--model_name_or_path") -> str:
    if path in (None, TINY):
        from ..testing import tiny_model_dir

        return tiny_model_dir("tiny-qwen2")
    from ..team.pretrained import resolve_model_name

    resolved = resolve_model_name(path)  # a packaged model's name (e.g. smollm2-135m-instruct) becomes its folder
    if resolved == path:
        check_model_path(path, flag)
    return os.path.expanduser(resolved) if isinstance(resolved, str) else resolved


def check_model_path(path: str, flag: str) -> None:
    """A path meant as a local folder (looks_local) must exist: one line, not transformers' "Repo id must be ..."."""
    if looks_local(path) and not os.path.isdir(os.path.expanduser(path)):
        from ..team.pretrained import PACKAGED_MODELS

        raise UsageError(
            f"{flag} {path}: no such folder; give a local model folder (save_pretrained output), a Hub id such as "
            f"Qwen/Qwen2.5-0.5B, a packaged model ({', '.join(sorted(PACKAGED_MODELS))}) or `tiny` for the offline "
            "tiny model"
        )


def _parser_error(prog: str):
    def error(message: str):  # argparse prints the whole usage and exits; one line is enough
        raise UsageError(f"{prog}: {message} ({prog} --help lists the options)")

    return error


def _get_task(name: str):
    from ..tasks import get_task

    try:
        with user_errors():
            return get_task(name)
    except TypeError as e:  # an import path naming something that is not a task
        raise UsageError(str(e)) from e


def _check_options(task, opts: dict) -> None:
    """--task_options the task does not know would be dropped (or swallowed by a `**options` factory): refuse them.
    A task's options are the keywords its make_env / load_dataset name plus the ones its TaskSpec documents in
    `options`; a factory's `**options` alone declares none, since nothing says what it would do with them."""
    if not opts:
        return
    takers = [task.make_env, task.load_dataset]
    named = {
        name
        for f in takers
        for name, p in inspect.signature(f).parameters.items()
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    }
    known = (named | set(task.options or {})) - {"split", "source", "limit"}
    unknown = sorted(set(opts) - known)
    if unknown:
        declare = " (a task of yours: name it in make_env's signature or TaskSpec.options)"
        raise UsageError(
            f"--task_options: task {task.name!r} takes no option {', '.join(map(repr, unknown))} "
            f"(its options: {sorted(known) or 'none'}); drop it{declare if not task.options else ''}"
        )


def _takes_any_keyword(fn) -> bool:
    return any(p.kind == p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())


def _check_dataset_args(task, source, limits: dict) -> None:
    for flag, value in limits.items():
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value}: give a number of rows >= 1, or leave it unset for every row")
    takes_source = _takes_any_keyword(task.load_dataset) or "source" in inspect.signature(task.load_dataset).parameters
    if source is not None and not takes_source:
        raise UsageError(f"--dataset_source: task {task.name!r} has no dataset source to choose; drop it")


def _count_agents(task, env, row: dict, names: list[str]) -> int:
    """How many agents the task's environment actually seats (one observation each), from one episode's start."""
    from ..envs.protocol import validate_observations

    with user_errors(f"task {task.name!r} could not start an episode to check the team: "):
        probe = env.clone()
        try:
            observations = probe.reset(row)
        except ValueError:  # an env that seats any team size (RewardFunctionEnv without names): start it with ours
            observations = probe.reset_batch([row], len(names), names)[0]
        where = f"{type(env).__name__}.reset"  # the prompts as the rollout will check them (e.g. none empty)
        n = len(observations) if isinstance(observations, (list, tuple)) else 0  # anything else: refused below
        return len(validate_observations(observations, where, 0, n, None))


def _check_team_shape(task, env, row: dict, names: list[str], opts: dict, names_given: bool = True) -> None:
    """The team the flags describe must fit the environment, said before any model loads. `names_given`: the team
    size came from the flags (--agent_names, a num_agents option), not from the task's own agent names: when the
    task's own team does not fit its env, the env is at fault, and the message says so."""
    declared = getattr(env, "agent_names", None)
    if declared is not None and list(declared) != list(names):
        raise UsageError(
            f"--agent_names {' '.join(names)}: task {task.name!r} is played by {list(declared)}; drop --agent_names"
        )
    seats = _count_agents(task, env, row, names)
    if seats != len(names) and not names_given:
        raise UsageError(
            f"{type(env).__name__}.reset returned {seats} observation(s) for task {task.name!r}, whose agents are "
            f"{names}: an env's reset must return one observation per agent; fix the env (or the task's agent_names)"
        )
    if seats != len(names):
        via = "--task_options num_agents" if "num_agents" in opts else "--agent_names"
        raise UsageError(
            f"{via} asks for {len(names)} agents {names} but task {task.name!r} (with these --task_options) "
            f"seats {seats}; give {seats} agent names, or a task option that changes its team size"
        )
