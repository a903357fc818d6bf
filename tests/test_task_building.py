"""The building tasks (StrBuild / HouseBuild): parser, font, colour constraint, reward components, feedback,
oracle episodes, PNG rendering, and short CC / DC trainer runs on a tiny offline model."""

from __future__ import annotations

import math
import struct

import pytest

from trl_collm.tasks import get_task
from trl_collm.tasks.building import (
    AGENT_NAMES,
    BLUEPRINTS,
    FONT,
    HOUSE_PALETTES,
    HOUSE_TARGETS,
    STR_PALETTES,
    STR_TARGETS,
    BuildingEnv,
    Command,
    Weights,
    apply_turn,
    make_target,
    parse_command,
    read_turn,
    score_world,
)
from trl_collm.tasks.building.oracle import oracle_commands, oracle_world
from trl_collm.tasks.voxel import World, block_legend, house_target, render_png, string_target, target_text, world_text

# ---------------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------------

I_ROW = {"target": "I", "kind": "str"}
# Target "I": top row y=4 (x 0..4), stem x=2 at y 3..1, bottom row y=0 (x 0..4).
I_CELLS = [(x, 4, 0) for x in range(5)] + [(2, y, 0) for y in (3, 2, 1)] + [(x, 0, 0) for x in range(5)]
I_PAIRS = 4 + 4 + 4  # top row, bottom row, the stem's 4 vertical links (y 4-3, 3-2, 2-1, 1-0)


def world_of(target, placements):
    w = World(target.size)
    for cell, block, owner in placements:
        w.place(cell, block, owner)
    return w


def run_oracle(env, row):
    """Play the oracle plan through the env; returns (rewards, last StepResult)."""
    env.reset(row)
    plans = {a: oracle_commands(row, a, num_turns=env.num_turns, palettes=env.active_palettes) for a in env.agent_names}
    rewards, result = [], None
    for t in range(env.num_turns):
        result = env.step([plans[a][t] for a in env.agent_names])
        rewards.append(result.reward)
        if result.done:
            break
    return rewards, result


# ---------------------------------------------------------------------------------------------------------------
# parser
# ---------------------------------------------------------------------------------------------------------------


def test_parse_valid_commands():
    cmd = parse_command("/setblock 0 4 0 red_wool")
    assert isinstance(cmd, Command) and cmd.cells() == [(0, 4, 0)] and cmd.block == "red_wool"
    fill = parse_command("/fill 4 0 0 0 0 0 minecraft:Blue_Wool replace")  # corners in any order, namespace, mode
    assert fill.block == "blue_wool" and len(fill.cells()) == 5 and fill.lo == (0, 0, 0) and fill.hi == (4, 0, 0)
    assert parse_command("- `/setblock 1 2 0 air`").block == "air"  # markdown bullet and backticks


@pytest.mark.parametrize(
    "line, reason",
    [
        ("/setblock 1 2 red_wool", "syntax: expected /setblock x y z block"),
        ("/setblock a 2 0 red_wool", "coordinates must be integers"),
        ("/fill 0 0 0 1 1 red_wool", "syntax: expected /fill"),
        ("/build 0 0 0 red_wool", "unknown command"),
        ("/setblock 0 0 0 red-wool!", "is not a block name"),
    ],
)
def test_parse_syntax_errors(line, reason):
    out = parse_command(line)
    assert isinstance(out, str) and reason in out


def test_read_turn_rejects_with_reasons():
    target = string_target("I")
    world = World(target.size)
    text = "\n".join(
        [
            "Here is my plan:",  # talk: ignored, not a rejection
            "/setblock 0 4 0 red_wool",  # ok
            "/setblock 30 0 0 red_wool",  # out of bounds (x 0..4)
            "/setblock 1 4 0 yellow_wool",  # builder_b's colour
            "/setblok 1 4 0 red_wool",  # typo
            "/setblock 2 3 0 blue_wool",  # 5th command line > budget 4
        ]
    )
    plan = read_turn(text, STR_PALETTES["builder_a"], world, turn_budget=4)
    assert [c.text for c in plan.accepted] == ["/setblock 0 4 0 red_wool"]
    assert plan.ignored == 1
    got = {r.line: r.reason for r in plan.rejections}
    assert set(got) == {3, 4, 5, 6}
    assert got[3].startswith("out of bounds: (30, 0, 0) is outside x 0..4, y 0..4, z 0..0")
    assert "'yellow_wool' is not in your palette (red_wool, blue_wool" in got[4]
    assert got[5].startswith("unknown command '/setblok'")
    assert got[6] == "over the per-turn budget of 4 commands"
    assert plan.edits == {(0, 4, 0): "red_wool"}


