"""The building tasks' datasets (target lists) and their registration as `building-str` / `building-house`."""

from __future__ import annotations

from collections.abc import Mapping

from .. import TaskSpec, register_task
from .env import BuildingEnv
from .scoring import (
    AGENT_NAMES,
    DEFAULT_TURN_BUDGET,
    HOUSE_TARGETS,
    NUM_TURNS,
    STR_TARGETS,
    Weights,
    make_target,
)


def _targets_from_source(source, default: list[str]) -> list:
    if source is None:
        return list(default)
    if isinstance(source, (list, tuple)):
        return list(source)
    import os

    if isinstance(source, str) and os.path.exists(source):
        from datasets import Dataset

        ds = Dataset.from_json(source) if source.endswith((".json", ".jsonl")) else Dataset.from_csv(source)
        return [dict(r) for r in ds]
    return [s.strip() for s in str(source).split(",") if s.strip()]


def _load(kind: str, default: list[str], split: str, source, limit):
    from datasets import Dataset

    if split not in ("train", "eval", "test", "validation"):
        raise ValueError(f"building-{kind}: unknown split {split!r}; use 'train' or 'eval'")
    items = _targets_from_source(source, default)
    rows = []
    for item in items:
        row = dict(item) if isinstance(item, Mapping) else {"target": str(item)}
        row.setdefault("kind", kind)
        row["target"] = str(row["target"]).upper() if kind == "str" else str(row["target"]).lower()
        make_target(row)  # fail now, at load time, on an unknown letter or blueprint
        rows.append({"target": row["target"], "kind": row["kind"]})
    if limit is not None:
        rows = rows[: int(limit)]
    return Dataset.from_list(rows)


def load_str_dataset(split: str = "train", source=None, limit: int | None = None):
    """StrBuild targets. Both splits hold the ten built-in strings (the task is a fixed set of targets; pass
    ``source`` — a list, "A,B" or a json/jsonl/csv file with a 'target' column — for held-out strings)."""
    return _load("str", STR_TARGETS, split, source, limit)


def load_house_dataset(split: str = "train", source=None, limit: int | None = None):
    """HouseBuild blueprints (cottage, hut, tower) for both splits; ``source`` as for StrBuild."""
    return _load("house", HOUSE_TARGETS, split, source, limit)


_OPTIONS = {
    "palettes": "dict agent -> list of blocks (keys are the agent names)",
    "num_turns": "turns per episode (4)",
    "turn_budget": f"command lines read per agent per turn ({DEFAULT_TURN_BUDGET}; None = unlimited)",
    "resource_limit": "blocks per agent per episode (None: unlimited for StrBuild, ceil(1.25 x share) for houses)",
    "sparse": "reward only the final score at the last turn (False: per-turn score deltas)",
    "weights": "Weights(coverage=2.0, extra=1.5, adjacency=1.0, unused=0.25) or a dict",
    "end_on_perfect": "end the episode as soon as the build is perfect (False)",
    "max_listed": "items per feedback list (12)",
}

register_task(
    TaskSpec(
        name="building-str",
        description=(
            "StrBuild: two builders write a string in a 5x5 pixel font with alternating colours (2 colours each)."
        ),
        agent_names=list(AGENT_NAMES),
        num_turns=NUM_TURNS,
        make_env=lambda **options: BuildingEnv(kind="str", **options),
        load_dataset=load_str_dataset,
        max_reward=Weights().coverage,
        options=dict(_OPTIONS),
    )
)
register_task(
    TaskSpec(
        name="building-house",
        description=(
            "HouseBuild: two builders with 2 materials and a block allowance each build a layered house blueprint."
        ),
        agent_names=list(AGENT_NAMES),
        num_turns=NUM_TURNS,
        make_env=lambda **options: BuildingEnv(kind="house", **options),
        load_dataset=load_house_dataset,
        max_reward=Weights().coverage,
        options=dict(_OPTIONS),
    )
)
