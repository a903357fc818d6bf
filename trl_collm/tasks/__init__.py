"""Built-in tasks, registered by name, and your own tasks by import path. A task = an environment factory + an
offline dataset + its team shape (a `TaskSpec`).

    from trl_collm.tasks import get_task, list_tasks
    task = get_task("writing-summary")                 # a built-in
    task = get_task("my_tasks:TASK")                   # your own: a TaskSpec (or a function returning one) ...
    task = get_task("path/to/my_tasks.py:make_task")   # ... in a module on sys.path / the current directory, or a file
    env, train, evals = task.make_env(), task.load_dataset("train"), task.load_dataset("eval")

Task modules register themselves on import; `get_task` imports only the module of the task asked for.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class TaskSpec:
    name: str
    description: str
    agent_names: list[str]
    num_turns: int
    make_env: Callable[..., object]  # (**options) -> MultiAgentEnv
    # (split: str = "train", source: str | None = None, limit: int | None = None) -> datasets.Dataset
    load_dataset: Callable[..., object]
    max_reward: float | None = None  # best possible episode return, for "% of max" reports
    options: dict = field(default_factory=dict)  # documented keyword options of make_env

    def env(self, **options):
        """make_env with the options it takes (all of them when it takes **kwargs), as the CLI does with
        --task_options: one dict of options serves make_env and load_dataset alike."""
        return call_with_supported(self.make_env, **options)

    def dataset(self, split: str = "train", **kwargs):
        """load_dataset with the keywords it takes (limit, source, task options), as the CLI calls it."""
        return call_with_supported(self.load_dataset, split=split, **kwargs)


def call_with_supported(fn, **kwargs):
    """fn(**kwargs) without the keywords fn does not take (all of them pass when it takes **kwargs)."""
    import inspect

    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return fn(**kwargs)
    return fn(**{k: v for k, v in kwargs.items() if k in params})


_REGISTRY: dict[str, TaskSpec] = {}

# The built-ins: name -> (module, number of agents, turns, description). Listed here so that `trl-collm tasks` and
# `--help` answer without importing the task modules (they import torch); tests/test_cli_usability.py checks every entry
# against the TaskSpec its module registers.
BUILTIN_TASKS: dict[str, tuple[str, int, int, str]] = {
    "building-house": (
        "building",
        2,
        4,
        ("HouseBuild: two builders with 2 materials and a block allowance each build a layered house blueprint."),
    ),
    "building-str": (
        "building",
        2,
        4,
        ("StrBuild: two builders write a string in a 5x5 pixel font with alternating colours (2 colours each)."),
    ),
    "code-humaneval": (
        "code",
        2,
        2,
        (
            "HumanEval: agent 'aux' writes a helper `aux`, agent 'main' the entry point that calls "
            "it; 2 turns with test feedback; level-gated joint reward (definitions, syntax, tests, "
            "collaboration), max 4."
        ),
    ),
    "coord-climbing": ("coordination", 2, 1, "Climbing matrix game (2 agents, 1 turn); optimum A/A = 1.0."),
    "coord-numbers": ("coordination", 2, 1, "Pick digits that add up to a target (2-4 agents, 1 turn); optimum 1.0."),
    "coord-penalty": ("coordination", 2, 1, "Penalty matrix game, k=-10 (2 agents, 1 turn); optima A/A and C/C = 1.0."),
    "coord-repeated": (
        "coordination",
        2,
        4,
        ("Climbing game repeated over turns (2 agents, default 4 turns, sparse reward); optimum 1.0."),
    ),
    "writing-intro": (
        "writing",
        2,
        1,
        (
            "From a research abstract, agent 'background' writes background and motivation and agent "
            "'method' the method and implications (60-120 words each, ratio in [0.6, 1.6]); "
            "level-gated reward, max 3."
        ),
    ),
    "writing-revise": (
        "writing_revise",
        2,
        2,
        (
            "writing-summary over 2 turns: the writers draft, see each other's draft and word counts, and "
            "revise; the level-gated score (max 3) of the final texts is paid at the end only."
        ),
    ),
    "writing-tags": (
        "tags",
        2,
        1,
        ("Two taggers name a forum post's forum and subject tags (ours; a small conditional writing task)."),
    ),
    "writing-summary": (
        "writing",
        2,
        1,
        (
            "From a forum post, agent 'concise' writes a 15-40 word summary and agent 'detailed' a "
            "60-120 word one (detailed/concise in [2, 4]); level-gated reward, max 3."
        ),
    ),
}
_BUILTIN_MODULES = ("writing", "writing_revise", "code", "building", "coordination", "tags")

IMPORT_PATH_HELP = (
    "your own task: --task MODULE:NAME or --task path/to/file.py:NAME, where NAME is a trl_collm.tasks.TaskSpec "
    "(make_env(**options) -> MultiAgentEnv, load_dataset(split, source=None, limit=None) -> datasets.Dataset) or a "
    "function with no arguments that returns one"
)


def register_task(spec: TaskSpec) -> TaskSpec:
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"task {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def _import_builtin(module: str) -> None:
    try:
        importlib.import_module(f"{__name__}.{module}")
    except ModuleNotFoundError as e:  # a task module not written yet must not break the others
        if e.name != f"{__name__}.{module}":
            raise


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        _import_builtin(module)


def known_task_names() -> set[str]:
    """The built-ins' names and the tasks registered so far, without importing any task module."""
    return set(BUILTIN_TASKS) | set(_REGISTRY)