def test_block_allowance_and_free_replacement():
    target = string_target("I")
    world = world_of(target, [((0, 4, 0), "red_wool", "builder_a")])
    text = "/fill 0 4 0 4 4 0 red_wool\n/setblock 2 3 0 blue_wool\n/setblock 2 2 0 red_wool"
    plan = read_turn(text, STR_PALETTES["builder_a"], world, turn_budget=None, blocks_left=5)
    # The fill changes 4 cells (0,4,0 already holds red wool: free), leaving 1 block; 2,3,0 takes it; 2,2,0 is over.
    assert len(plan.accepted) == 2 and sum(plan.charged.values()) == 5
    assert (
        len(plan.rejections) == 1 and "over your block allowance: needs 1 blocks, 0 left" in plan.rejections[0].reason
    )


def test_contested_cells_are_left_unchanged_and_refunded():
    target = string_target("I")
    world = World(target.size)
    plans = {
        "builder_a": read_turn("/setblock 0 4 0 red_wool\n/setblock 1 4 0 blue_wool", ["red_wool", "blue_wool"], world),
        "builder_b": read_turn("/fill 0 4 0 0 3 0 yellow_wool", ["yellow_wool", "green_wool"], world),
    }
    contested = apply_turn(world, plans)
    assert contested == {(0, 4, 0): ["builder_a", "builder_b"]}
    assert world.block((0, 4, 0)) is None  # nobody wins the contested cell
    assert world.block((1, 4, 0)) == "blue_wool" and world.block((0, 3, 0)) == "yellow_wool"
    assert sum(plans["builder_a"].charged.values()) == 1 and sum(plans["builder_b"].charged.values()) == 1


# ---------------------------------------------------------------------------------------------------------------
# font and targets
# ---------------------------------------------------------------------------------------------------------------


def test_font_glyphs_are_5x5_and_targets_render():
    assert {"I", "C", "M", "L"} <= set(FONT)
    for letter, rows in FONT.items():
        assert len(rows) == 5 and all(len(r) == 5 and set(r) <= {"#", "."} for r in rows), letter
        assert any("#" in r for r in rows)
    for text in STR_TARGETS:
        t = string_target(text)
        assert t.size == (6 * len(text) - 1, 5, 1)
        assert len(t.cells) == sum(r.count("#") for ch in text for r in FONT[ch])
        rendered = target_text(t, block_legend([])).splitlines()
        grid = [line[5:] for line in rendered if line.startswith("y=")]
        assert len(grid) == 5 and grid[0] == " ".join(FONT[ch][0] for ch in text).replace(" ", ".")
    assert sorted(string_target("I").cells) == sorted(I_CELLS)
    assert len(string_target("I").neighbour_pairs()) == I_PAIRS
    with pytest.raises(ValueError, match="font lacks"):
        string_target("IQ")


def test_house_blueprints_have_floor_door_and_roof():
    for name in HOUSE_TARGETS:
        t = house_target(name)
        layers = BLUEPRINTS[name]
        assert all(ch == "S" for ch in "".join(layers[0]))  # stone floor
        assert all(ch == "B" for ch in "".join(layers[-1]))  # brick roof
        assert all("." in "".join(layer) for layer in layers[1:-1])  # walls have a door gap / inside
        assert set(t.materials()) == {"stone", "glass", "oak_planks", "bricks"}
        assert all(t.size[i] == t.extent[i] + 2 for i in (0, 2))  # a free margin around the footprint


def test_colour_constraint_satisfiable_by_the_two_palettes():
    for text in STR_TARGETS:
        row = {"target": text, "kind": "str"}
        world = oracle_world(row)
        target = make_target(row)
        comp = score_world(world, target, STR_PALETTES)
        assert comp["details"]["same_colour"] == [] and comp["adjacency"] == 0.0, text
        assert comp["unused"] == 0.0 and comp["coverage"] == 1.0 and comp["score"] == pytest.approx(2.0)
        # Each builder placed only its own colours.
        assert all(b in STR_PALETTES[owner] for b, owner in world.cells.values())


