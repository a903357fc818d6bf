"""Building tasks: two builders place blocks in a simulated voxel world (no game server).

* ``building-str`` (StrBuild): write a string (I, C, M, L, MC, ..., ICML) in a 5x5 pixel font in a vertical plane;
  touching target cells must have different colours and each builder owns only two colours, so the team has to
  interleave its work.
* ``building-house`` (HouseBuild): build a layered house blueprint (floor, walls with a door gap, windows, roof);
  each builder owns two of the four materials and has a block allowance for the episode.

Agents answer with Minecraft-style commands, one per line::

    /setblock x y z block
    /fill x1 y1 z1 x2 y2 z2 block        (block "air" removes)

Each turn both builders' valid commands are applied to the shared world; the joint reward is the change of the
build score (dense) or the final score at the last turn (``sparse=True``). See docs/tasks/building.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..envs import MultiAgentEnv, StepResult
from . import TaskSpec, register_task
from .voxel import (
    AIR,
    BLUEPRINTS,
    FONT,
    Cell,
    Target,
    World,
    block_legend,
    house_target,
    legend_line,
    render_png,
    string_target,
    target_text,
    world_text,
)

__all__ = [
    "AGENT_NAMES",
    "STR_PALETTES",
    "HOUSE_PALETTES",
    "STR_TARGETS",
    "HOUSE_TARGETS",
    "Weights",
    "Command",
    "Rejection",
    "BuildingEnv",
    "make_target",
    "parse_command",
    "read_turn",
    "apply_turn",
    "score_world",
    "oracle_commands",
    "oracle_world",
    "load_str_dataset",
    "load_house_dataset",
    "render_png",
    "FONT",
    "BLUEPRINTS",
]

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


def _bounds_text(size) -> str:
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
            rejections.append(Rejection(number, shown, f"out of bounds: {corner} is outside {_bounds_text(world.size)}"))
            continue
        if cmd.block != AIR and cmd.block not in palette:
            rejections.append(
                Rejection(number, shown, f"block '{cmd.block}' is not in your palette ({', '.join(palette)}, or air to remove)")
            )
            continue
        cells = cmd.cells()
        # Only cells that actually change cost a block; re-placing the block already there is free.
        cost_cells = [c for c in cells if cmd.block != AIR and world.block(c) != cmd.block and edits.get(c) != cmd.block]
        if left is not None and len(cost_cells) > left:
            rejections.append(
                Rejection(number, shown, f"over your block allowance: needs {len(cost_cells)} blocks, {left} left this episode")
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


def _relevant_palette(target: Target, palettes: Mapping[str, Sequence[str]]) -> list[tuple[str, str]]:
    """(agent, block) pairs that a perfect build uses: every palette block for StrBuild (colours are free), the
    blueprint's materials for a house (a palette block the house does not need is not held against anyone)."""
    materials = set(target.materials())
    return [(a, b) for a, pal in palettes.items() for b in pal if target.kind == "str" or b in materials]


def score_world(world: World, target: Target, palettes: Mapping[str, Sequence[str]], weights: Weights = Weights()) -> dict:
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


def _check_palettes(palettes: Mapping[str, Sequence[str]], target: Target) -> dict[str, list[str]]:
    palettes = {str(a): [str(b).lower() for b in pal] for a, pal in palettes.items()}
    for a, pal in palettes.items():
        if not pal:
            raise ValueError(f"building: agent {a!r} has an empty palette")
        if AIR in pal:
            raise ValueError(f"building: 'air' cannot be in a palette (everyone may remove blocks with air); agent {a!r}")
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
    owners = _material_owners(target, palettes)
    share = {a: sum(1 for b in target.cells.values() if owners.get(b) == a) for a in palettes}
    return {a: math.ceil(HOUSE_RESOURCE_SLACK * share[a]) for a in palettes}


def _material_owners(target: Target, palettes: Mapping[str, Sequence[str]]) -> dict[str, str]:
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


