"""The builders' commands: parsing a completion into commands, reading a turn, applying it to the world."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..voxel import (
    AIR,
    Cell,
    World,
)
from .scoring import DEFAULT_TURN_BUDGET


@dataclass(frozen=True)
class Command:
    name: str  # "setblock" | "fill"
    lo: Cell
    hi: Cell
    block: str
    text: str

    def cells(self) -> list[Cell]:
        return [
            (x, y, z)
            for x in range(self.lo[0], self.hi[0] + 1)
            for y in range(self.lo[1], self.hi[1] + 1)
            for z in range(self.lo[2], self.hi[2] + 1)
        ]


@dataclass(frozen=True)
class Rejection:
    line: int  # 1-based line number in the agent's completion
    text: str
    reason: str

    def __str__(self) -> str:
        return f'line {self.line} "{self.text}": {self.reason}'


_COMMANDS = {"setblock": 4, "fill": 7}  # arguments before an optional mode
_MODES = ("replace", "destroy")  # accepted and ignored: both just overwrite the cells
_INT = re.compile(r"^-?\d+$")
_LEADERS = re.compile(r"^(?:[-*>]\s+|\d+[.)]\s+)")  # markdown bullets / numbering in front of a command


def _clean(line: str) -> str:
    line = line.strip().strip("`").strip()
    return _LEADERS.sub("", line).strip().strip("`").strip()


def is_command_line(line: str) -> bool:
    """Lines starting with '/' (or with a known command word) are commands; anything else is talk and ignored."""
    cleaned = _clean(line)
    if not cleaned:
        return False
    first = cleaned.split()[0].lower()
    return cleaned.startswith("/") or first in _COMMANDS


def parse_command(line: str) -> Command | str:
    """Parse one command line; returns a Command or the syntax error as a string."""
    text = _clean(line)
    parts = text.split()
    name = parts[0].lstrip("/").lower() if parts else ""
    if name not in _COMMANDS:
        return f"unknown command '{parts[0] if parts else text}' (use /setblock or /fill)"
    nargs = _COMMANDS[name]
    args = parts[1:]
    usage = "/setblock x y z block" if name == "setblock" else "/fill x1 y1 z1 x2 y2 z2 block"
    if len(args) == nargs + 1 and args[-1].lower() in _MODES:
        args = args[:-1]
    if len(args) != nargs:
        return f"syntax: expected {usage} ({nargs} arguments), got {len(args)}"
    coords, block = args[:-1], args[-1].lower()
    bad = [c for c in coords if not _INT.match(c)]
    if bad:
        return f"syntax: coordinates must be integers, got {bad[0]!r} (usage {usage})"
    if block.startswith("minecraft:"):
        block = block[len("minecraft:") :]
    if not re.match(r"^[a-z_]+$", block):
        return f"syntax: {args[-1]!r} is not a block name (usage {usage})"
    nums = [int(c) for c in coords]
    if name == "setblock":
        lo = hi = tuple(nums)
    else:
        a, b = nums[:3], nums[3:]
        lo, hi = tuple(min(p, q) for p, q in zip(a, b)), tuple(max(p, q) for p, q in zip(a, b))
    return Command(name=name, lo=lo, hi=hi, block=block, text=text)


def bounds_text(size) -> str:
    return f"x 0..{size[0] - 1}, y 0..{size[1] - 1}, z 0..{size[2] - 1}"


@dataclass
class TurnPlan:
    """One agent's accepted edits for a turn, before conflicts with the other agents are resolved."""

    edits: dict  # cell -> block (air = remove); later lines of the same agent override earlier ones
    charged: dict  # cell -> blocks charged to the allowance for that cell (refunded when contested)
    accepted: list  # Commands
    rejections: list  # Rejections
    ignored: int  # non-command lines (talk)


def read_turn(
    text: str,
    palette: Sequence[str],
    world: World,
    turn_budget: int | None = DEFAULT_TURN_BUDGET,
    blocks_left: int | None = None,
) -> TurnPlan:
    """Validate one agent's completion. Only the first ``turn_budget`` command lines are read (valid or not);
    a command is all-or-nothing: one cell out of bounds or one block over the allowance rejects the line."""
    edits: dict[Cell, str] = {}
    charged: dict[Cell, int] = {}
    accepted, rejections, ignored, seen = [], [], 0, 0
    left = blocks_left
    for number, raw in enumerate(str(text).splitlines(), start=1):
        if not is_command_line(raw):
            ignored += bool(raw.strip())
            continue
        seen += 1
        shown = _clean(raw)[:80]
        if turn_budget is not None and seen > turn_budget:
            rejections.append(Rejection(number, shown, f"over the per-turn budget of {turn_budget} commands"))
            continue
        cmd = parse_command(raw)
        if isinstance(cmd, str):
            rejections.append(Rejection(number, shown, cmd))
            continue
        if not (world.in_bounds(cmd.lo) and world.in_bounds(cmd.hi)):
            corner = cmd.lo if not world.in_bounds(cmd.lo) else cmd.hi
            rejections.append(Rejection(number, shown, f"out of bounds: {corner} is outside {bounds_text(world.size)}"))
            continue
        if cmd.block != AIR and cmd.block not in palette:
            rejections.append(
                Rejection(
                    number,
                    shown,
                    f"block '{cmd.block}' is not in your palette ({', '.join(palette)}, or air to remove)",
                )
            )
            continue
        cells = cmd.cells()
        # Only cells that actually change cost a block; re-placing the block already there is free.
        cost_cells = [
            c for c in cells if cmd.block != AIR and world.block(c) != cmd.block and edits.get(c) != cmd.block
        ]
        if left is not None and len(cost_cells) > left:
            rejections.append(
                Rejection(
                    number,
                    shown,
                    f"over your block allowance: needs {len(cost_cells)} blocks, {left} left this episode",
                )
            )
            continue
        if left is not None:
            left -= len(cost_cells)
        for c in cost_cells:
            charged[c] = charged.get(c, 0) + 1
        for c in cells:
            edits[c] = cmd.block
        accepted.append(cmd)
    return TurnPlan(edits=edits, charged=charged, accepted=accepted, rejections=rejections, ignored=ignored)


def apply_turn(world: World, plans: Mapping[str, TurnPlan]) -> dict[Cell, list[str]]:
    """Apply every agent's edits to ``world``. Conflict rule: a cell edited by two or more agents in the same turn
    is *contested* and nobody's edit of that cell applies (the blocks are refunded); order of agents never matters.
    Returns the contested cells -> the agents involved."""
    touched: dict[Cell, list[str]] = {}
    for agent, plan in plans.items():
        for c in plan.edits:
            touched.setdefault(c, []).append(agent)
    contested = {c: agents for c, agents in touched.items() if len(agents) > 1}
    for agent, plan in plans.items():
        for c, block in plan.edits.items():
            if c in contested:
                plan.charged.pop(c, None)
                continue
            world.place(c, block, owner=agent)
    return contested


# ----------------------------------------------------------------------------------------------------------------
# Score
# ----------------------------------------------------------------------------------------------------------------
