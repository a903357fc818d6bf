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

Modules: ``scoring.py`` (constants, targets, palettes, allowances, the score), ``commands.py`` (parsing and applying
a turn's commands), ``env.py`` (``BuildingEnv``: episodes and feedback), ``datasets.py`` (target lists and the task
registration); the world, font, blueprints and rendering are in ``tasks/voxel.py``. The oracle (a perfect team,
for the warm start and the tests) is ``oracle.py``.
"""

from ..voxel import BLUEPRINTS, FONT, render_png
from .commands import Command, Rejection, apply_turn, parse_command, read_turn
from .datasets import load_house_dataset, load_str_dataset
from .env import BuildingEnv
from .scoring import (
    AGENT_NAMES,
    HOUSE_PALETTES,
    HOUSE_TARGETS,
    STR_PALETTES,
    STR_TARGETS,
    Weights,
    make_target,
    score_world,
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
    "load_str_dataset",
    "load_house_dataset",
    "render_png",
    "FONT",
    "BLUEPRINTS",
]