def _oracle_assignment(target: Target, palettes: Mapping[str, Sequence[str]]) -> dict[Cell, tuple[str, str]]:
    """cell -> (agent, block) for a perfect build.

    StrBuild: greedy colouring in scan order. Each cell picks, among (agent, colour) pairs whose colour differs from
    its already-coloured neighbours, the least-loaded agent and then the least-used colour, so work is balanced and
    every palette colour appears. In scan order at most 3 neighbours are coloured before a cell, so with the default
    four distinct colours a choice always exists. House: the blueprint fixes the block; its palette's owner places it.
    """
    agents = list(palettes)
    if target.kind == "house":
        owners = _material_owners(target, palettes)
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
        a, b = min(options, key=lambda ab: (load[ab[0]], uses.get(ab, 0), agents.index(ab[0]), palettes[ab[0]].index(ab[1])))
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
    palettes = _check_palettes(palettes or _default_palettes(target), target)
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
    palettes = _check_palettes(palettes or _default_palettes(target), target)
    world = World(target.size)
    for c, (a, b) in _oracle_assignment(target, palettes).items():
        world.place(c, b, owner=a)
    return world


def _default_palettes(target: Target) -> dict[str, list[str]]:
    return {a: list(p) for a, p in (HOUSE_PALETTES if target.kind == "house" else STR_PALETTES).items()}


# ----------------------------------------------------------------------------------------------------------------
# Environment
# ----------------------------------------------------------------------------------------------------------------


def _fmt(c: Cell) -> str:
    return f"({c[0]},{c[1]},{c[2]})"


def _listing(items: list[str], limit: int) -> str:
    if len(items) <= limit:
        return " ".join(items)
    return " ".join(items[:limit]) + f" ... and {len(items) - limit} more"


