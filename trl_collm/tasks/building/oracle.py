"""The building tasks' oracle: the perfect plan of each builder, and the world it leaves.

Used by the warm start (trl_collm/warmstart.py), whose synthetic transcripts degrade this plan on purpose, and by
the tests (tests/test_task_building.py), which check that a perfect team reaches the maximum return. No agent or
trainer reads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..voxel import Cell, Target, World
from .scoring import (
    DEFAULT_TURN_BUDGET,
    NUM_TURNS,
    check_palettes,
    default_palettes,
    make_target,
    material_owners,
)


def _oracle_assignment(target: Target, palettes: Mapping[str, Sequence[str]]) -> dict[Cell, tuple[str, str]]:
    """cell -> (agent, block) for a perfect build.

    StrBuild: greedy colouring in scan order. Each cell picks, among (agent, colour) pairs whose colour differs from
    its already-coloured neighbours, the least-loaded agent and then the least-used colour, so work is balanced and
    every palette colour appears. In scan order at most 3 neighbours are coloured before a cell, so with the default
    four distinct colours a choice always exists. House: the blueprint fixes the block; its palette's owner places it.
    """
    agents = list(palettes)
    if target.kind == "house":
        owners = material_owners(target, palettes)
        return {c: (owners[b], b) for c, b in target.cells.items()}
    load = {a: 0 for a in agents}
    uses: dict[tuple[str, str], int] = {}
    out: dict[Cell, tuple[str, str]] = {}
    for c in sorted(target.cells, key=lambda c: (c[2], -c[1], c[0])):
        near = set()
        for dx, dy, dz in ((1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1)):
            n = (c[0] + dx, c[1] + dy, c[2] + dz)
            if n in out:
                near.add(out[n][1])
        options = [(a, b) for a in agents for b in palettes[a] if b not in near]
        if not options:
            raise ValueError(f"oracle: no colour fits cell {c} of '{target.name}' with palettes {dict(palettes)}")
        a, b = min(
            options, key=lambda ab: (load[ab[0]], uses.get(ab, 0), agents.index(ab[0]), palettes[ab[0]].index(ab[1]))
        )
        out[c] = (a, b)
        load[a] += 1
        uses[(a, b)] = uses.get((a, b), 0) + 1
    return out


def _boxes(cells: dict[Cell, str]) -> list[tuple[Cell, Cell, str]]:
    """Greedy decomposition of same-block cells into boxes (grow along x, then z, then y) -> few /fill commands."""
    left = dict(cells)
    boxes = []
    for c in sorted(cells, key=lambda c: (c[1], c[2], c[0])):
        if c not in left:
            continue
        block = left[c]
        x0, y0, z0 = c

        def full(xs, ys, zs):
            return all(left.get((x, y, z)) == block for x in xs for y in ys for z in zs)

        x1 = x0
        while full([x1 + 1], [y0], [z0]):
            x1 += 1
        z1 = z0
        while full(range(x0, x1 + 1), [y0], [z1 + 1]):
            z1 += 1
        y1 = y0
        while full(range(x0, x1 + 1), [y1 + 1], range(z0, z1 + 1)):
            y1 += 1
        for x in range(x0, x1 + 1):
            for y in range(y0, y1 + 1):
                for z in range(z0, z1 + 1):
                    del left[(x, y, z)]
        boxes.append(((x0, y0, z0), (x1, y1, z1), block))
    return boxes


def _command_text(lo: Cell, hi: Cell, block: str) -> str:
    if lo == hi:
        return f"/setblock {lo[0]} {lo[1]} {lo[2]} {block}"
    return f"/fill {lo[0]} {lo[1]} {lo[2]} {hi[0]} {hi[1]} {hi[2]} {block}"


def oracle_commands(
    row: Mapping,
    agent: str,
    *,
    num_turns: int = NUM_TURNS,
    palettes: Mapping[str, Sequence[str]] | None = None,
    turn_budget: int | None = DEFAULT_TURN_BUDGET,
) -> list[str]:
    """The perfect plan for ``agent``: one completion text per turn (commands joined by newlines).

    The agents' cells are disjoint, so no cell is ever contested; the commands are spread evenly over the turns.
    """
    target = make_target(row)
    palettes = check_palettes(palettes or default_palettes(target), target)
    if agent not in palettes:
        raise ValueError(f"oracle_commands: unknown agent {agent!r}; the palettes are for {list(palettes)}")
    mine = {c: b for c, (a, b) in _oracle_assignment(target, palettes).items() if a == agent}
    commands = [_command_text(lo, hi, b) for lo, hi, b in _boxes(mine)]
    # Balanced split: turn sizes differ by at most one, so every turn makes progress when there is enough work.
    base, rest = divmod(len(commands), num_turns)
    sizes = [base + (t < rest) for t in range(num_turns)]
    if turn_budget is not None and sizes[0] > turn_budget:
        raise ValueError(
            f"oracle_commands: {agent} needs {len(commands)} commands for '{target.name}', more than "
            f"{num_turns} turns x {turn_budget} commands"
        )
    starts = [sum(sizes[:t]) for t in range(num_turns)]
    return ["\n".join(commands[s : s + n]) for s, n in zip(starts, sizes)]


def oracle_world(row: Mapping, palettes: Mapping[str, Sequence[str]] | None = None) -> World:
    """The world a perfect build leaves (for tests, docs and pictures)."""
    target = make_target(row)
    palettes = check_palettes(palettes or default_palettes(target), target)
    world = World(target.size)
    for c, (a, b) in _oracle_assignment(target, palettes).items():
        world.place(c, b, owner=a)
    return world
