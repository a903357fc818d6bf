"""The building rules' numbers: team constants, targets, palettes, block allowances and the build score."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..voxel import (
    AIR,
    BLUEPRINTS,
    Target,
    World,
    house_target,
    string_target,
)

AGENT_NAMES = ["builder_a", "builder_b"]
NUM_TURNS = 4
STR_PALETTES = {"builder_a": ["red_wool", "blue_wool"], "builder_b": ["yellow_wool", "green_wool"]}
HOUSE_PALETTES = {"builder_a": ["stone", "glass"], "builder_b": ["oak_planks", "bricks"]}
STR_TARGETS = ["I", "C", "M", "L", "MC", "CM", "LI", "LLM", "ICML", "CLIM"]
HOUSE_TARGETS = ["cottage", "hut", "tower"]
DEFAULT_TURN_BUDGET = 10  # command lines read per agent per turn
HOUSE_RESOURCE_SLACK = 1.25  # default allowance = ceil(slack * blocks of the agent's materials in the blueprint)


@dataclass(frozen=True)
class Weights:
    """score = coverage*c - extra*e - adjacency*a - unused*u; a perfect build scores ``coverage``."""

    coverage: float = 2.0
    extra: float = 1.5
    adjacency: float = 1.0
    unused: float = 0.25


# ----------------------------------------------------------------------------------------------------------------
# Commands
# ----------------------------------------------------------------------------------------------------------------


def _relevant_palette(target: Target, palettes: Mapping[str, Sequence[str]]) -> list[tuple[str, str]]:
    """(agent, block) pairs that a perfect build uses: every palette block for StrBuild (colours are free), the
    blueprint's materials for a house (a palette block the house does not need is not held against anyone)."""
    materials = set(target.materials())
    return [(a, b) for a, pal in palettes.items() for b in pal if target.kind == "str" or b in materials]


def score_world(
    world: World, target: Target, palettes: Mapping[str, Sequence[str]], weights: Weights = Weights()
) -> dict:
    """Score the state of the world (not a delta). Components (all fractions in [0, 1]):

    * coverage: target cells holding an acceptable block (any block for StrBuild, the blueprint's for a house);
    * extra: blocks outside the target / number of target cells (capped at 1);
    * adjacency: face-sharing target pairs with the same block / all face-sharing target pairs (StrBuild only);
    * unused: palette blocks (per agent) a perfect build uses of which the agent has no block inside the target;
    * iou: |occupied & target| / |occupied | target| (occupancy, materials ignored).
    """
    cells = target.cells
    n = len(cells)
    covered, missing, wrong = [], [], []
    for c, want in cells.items():
        have = world.block(c)
        if have is None:
            missing.append(c)
        elif want is None or have == want:
            covered.append(c)
        else:
            wrong.append((c, have, want))
    extra = sorted(c for c in world.cells if c not in cells)
    pairs = target.neighbour_pairs()
    same = []
    if target.distinct_neighbours:
        same = [(a, b) for a, b in pairs if world.block(a) is not None and world.block(a) == world.block(b)]
    relevant = _relevant_palette(target, palettes)
    # Only blocks inside the target count as used: a token block parked outside would otherwise buy off the
    # penalty for less than it costs in "extra" on long strings.
    used = {world.cells[c][::-1] for c in cells if c in world.cells}
    unused = [(a, b) for a, b in relevant if (a, b) not in used]
    occupied_in_target = n - len(missing)
    union = n + len(extra)
    comp = {
        "coverage": len(covered) / n,
        "extra": min(1.0, len(extra) / n),
        "adjacency": (len(same) / len(pairs)) if (pairs and target.distinct_neighbours) else 0.0,
        "unused": (len(unused) / len(relevant)) if relevant else 0.0,
        "iou": occupied_in_target / union if union else 0.0,
    }
    comp["score"] = (
        weights.coverage * comp["coverage"]
        - weights.extra * comp["extra"]
        - weights.adjacency * comp["adjacency"]
        - weights.unused * comp["unused"]
    )
    comp["iou_pct"] = 100.0 * comp["iou"]
    comp["adj_pct"] = 100.0 * comp["adjacency"]
    # Listing order for feedback: left to right, top to bottom for a string; layer by layer for a house.
    key = (lambda c: (c[0], -c[1], c[2])) if target.kind == "str" else (lambda c: (c[1], c[2], c[0]))
    comp["details"] = {
        "missing": sorted(missing, key=key),
        "wrong": sorted(wrong, key=lambda w: key(w[0])),
        "extra": sorted(extra, key=key),
        "same_colour": same,
        "unused": unused,
    }
    return comp


# ----------------------------------------------------------------------------------------------------------------
# Targets and palettes
# ----------------------------------------------------------------------------------------------------------------


def make_target(row: Mapping) -> Target:
    kind = row.get("kind") or ("house" if str(row.get("target", "")).lower() in BLUEPRINTS else "str")
    if kind == "str":
        return string_target(row["target"])
    if kind == "house":
        return house_target(str(row["target"]).lower())
    raise ValueError(f"building task row has kind={kind!r}; expected 'str' or 'house'")


def check_palettes(palettes: Mapping[str, Sequence[str]], target: Target) -> dict[str, list[str]]:
    palettes = {str(a): [str(b).lower() for b in pal] for a, pal in palettes.items()}
    for a, pal in palettes.items():
        if not pal:
            raise ValueError(f"building: agent {a!r} has an empty palette")
        if AIR in pal:
            raise ValueError(
                f"building: 'air' cannot be in a palette (everyone may remove blocks with air); agent {a!r}"
            )
    missing = sorted(set(target.materials()) - {b for pal in palettes.values() for b in pal})
    if missing:
        raise ValueError(f"building: blueprint '{target.name}' needs {missing}, which no agent's palette holds")
    return palettes


def default_allowances(target: Target, palettes: Mapping[str, Sequence[str]], resource_limit) -> dict[str, int | None]:
    """Per-agent block allowance for the episode. ``resource_limit``: None (StrBuild: unlimited; house: the
    agent's share of the blueprint times HOUSE_RESOURCE_SLACK, rounded up), an int, or a dict agent -> int."""
    if isinstance(resource_limit, Mapping):
        return {a: (None if resource_limit.get(a) is None else int(resource_limit[a])) for a in palettes}
    if resource_limit is not None:
        return {a: int(resource_limit) for a in palettes}
    if target.kind != "house":
        return {a: None for a in palettes}
    owners = material_owners(target, palettes)
    share = {a: sum(1 for b in target.cells.values() if owners.get(b) == a) for a in palettes}
    return {a: math.ceil(HOUSE_RESOURCE_SLACK * share[a]) for a in palettes}


def material_owners(target: Target, palettes: Mapping[str, Sequence[str]]) -> dict[str, str]:
    owners = {}
    for b in target.materials():
        for a, pal in palettes.items():
            if b in pal:
                owners[b] = a
                break
    return owners


# ----------------------------------------------------------------------------------------------------------------
# Oracle (the perfect plan)
# ----------------------------------------------------------------------------------------------------------------


def default_palettes(target: Target) -> dict[str, list[str]]:
    return {a: list(p) for a, p in (HOUSE_PALETTES if target.kind == "house" else STR_PALETTES).items()}


# ----------------------------------------------------------------------------------------------------------------
# Environment