class BuildingEnv(MultiAgentEnv):
    """One building episode (StrBuild or HouseBuild, from ``row["kind"]``).

    Options: ``palettes`` (dict agent -> blocks; its keys are the agent names), ``num_turns`` (4),
    ``turn_budget`` (command lines read per agent per turn, None = unlimited), ``resource_limit`` (blocks per agent
    per episode: None = default, int or dict), ``sparse`` (reward only the final score at the last turn),
    ``weights`` (Weights or dict), ``end_on_perfect`` (stop the episode once the build is perfect),
    ``max_listed`` (items per feedback list). A row may override ``palettes``, ``turn_budget`` and ``resource_limit``.
    """

    reward_type = "joint"

    def __init__(
        self,
        kind: str | None = None,
        *,
        palettes: Mapping[str, Sequence[str]] | None = None,
        num_turns: int = NUM_TURNS,
        turn_budget: int | None = DEFAULT_TURN_BUDGET,
        resource_limit: int | Mapping[str, int] | None = None,
        sparse: bool = False,
        weights: Weights | Mapping | None = None,
        end_on_perfect: bool = False,
        max_listed: int = 12,
    ):
        if kind not in (None, "str", "house"):
            raise ValueError(f"BuildingEnv: kind must be 'str', 'house' or None (from the row), got {kind!r}")
        if num_turns < 1:
            raise ValueError(f"BuildingEnv: num_turns must be >= 1, got {num_turns}")
        self.kind = kind
        self.palettes = {a: list(p) for a, p in palettes.items()} if palettes is not None else None
        base = HOUSE_PALETTES if kind == "house" else STR_PALETTES
        self.agent_names = list(self.palettes or base)
        self.num_turns = self.max_turns = int(num_turns)
        self.turn_budget = turn_budget
        self.resource_limit = resource_limit
        self.sparse = bool(sparse)
        self.weights = Weights(**weights) if isinstance(weights, Mapping) else (weights or Weights())
        self.end_on_perfect = bool(end_on_perfect)
        self.max_listed = int(max_listed)
        self.world: World | None = None

    # -- episode ---------------------------------------------------------------------------------------------------

    def reset(self, row: Mapping) -> list[str]:
        row = dict(row)
        if self.kind is not None:
            row.setdefault("kind", self.kind)
        self.row = row
        self.target = make_target(row)
        palettes = row.get("palettes") or self.palettes or _default_palettes(self.target)
        self.active_palettes = _check_palettes(palettes, self.target)
        if list(self.active_palettes) != list(self.agent_names):
            raise ValueError(
                f"BuildingEnv: the row's palettes are for {list(self.active_palettes)} but the env's agents are "
                f"{self.agent_names}; give palettes for the same agents in the same order"
            )
        self.active_budget = row.get("turn_budget", self.turn_budget)
        self.allowance = default_allowances(self.target, self.active_palettes, row.get("resource_limit", self.resource_limit))
        self.blocks_left = dict(self.allowance)
        self.world = World(self.target.size)
        self.legend = block_legend(
            [b for pal in self.active_palettes.values() for b in pal] + self.target.materials()
        )
        self.t = 0
        self.prev_score = 0.0  # so the dense rewards telescope to the final score (see docs)
        self.last = score_world(self.world, self.target, self.active_palettes, self.weights)
        self.history: list[dict] = []
        return [self._observation(a, None, None) for a in self.agent_names]

    def step(self, completions: list[str]) -> StepResult:
        if self.world is None:
            raise RuntimeError("BuildingEnv.step called before reset(row)")
        if len(completions) != len(self.agent_names):
            raise ValueError(f"BuildingEnv.step got {len(completions)} completions for agents {self.agent_names}")
        plans = {
            a: read_turn(text, self.active_palettes[a], self.world, self.active_budget, self.blocks_left[a])
            for a, text in zip(self.agent_names, completions)
        }
        contested = apply_turn(self.world, plans)
        for a, plan in plans.items():
            if self.blocks_left[a] is not None:
                self.blocks_left[a] -= sum(plan.charged.values())
        self.t += 1
        comp = score_world(self.world, self.target, self.active_palettes, self.weights)
        perfect = comp["score"] >= self.weights.coverage - 1e-9
        done = self.t >= self.num_turns or (self.end_on_perfect and perfect)
        if self.sparse:
            reward = comp["score"] if done else 0.0
        else:
            reward = comp["score"] - self.prev_score
        self.prev_score = comp["score"]
        self.last = comp
        turn = {"turn": self.t, "reward": reward, "contested": contested, "plans": plans}
        self.history.append(turn)
        info = {k: v for k, v in comp.items() if k != "details"}
        info.update(
            turn=self.t,
            perfect=perfect,
            contested=len(contested),
            rejected={a: len(p.rejections) for a, p in plans.items()},
            applied={a: len(p.accepted) for a, p in plans.items()},
        )
        observations = None if done else [self._observation(a, turn, comp) for a in self.agent_names]
        return StepResult(reward=reward, observations=observations, done=done, info=info)

    # -- observations ----------------------------------------------------------------------------------------------

    def _task_text(self, agent: str) -> str:
        target = self.target
        others = [f"{b}'s palette: {', '.join(p)}" for b, p in self.active_palettes.items() if b != agent]
        lines = [
            f"You are {agent}, one of {len(self.agent_names)} builders ({', '.join(self.agent_names)}) sharing one "
            f"voxel world of {_bounds_text(self.world.size)}.",
            f"Goal: build {target.description}.",
        ]
        if target.kind == "str":
            lines.append("Rule: target cells that share a face must have different colours; build nothing outside the target.")
            lines.append("Target (# = place a block, . = leave empty):")
        else:
            lines.append("Rule: each cell must hold the block shown; '.' cells (door, inside, around) must stay empty.")
            lines.append(f"Target ({legend_line({b: self.legend[b] for b in target.materials()})}, . = empty):")
        lines.append(target_text(target, self.legend))
        lines.append(f"Your palette: {', '.join(self.active_palettes[agent])}. " + ". ".join(others) + ".")
        budget = "unlimited commands" if self.active_budget is None else f"at most {self.active_budget} commands"
        allowance = ""
        if self.blocks_left[agent] is not None:
            allowance = f"; {self.blocks_left[agent]} of {self.allowance[agent]} blocks left for the episode"
        lines.append(f"Your budget: {budget} per turn{allowance}.")
        lines.append(
            "Commands, one per line: /setblock x y z block | /fill x1 y1 z1 x2 y2 z2 block (block air removes). "
            "A cell both builders edit in the same turn is contested and stays unchanged."
        )
        return "\n".join(lines)

    def _feedback(self, agent: str, turn: dict, comp: dict) -> str:
        k = self.max_listed
        det = comp["details"]
        plan = turn["plans"][agent]
        lines = [
            f"Turn {turn['turn']} result: score {comp['score']:.3f} (coverage {100 * comp['coverage']:.0f}%, "
            f"IoU {comp['iou_pct']:.0f}%, Adj {comp['adj_pct']:.0f}%), reward {turn['reward']:+.3f}.",
            f"Your commands: {len(plan.accepted)} applied, {len(plan.rejections)} rejected.",
        ]
        for r in plan.rejections[:k]:
            lines.append(f"  rejected {r}")
        if len(plan.rejections) > k:
            lines.append(f"  ... and {len(plan.rejections) - k} more rejected lines")
        for b, p in turn["plans"].items():
            if b != agent:
                lines.append(f"{b}: {len(p.accepted)} commands applied, {len(p.rejections)} rejected.")
        mine = [c for c, agents in turn["contested"].items() if agent in agents]
        if mine:
            lines.append(f"Contested cells (edited by two builders, left unchanged): {_listing([_fmt(c) for c in sorted(mine)], k)}")
        if det["missing"]:
            lines.append(f"Missing ({len(det['missing'])} of {len(self.target.cells)} target cells): {_listing([_fmt(c) for c in det['missing']], k)}")
        else:
            lines.append("Missing: none, every target cell is filled.")
        if det["wrong"]:
            items = [f"{_fmt(c)} has {have}, needs {want}" for c, have, want in det["wrong"]]
            lines.append(f"Wrong block ({len(items)}): {_listing(items, k)}")
        if det["extra"]:
            items = [f"{_fmt(c)} {self.world.block(c)} [{self.world.owner(c)}]" for c in det["extra"]]
            lines.append(f"Extra blocks outside the target (remove with air) ({len(items)}): {_listing(items, k)}")
        if det["same_colour"]:
            items = [f"{_fmt(a)}-{_fmt(b)} {self.world.block(a)}" for a, b in det["same_colour"]]
            lines.append(f"Same-colour neighbours ({len(items)}): {_listing(items, k)}")
        unused = [b for a, b in det["unused"] if a == agent]
        if unused:
            lines.append(f"Unused palette: you have no {', '.join(unused)} in the target yet.")
        return "\n".join(lines)

    def _observation(self, agent: str, turn: dict | None, comp: dict | None) -> str:
        parts = [self._task_text(agent)]
        if turn is not None:
            parts.append(self._feedback(agent, turn, comp))
        parts.append(f"Turn {self.t + 1} of {self.num_turns}. World now ({legend_line(self.legend)}, . = empty):")
        parts.append(world_text(self.world, self.legend))
        parts.append("Reply with your commands only, one per line.")
        return "\n".join(parts)

    # -- people ----------------------------------------------------------------------------------------------------

    def render_png(self, path, title: str | None = None) -> str:
        if self.world is None:
            raise RuntimeError("BuildingEnv.render_png called before reset(row)")
        if title is None:
            title = (f"{self.target.name}: turn {self.t}/{self.num_turns}, score {self.last['score']:.2f}, "
                     f"IoU {self.last['iou_pct']:.0f}%, Adj {self.last['adj_pct']:.0f}%")
        return render_png(self.world, path, target=self.target, title=title)


# ----------------------------------------------------------------------------------------------------------------
# Datasets and registration
# ----------------------------------------------------------------------------------------------------------------


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
        description="StrBuild: two builders write a string in a 5x5 pixel font with alternating colours (2 colours each).",
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
        description="HouseBuild: two builders with 2 materials and a block allowance each build a layered house blueprint.",
        agent_names=list(AGENT_NAMES),
        num_turns=NUM_TURNS,
        make_env=lambda **options: BuildingEnv(kind="house", **options),
        load_dataset=load_house_dataset,
        max_reward=Weights().coverage,
        options=dict(_OPTIONS),
    )
)