# ---------------------------------------------------------------------------------------------------------------
# reward components on hand-made worlds (expected numbers by hand)
# ---------------------------------------------------------------------------------------------------------------


def _checkerboard_i(a_colours=("red_wool", "blue_wool"), b_colours=("yellow_wool", "green_wool")):
    """Perfect 'I': cells with even x+y to builder_a, odd to builder_b (even cells never touch each other), each
    cycling through the given colours."""
    placements, na, nb = [], 0, 0
    for c in sorted(I_CELLS):
        if (c[0] + c[1]) % 2 == 0:
            placements.append((c, a_colours[na % len(a_colours)], "builder_a"))
            na += 1
        else:
            placements.append((c, b_colours[nb % len(b_colours)], "builder_b"))
            nb += 1
    return placements


def test_reward_perfect_build_scores_the_maximum():
    target = string_target("I")
    comp = score_world(world_of(target, _checkerboard_i()), target, STR_PALETTES)
    assert (comp["coverage"], comp["extra"], comp["adjacency"], comp["unused"]) == (1.0, 0.0, 0.0, 0.0)
    assert comp["score"] == 2.0 == get_task("building-str").max_reward
    assert comp["iou_pct"] == 100.0 and comp["adj_pct"] == 0.0


def test_reward_empty_world():
    target = string_target("I")
    comp = score_world(World(target.size), target, STR_PALETTES)
    assert comp["coverage"] == 0.0 and comp["iou"] == 0.0 and comp["extra"] == 0.0
    assert comp["unused"] == 1.0  # 4 of 4 palette colours missing
    assert comp["score"] == pytest.approx(-0.25)  # 2*0 - 1.5*0 - 1*0 - 0.25*1


def test_reward_extra_block():
    target = string_target("I")
    world = world_of(target, _checkerboard_i() + [((0, 2, 0), "red_wool", "builder_a")])
    comp = score_world(world, target, STR_PALETTES)
    assert comp["extra"] == pytest.approx(1 / 13) and comp["details"]["extra"] == [(0, 2, 0)]
    assert comp["iou"] == pytest.approx(13 / 14)
    assert comp["score"] == pytest.approx(2.0 - 1.5 / 13)  # 1.8846


def test_reward_same_colour_pair():
    target = string_target("I")
    world = world_of(target, [((0, 4, 0), "red_wool", "builder_a"), ((1, 4, 0), "red_wool", "builder_a")])
    comp = score_world(world, target, STR_PALETTES)
    assert comp["coverage"] == pytest.approx(2 / 13)
    assert comp["adjacency"] == pytest.approx(1 / 12) and comp["adj_pct"] == pytest.approx(100 / 12)
    assert comp["details"]["same_colour"] == [((0, 4, 0), (1, 4, 0))]
    assert comp["unused"] == pytest.approx(3 / 4)  # blue, yellow, green not in the world
    assert comp["score"] == pytest.approx(2 * 2 / 13 - 1 / 12 - 0.25 * 3 / 4)  # 0.0368


def test_reward_unused_palette():
    target = string_target("I")
    world = world_of(target, _checkerboard_i(a_colours=("red_wool",)))  # builder_a never uses blue
    comp = score_world(world, target, STR_PALETTES)
    assert comp["adjacency"] == 0.0 and comp["coverage"] == 1.0
    assert comp["details"]["unused"] == [("builder_a", "blue_wool")]
    assert comp["score"] == pytest.approx(2.0 - 0.25 * 1 / 4)  # 1.9375
    # A blue block parked outside the target does not count as using blue; it is just an extra block.
    world.place((0, 2, 0), "blue_wool", "builder_a")
    comp = score_world(world, target, STR_PALETTES)
    assert comp["unused"] == pytest.approx(1 / 4) and comp["extra"] == pytest.approx(1 / 13)
    assert comp["score"] == pytest.approx(2.0 - 1.5 / 13 - 0.25 * 1 / 4)  # 1.8221


