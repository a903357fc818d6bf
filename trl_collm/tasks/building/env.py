"""``BuildingEnv``: one building episode (StrBuild or HouseBuild): reset, step, feedback, rendering."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...chat import ChatPrompt, task_prompt
from ...envs import MultiAgentEnv, StepResult
from ..voxel import (
    Cell,
    World,
    block_legend,
    legend_line,
    render_png,
    target_text,
    world_text,
)
from .commands import apply_turn, bounds_text, read_turn
from .scoring import (
    DEFAULT_TURN_BUDGET,
    HOUSE_PALETTES,
    NUM_TURNS,
    STR_PALETTES,
    Weights,
    check_palettes,
    default_allowances,
    default_palettes,
    make_target,
    score_world,
)


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
        palettes = row.get("palettes") or self.palettes or default_palettes(self.target)
        self.active_palettes = check_palettes(palettes, self.target)
        if list(self.active_palettes) != list(self.agent_names):
            raise ValueError(
                f"BuildingEnv: the row's palettes are for {list(self.active_palettes)} but the env's agents are "
                f"{self.agent_names}; give palettes for the same agents in the same order"
            )
        self.active_budget = row.get("turn_budget", self.turn_budget)
        self.allowance = default_allowances(
            self.target, self.active_palettes, row.get("resource_limit", self.resource_limit)
        )
        self.blocks_left = dict(self.allowance)
        self.world = World(self.target.size)
        self.legend = block_legend([b for pal in self.active_palettes.values() for b in pal] + self.target.materials())
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
            f"voxel world of {bounds_text(self.world.size)}.",
            f"Goal: build {target.description}.",
        ]
        if target.kind == "str":
            lines.append(
                "Rule: target cells that share a face must have different colours; build nothing outside the target."
            )
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
            lines.append(
                "Contested cells (edited by two builders, left unchanged): "
                f"{_listing([_fmt(c) for c in sorted(mine)], k)}"
            )
        if det["missing"]:
            lines.append(
                f"Missing ({len(det['missing'])} of {len(self.target.cells)} target cells): "
                f"{_listing([_fmt(c) for c in det['missing']], k)}"
            )
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

    def _observation(self, agent: str, turn: dict | None, comp: dict | None) -> ChatPrompt:
        # Chat form: the task as the system message, this turn's feedback and world as the user's.
        parts = []
        if turn is not None:
            parts.append(self._feedback(agent, turn, comp))
        parts.append(f"Turn {self.t + 1} of {self.num_turns}. World now ({legend_line(self.legend)}, . = empty):")
        parts.append(world_text(self.world, self.legend))
        parts.append("Reply with your commands only, one per line.")
        return task_prompt(self._task_text(agent), "\n".join(parts), sep="\n")

    # -- people ----------------------------------------------------------------------------------------------------

    def render_png(self, path, title: str | None = None) -> str:
        if self.world is None:
            raise RuntimeError("BuildingEnv.render_png called before reset(row)")
        if title is None:
            title = (
                f"{self.target.name}: turn {self.t}/{self.num_turns}, score {self.last['score']:.2f}, "
                f"IoU {self.last['iou_pct']:.0f}%, Adj {self.last['adj_pct']:.0f}%"
            )
        return render_png(self.world, path, target=self.target, title=title)


# ----------------------------------------------------------------------------------------------------------------
# Datasets and registration
# ----------------------------------------------------------------------------------------------------------------