def list_tasks() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def is_import_path(name: str) -> bool:
    return ":" in name


def load_task_from_path(ref: str) -> TaskSpec:
    """`MODULE:NAME` or `FILE.py:NAME` -> the TaskSpec NAME names (or that a zero-argument function NAME returns).

    A module is imported as by `python -m` (the current directory is searched too); a file is loaded by its path.
    """
    where, _, attr = ref.rpartition(":")
    if not where or not attr:
        raise ValueError(f"--task {ref!r}: an import path is MODULE:NAME or path/to/file.py:NAME")
    if where.endswith(".py"):
        if not os.path.isfile(where):
            raise FileNotFoundError(f"--task {ref!r}: no file {where!r}")
        mod_name = "_trl_collm_task_" + os.path.splitext(os.path.basename(where))[0]
        spec = importlib.util.spec_from_file_location(mod_name, where)
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.append(os.getcwd())
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as e:
            if e.name and where.startswith(e.name):
                raise ValueError(
                    f"--task {ref!r}: cannot import module {where!r} (is it on PYTHONPATH or in the "
                    "current directory? a file path must end in .py)"
                ) from e
            raise
    if not hasattr(module, attr):
        raise ValueError(f"--task {ref!r}: module {where!r} has no attribute {attr!r}")
    obj = getattr(module, attr)
    if callable(obj) and not isinstance(obj, TaskSpec):
        _check_no_arguments(ref, attr, obj)
        obj = obj()
    if not isinstance(obj, TaskSpec):
        raise TypeError(
            f"--task {ref!r}: {attr!r} is a {type(obj).__name__}, not a trl_collm.tasks.TaskSpec (or a "
            "function with no arguments that returns one)"
        )
    return obj


def _check_no_arguments(ref: str, attr: str, fn) -> None:
    """A task factory is called with no arguments: one that needs some is not a factory (say so, not a TypeError)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: calling it says what is wrong
        return
    needed = [
        p.name
        for p in params
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if needed:
        raise ValueError(
            f"--task {ref!r}: {attr!r} takes arguments ({', '.join(needed)}), so it is not a task; NAME must be a "
            "trl_collm.tasks.TaskSpec or a function with no arguments that returns one"
        )


def get_task(name: str) -> TaskSpec:
    """A built-in or registered task by name, or your own by import path (see `load_task_from_path`)."""
    if is_import_path(name):
        return load_task_from_path(name)
    if name in BUILTIN_TASKS:
        _import_builtin(BUILTIN_TASKS[name][0])
    if name not in _REGISTRY:
        _load_builtins()
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown task {name!r}; choose one of {sorted(_REGISTRY)}, or give your own as "
            "MODULE:NAME (`trl-collm tasks` says how)"
        )
    return _REGISTRY[name]