def test_reward_house_wrong_material_and_weights():
    row = {"target": "cottage", "kind": "house"}
    target = make_target(row)
    assert len(target.cells) == 25 + 15 + 15 + 25  # floor, two wall layers (door gap, windows), roof
    world = oracle_world(row)
    assert score_world(world, target, HOUSE_PALETTES)["score"] == pytest.approx(2.0)
    world.place((1, 0, 1), "glass", "builder_a")  # a floor cell in the wrong material
    comp = score_world(world, target, HOUSE_PALETTES)
    assert comp["coverage"] == pytest.approx(79 / 80) and comp["iou"] == 1.0 and comp["adjacency"] == 0.0
    assert comp["details"]["wrong"] == [((1, 0, 1), "glass", "stone")]
    assert comp["score"] == pytest.approx(2 * 79 / 80)
    w = Weights(coverage=1.0, unused=0.0)
    assert score_world(World(target.size), target, HOUSE_PALETTES, w)["score"] == 0.0


# ---------------------------------------------------------------------------------------------------------------
# env: feedback, dense / sparse rewards, oracle episodes
# ---------------------------------------------------------------------------------------------------------------


def test_observations_and_feedback_text():
    env = get_task("building-str").make_env()
    obs = env.reset(I_ROW)
    assert len(obs) == 2 and env.agent_names == AGENT_NAMES
    assert "You are builder_a" in obs[0] and "You are builder_b" in obs[1]
    assert "Your palette: red_wool, blue_wool" in obs[0] and "Your palette: yellow_wool, green_wool" in obs[1]
    assert "y=4  #####" in obs[0] and "at most 10 commands per turn" in obs[0] and "Turn 1 of 4" in obs[0]
    a = "/setblock 0 4 0 red_wool\n/setblock 1 4 0 red_wool\n/setblock 0 2 0 blue_wool\n/setblock 9 9 0 red_wool"
    r = env.step([a, "/setblock 2 4 0 yellow_wool"])
    assert not r.done and r.info["rejected"] == {"builder_a": 1, "builder_b": 0}
    fa, fb = r.observations
    assert 'rejected line 4 "/setblock 9 9 0 red_wool": out of bounds' in fa
    assert "rejected line" not in fb and "builder_a: 3 commands applied, 1 rejected." in fb
    for text in (fa, fb):
        assert "Missing (10 of 13 target cells): (0,0,0) (1,0,0)" in text
        assert "Extra blocks outside the target (remove with air) (1): (0,2,0) blue_wool [builder_a]" in text
        assert "Same-colour neighbours (1): (0,4,0)-(1,4,0) red_wool" in text
        assert "y=4  RRY.." in text and "Turn 2 of 4" in text
    # builder_a's blue block lies outside the target, so blue still counts as unused (no buying off the penalty).
    assert "Unused palette: you have no green_wool in the target" in fb
    assert "Unused palette: you have no blue_wool in the target" in fa
    # Dense reward of the first turn = score of the state (the empty world counts as 0).
    expected = 2 * 3 / 13 - 1.5 / 13 - 1 / 12 - 0.25 * 2 / 4
    assert r.reward == pytest.approx(expected) and r.info["score"] == pytest.approx(expected)


@pytest.mark.parametrize("name, targets", [("building-str", STR_TARGETS), ("building-house", HOUSE_TARGETS)])
def test_oracle_team_reaches_the_maximum_return(name, targets):
    task = get_task(name)
    ds = task.load_dataset("eval")
    assert ds["target"] == [t.upper() if name == "building-str" else t for t in targets]
    for row in ds:
        env = task.make_env()
        rewards, last = run_oracle(env, row)
        assert len(rewards) == 4 and last.done and last.observations is None
        assert sum(rewards) == pytest.approx(task.max_reward), row  # dense rewards telescope to the final score
        assert last.info["perfect"] and last.info["iou_pct"] == 100.0 and last.info["adj_pct"] == 0.0
        assert all(v == 0 for v in last.info["rejected"].values()) and last.info["contested"] == 0
        assert all(r > 0 for r in rewards)  # every turn of the plan makes progress
    # Sparse rewards: 0 until the last turn, then the final score.
    env = task.make_env(sparse=True)
    rewards, _ = run_oracle(env, ds[0])
    assert rewards[:-1] == [0.0, 0.0, 0.0] and rewards[-1] == pytest.approx(task.max_reward)


