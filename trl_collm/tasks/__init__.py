"""Built-in tasks, registered by name. A task = an environment factory + an offline dataset + its team shape.

    from trl_collm.tasks import get_task, list_tasks
    task = get_task("writing-summary")
    env, train, evals = task.make_env(), task.load_dataset("train"), task.load_dataset("eval")

Task modules register themselves on import (see `_BUILTIN_MODULES`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class TaskSpec:
    name: str
    description: str
    agent_names: list[str]
    num_turns: int
    make_env: Callable[..., object]  # (**options) -> MultiAgentEnv
    load_dataset: Callable[..., object]  # (split: str = "train", source: str | None = None, limit: int | None = None) -> datasets.Dataset
    max_reward: float | None = None  # best possible episode return, for "% of max" reports
    options: dict = field(default_factory=dict)  # documented keyword options of make_env


_REGISTRY: dict[str, TaskSpec] = {}
_BUILTIN_MODULES = ("writing", "code", "building", "coordination")


def register_task(spec: TaskSpec) -> TaskSpec:
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"task {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        try:
            importlib.import_module(f"{__name__}.{module}")
        except ModuleNotFoundError as e:  # a task module not written yet must not break the others
            if e.name != f"{__name__}.{module}":
                raise


def list_tasks() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def get_task(name: str) -> TaskSpec:
    _load_builtins()
    if name not in _REGISTRY:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(_REGISTRY)} (or register your own with register_task)")
    return _REGISTRY[name]