def test_house_allowance_is_reported_and_enforced():
    env = get_task("building-house").make_env()
    obs = env.reset({"target": "hut", "kind": "house"})
    # hut: builder_a places 16 floor + 4 corner stones + 2 glass = 22 -> ceil(1.25 * 22) = 28.
    assert env.allowance == {"builder_a": 28, "builder_b": math.ceil(1.25 * 21)}
    assert "28 of 28 blocks left for the episode" in obs[0]
    r = env.step(["/fill 0 0 0 5 0 5 stone", "/fill 1 2 1 4 2 4 bricks"])  # a 6x6 floor is 36 > 28 blocks
    assert "over your block allowance: needs 36 blocks, 28 left" in r.observations[0]
    assert env.blocks_left == {"builder_a": 28, "builder_b": 27 - 16}
    assert "Missing (" in r.observations[0] and "(1,0,1)" in r.observations[0]


def test_end_on_perfect_and_agent_checks():
    env = BuildingEnv("str", end_on_perfect=True)
    row = {"target": "L", "kind": "str"}
    env.reset(row)
    plans = {a: "\n".join(oracle_commands(row, a, num_turns=1)) for a in env.agent_names}
    r = env.step([plans[a] for a in env.agent_names])
    assert r.done and r.reward == pytest.approx(2.0)
    with pytest.raises(ValueError, match="palettes are for"):
        BuildingEnv("str").reset({"target": "I", "kind": "str", "palettes": {"x": ["red_wool"], "y": ["blue_wool"]}})
    with pytest.raises(ValueError, match="no agent's palette holds"):
        BuildingEnv("house", palettes={"builder_a": ["stone"], "builder_b": ["bricks"]}).reset(
            {"target": "hut", "kind": "house"}
        )


def test_dataset_options():
    task = get_task("building-str")
    assert task.agent_names == AGENT_NAMES and task.num_turns == 4
    assert task.load_dataset("train", limit=3)["target"] == ["I", "C", "M"]
    assert task.load_dataset("train", source="icml, mc")["target"] == ["ICML", "MC"]
    assert task.load_dataset("train")[0] == {"target": "I", "kind": "str"}
    with pytest.raises(ValueError, match="unknown split"):
        task.load_dataset("dev")
    with pytest.raises(ValueError, match="unknown house blueprint"):
        get_task("building-house").load_dataset("train", source=["castle"])


# ---------------------------------------------------------------------------------------------------------------
# rendering
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("row", [{"target": "ICML", "kind": "str"}, {"target": "cottage", "kind": "house"}])
def test_render_png_writes_a_valid_png(tmp_path, row):
    world = oracle_world(row)
    world.cells.pop(sorted(world.cells)[0])  # one missing cell, drawn dashed
    path = tmp_path / f"{row['target']}.png"
    out = render_png(world, path, target=make_target(row), title=row["target"])
    data = path.read_bytes()
    assert out == str(path) and data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 200 and height >= 150 and len(data) > 2000
    text = world_text(world, block_legend(STR_PALETTES["builder_a"] + STR_PALETTES["builder_b"]))
    assert text.count("\n") >= 5


# ---------------------------------------------------------------------------------------------------------------
# trainer mechanics (tiny offline model, 4 episodes x 4 turns)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("critic_type", ["centralized", "decentralized"])
def test_trainer_runs_on_strbuild(tmp_path, make_config, qwen_path, critic_type):
    from trl_collm import MultiAgentPPOTrainer

    task = get_task("building-str")
    ds = task.load_dataset("train", limit=4)  # I, C, M, L: the shortest prompts
    args = make_config(
        tmp_path,
        agent_names=list(task.agent_names),
        num_turns=task.num_turns,
        critic_type=critic_type,
        total_episodes=4,
        per_device_train_batch_size=4,
        response_length=8,
        num_ppo_epochs=1,
    )
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=ds, env=task.make_env())
    out = tr.train()
    assert out.global_step == 1
    m = out.metrics
    assert m["objective/turns"] == pytest.approx(4.0)
    for key in ["loss/policy_avg", "loss/value_avg", "builder_a/objective/scores", "builder_b/objective/scores"]:
        assert key in m and math.isfinite(m[key]), key
    # Random text places (almost) nothing: the return is near the empty world's -0.25, never above the maximum.
    assert -3.5 <= m["builder_a/objective/scores"] <= task.max_reward
