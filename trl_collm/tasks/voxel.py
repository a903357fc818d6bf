"""The simulated voxel world behind the building tasks: world state, 5x5 pixel font, house blueprints, rendering.

Nothing here talks to a game server: a world is a dict of occupied cells, small enough to deep-copy per episode.
Coordinates are Minecraft-like: x grows to the right, y grows upwards (layers), z grows towards the viewer.
The ``building/`` package holds the rules (commands, reward, feedback) on top of this module.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

Cell = tuple[int, int, int]

AIR = "air"

# Face-sharing neighbours. Diagonals do not count: a pixel letter drawn with alternating colours along its strokes
# is exactly a proper colouring of this graph, which is what the StrBuild rule asks for.
NEIGHBOUR_OFFSETS = ((1, 0, 0), (0, 1, 0), (0, 0, 1))

# ----------------------------------------------------------------------------------------------------------------
# Blocks: a display character (text) and a colour (PNG)
# ----------------------------------------------------------------------------------------------------------------

# Preferred one-letter codes; a block not listed (or whose letter is taken in the same legend) gets a fallback.
PREFERRED_CHARS = {
    "red_wool": "R",
    "blue_wool": "B",
    "yellow_wool": "Y",
    "green_wool": "G",
    "white_wool": "W",
    "black_wool": "K",
    "orange_wool": "O",
    "purple_wool": "U",
    "stone": "S",
    "oak_planks": "P",
    "glass": "G",
    "bricks": "B",
    "cobblestone": "C",
}

BLOCK_COLOURS = {
    "red_wool": "#c62828",
    "blue_wool": "#1e4fd8",
    "yellow_wool": "#f9d71c",
    "green_wool": "#3a9d23",
    "white_wool": "#f2f2f2",
    "black_wool": "#202020",
    "orange_wool": "#f07613",
    "purple_wool": "#7b2fbe",
    "stone": "#8a8a8a",
    "oak_planks": "#b8945f",
    "glass": "#bfe8f2",
    "bricks": "#97463a",
    "cobblestone": "#6f6f6f",
}

# '#' and '.' are reserved for "any block" / "empty" in target renderings, '?' for a block outside the legend.
_RESERVED_CHARS = {"#", ".", "?"}


def block_legend(blocks: Iterable[str]) -> dict[str, str]:
    """Deterministic block -> one character map (first come, first served on collisions)."""
    legend: dict[str, str] = {}
    used = set(_RESERVED_CHARS)
    for block in blocks:
        if block in legend or block == AIR:
            continue
        candidates = [PREFERRED_CHARS.get(block, "")] + [ch.upper() for ch in block if ch.isalpha()]
        candidates += [ch.lower() for ch in block if ch.isalpha()] + list("0123456789")
        for ch in candidates:
            if ch and ch not in used:
                legend[block] = ch
                used.add(ch)
                break
        else:  # pragma: no cover - more than ~60 distinct blocks in one legend
            legend[block] = "?"
    return legend


def legend_line(legend: Mapping[str, str]) -> str:
    return ", ".join(f"{ch}={block}" for block, ch in legend.items())


# ----------------------------------------------------------------------------------------------------------------
# World
# ----------------------------------------------------------------------------------------------------------------


class World:
    """Occupied cells of a bounded box: ``cells[(x, y, z)] = (block, owner)``; air is the absence of an entry.

    The owner (the agent that placed the block) is kept so that "has builder_a used its blue wool?" is a question
    about the current state, which keeps the reward a function of the world alone.
    """

    def __init__(self, size: tuple[int, int, int]):
        if len(size) != 3 or any(int(s) < 1 for s in size):
            raise ValueError(f"World size must be three positive ints (x, y, z), got {size!r}")
        self.size = tuple(int(s) for s in size)
        self.cells: dict[Cell, tuple[str, str | None]] = {}

    def in_bounds(self, cell: Cell) -> bool:
        return all(0 <= c < s for c, s in zip(cell, self.size))

    def block(self, cell: Cell) -> str | None:
        entry = self.cells.get(cell)
        return entry[0] if entry else None

    def owner(self, cell: Cell) -> str | None:
        entry = self.cells.get(cell)
        return entry[1] if entry else None

    def place(self, cell: Cell, block: str, owner: str | None = None) -> None:
        if not self.in_bounds(cell):
            raise ValueError(f"cell {cell} is outside the world {self.size}")
        if block == AIR:
            self.cells.pop(cell, None)
        else:
            self.cells[cell] = (block, owner)

    def copy(self) -> World:
        other = World(self.size)
        other.cells = dict(self.cells)
        return other

    def __len__(self) -> int:
        return len(self.cells)

    def __repr__(self) -> str:
        return f"World(size={self.size}, blocks={len(self.cells)})"


# ----------------------------------------------------------------------------------------------------------------
# Targets
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class Target:
    """What to build. ``cells[c]`` is the block the cell must hold, or None when any palette block will do."""

    name: str
    kind: str  # "str" | "house"
    size: tuple[int, int, int]  # the world's bounds for this target
    cells: dict[Cell, str | None]
    distinct_neighbours: bool  # StrBuild rule: face-sharing target cells must hold different blocks
    description: str = ""
    origin: tuple[int, int, int] = (0, 0, 0)  # min corner of the structure (for messages)
    extent: tuple[int, int, int] = (1, 1, 1)  # its size
    _pairs: list = field(default=None, repr=False, compare=False)

    def neighbour_pairs(self) -> list[tuple[Cell, Cell]]:
        """Face-sharing pairs of target cells, each once (the denominator of Adj %)."""
        if self._pairs is None:
            pairs = []
            for c in sorted(self.cells):
                for d in NEIGHBOUR_OFFSETS:
                    n = (c[0] + d[0], c[1] + d[1], c[2] + d[2])
                    if n in self.cells:
                        pairs.append((c, n))
            self._pairs = pairs
        return self._pairs

    def materials(self) -> list[str]:
        """Blocks the blueprint names (empty for StrBuild, where colours are free)."""
        return sorted({b for b in self.cells.values() if b is not None})


# ----------------------------------------------------------------------------------------------------------------
# 5x5 pixel font (rows top to bottom; '#' = pixel)
# ----------------------------------------------------------------------------------------------------------------

FONT: dict[str, tuple[str, ...]] = {
    "I": ("#####", "..#..", "..#..", "..#..", "#####"),
    "C": (".####", "#....", "#....", "#....", ".####"),
    "M": ("#...#", "##.##", "#.#.#", "#...#", "#...#"),
    "L": ("#....", "#....", "#....", "#....", "#####"),
    "A": (".###.", "#...#", "#####", "#...#", "#...#"),
    "E": ("#####", "#....", "####.", "#....", "#####"),
    "H": ("#...#", "#...#", "#####", "#...#", "#...#"),
    "N": ("#...#", "##..#", "#.#.#", "#..##", "#...#"),
    "O": (".###.", "#...#", "#...#", "#...#", ".###."),
    "T": ("#####", "..#..", "..#..", "..#..", "..#.."),
    "U": ("#...#", "#...#", "#...#", "#...#", ".###."),
    "X": ("#...#", ".#.#.", "..#..", ".#.#.", "#...#"),
}
GLYPH = 5  # glyph width and height
GAP = 1  # empty columns between letters


def string_target(text: str, font: Mapping[str, tuple[str, ...]] = FONT) -> Target:
    """Letters side by side in the vertical plane z=0; the world is exactly the text's bounding box."""
    text = str(text).strip().upper()
    if not text:
        raise ValueError("StrBuild target is empty; give a string such as 'ICML'")
    missing = sorted({ch for ch in text if ch not in font})
    if missing:
        raise ValueError(
            f"StrBuild target {text!r} uses letters {missing} that the font lacks; it has {''.join(sorted(font))}"
        )
    cells: dict[Cell, str | None] = {}
    for i, ch in enumerate(text):
        x0 = i * (GLYPH + GAP)
        for r, row in enumerate(font[ch]):
            for col, pixel in enumerate(row):
                if pixel == "#":
                    cells[(x0 + col, GLYPH - 1 - r, 0)] = None  # row 0 is the top, y=4
    width = len(text) * (GLYPH + GAP) - GAP
    size = (width, GLYPH, 1)
    return Target(
        name=text,
        kind="str",
        size=size,
        cells=cells,
        distinct_neighbours=True,
        description=(
            f'the letters "{text}" in the vertical plane z=0 (x = 0..{width - 1} left to right, y = '
            f"0..{GLYPH - 1} bottom to top)"
        ),
        origin=(0, 0, 0),
        extent=size,
    )


# ----------------------------------------------------------------------------------------------------------------
# House blueprints: layers bottom (y=0) to top; each layer lists rows z=0.. (back to front), columns x=0..
# ----------------------------------------------------------------------------------------------------------------

BLUEPRINT_LEGEND = {"S": "stone", "P": "oak_planks", "G": "glass", "B": "bricks", ".": None}

BLUEPRINTS: dict[str, tuple[tuple[str, ...], ...]] = {
    # 5x5 footprint, 4 layers: stone floor, stone corner pillars, plank walls with a 2-high door at the front
    # (x=2, z=4), three glass windows, brick roof.
    "cottage": (
        ("SSSSS", "SSSSS", "SSSSS", "SSSSS", "SSSSS"),
        ("SPPPS", "P...P", "P...P", "P...P", "SP.PS"),
        ("SPGPS", "P...P", "G...G", "P...P", "SP.PS"),
        ("BBBBB", "BBBBB", "BBBBB", "BBBBB", "BBBBB"),
    ),
    # 4x4 footprint, 3 layers: floor, one wall layer with a door (x=2, z=3) and two windows, roof.
    "hut": (
        ("SSSS", "SSSS", "SSSS", "SSSS"),
        ("SGPS", "P..P", "P..G", "SP.S"),
        ("BBBB", "BBBB", "BBBB", "BBBB"),
    ),
    # 3x3 footprint, 5 layers: a narrow tower with a 2-high door (x=1, z=2).
    "tower": (
        ("SSS", "SSS", "SSS"),
        ("SPS", "P.P", "S.S"),
        ("SGS", "G.P", "S.S"),
        ("SPS", "P.P", "SPS"),
        ("BBB", "BBB", "BBB"),
    ),
}
HOUSE_MARGIN = 1  # free cells around the footprint (x and z) and above the roof, so misplaced blocks are possible


def house_target(name: str, blueprints: Mapping[str, tuple] = BLUEPRINTS) -> Target:
    if name not in blueprints:
        raise ValueError(f"unknown house blueprint {name!r}; choose one of {sorted(blueprints)}")
    layers = blueprints[name]
    depth, width = len(layers[0]), len(layers[0][0])
    for y, layer in enumerate(layers):
        if len(layer) != depth or any(len(row) != width for row in layer):
            raise ValueError(f"blueprint {name!r}: layer {y} is not {width}x{depth}")
    m = HOUSE_MARGIN
    cells: dict[Cell, str | None] = {}
    for y, layer in enumerate(layers):
        for z, row in enumerate(layer):
            for x, ch in enumerate(row):
                if ch not in BLUEPRINT_LEGEND:
                    raise ValueError(
                        f"blueprint {name!r}: unknown character {ch!r} (legend {sorted(BLUEPRINT_LEGEND)})"
                    )
                if BLUEPRINT_LEGEND[ch] is not None:
                    cells[(x + m, y, z + m)] = BLUEPRINT_LEGEND[ch]
    size = (width + 2 * m, len(layers) + m, depth + 2 * m)
    return Target(
        name=name,
        kind="house",
        size=size,
        cells=cells,
        distinct_neighbours=False,
        description=(
            f"the house blueprint '{name}' ({width}x{depth} footprint, {len(layers)} layers) at "
            f"x = {m}..{m + width - 1}, z = {m}..{m + depth - 1}, y = 0..{len(layers) - 1} (y is up)"
        ),
        origin=(m, 0, m),
        extent=(width, len(layers), depth),
    )


# ----------------------------------------------------------------------------------------------------------------
# Text rendering
# ----------------------------------------------------------------------------------------------------------------


def _x_header(width: int, indent: str) -> list[str]:
    lines = []
    if width > 10:
        lines.append(indent + "".join(str(x // 10) if x % 10 == 0 else " " for x in range(width)))
    lines.append(indent + "".join(str(x % 10) for x in range(width)))
    return lines


def _grid_text(size, char_at, plane: bool) -> str:
    """Plane (depth 1): rows y top to bottom. Otherwise one grid per layer y (bottom first), rows z, columns x."""
    w, h, d = size
    out = []
    if plane:
        out += _x_header(w, "x    ")
        for y in range(h - 1, -1, -1):
            out.append(f"y={y:<2} " + "".join(char_at((x, y, 0)) for x in range(w)))
        return "\n".join(out)
    for y in range(h):
        rows = ["".join(char_at((x, y, z)) for x in range(w)) for z in range(d)]
        if all(set(r) == {"."} for r in rows):  # an empty layer costs one line of prompt, not a whole grid
            out.append(f"layer y={y}: empty")
            continue
        out.append(f"layer y={y}:")
        out += _x_header(w, "  x    ")
        out += [f"  z={z:<2} {r}" for z, r in enumerate(rows)]
    return "\n".join(out)


def target_text(target: Target, legend: Mapping[str, str]) -> str:
    """'#' = any block (StrBuild), a material letter (house), '.' = must stay empty."""

    def char_at(c):
        if c not in target.cells:
            return "."
        block = target.cells[c]
        return "#" if block is None else legend.get(block, "?")

    return _grid_text(target.size, char_at, plane=target.size[2] == 1)


def world_text(world: World, legend: Mapping[str, str]) -> str:
    def char_at(c):
        block = world.block(c)
        return "." if block is None else legend.get(block, "?")

    return _grid_text(world.size, char_at, plane=world.size[2] == 1)


# ----------------------------------------------------------------------------------------------------------------
# PNG rendering (for people)
# ----------------------------------------------------------------------------------------------------------------


def _colour(block: str) -> str:
    if block in BLOCK_COLOURS:
        return BLOCK_COLOURS[block]
    # Unknown block: a stable colour from its name, so the same block always looks the same.
    h = sum((i + 1) * ord(ch) for i, ch in enumerate(block)) % 360
    import colorsys

    r, g, b = colorsys.hls_to_rgb(h / 360.0, 0.5, 0.6)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def render_png(world: World, path, target: Target | None = None, title: str | None = None, dpi: int = 100) -> str:
    """Save a picture of the world: one grid per layer (a single front view for a plane), plus an isometric voxel
    view for 3-D worlds. With ``target``, missing target cells are drawn as dashed outlines and blocks outside
    the target get a red border. Returns the path."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    w, h, d = world.size
    plane = d == 1
    target_cells = target.cells if target is not None else {}
    if plane:
        layers = [None]
    else:  # a layer with neither blocks nor target cells (the headroom above a roof) is not worth a panel
        busy = {c[1] for c in world.cells} | {c[1] for c in target_cells}
        layers = [y for y in range(h) if y in busy] or [0]
    iso = not plane
    ncols = len(layers) + (1 if iso else 0)
    panel_w = max(2.4, 0.32 * w) if plane else max(2.2, 0.45 * w)
    panel_h = max(2.2, 0.32 * h) if plane else max(2.2, 0.45 * d)
    blocks = sorted({b for b, _ in world.cells.values()} | {b for b in target_cells.values() if b})
    labels = blocks + (["missing target cell", "extra block"] if target is not None else [])
    # A one-letter target makes narrow panels: size the figure for its title and legend too, so neither is cut off.
    # Widths in inches from the font sizes (10 pt title, 7 pt legend: about 0.6 em per character).
    entry_w = [0.45 + 0.06 * len(label) for label in labels]
    width = max(panel_w * ncols + 0.5, 0.085 * len(title or "") + 0.4, max(entry_w, default=0) + 0.4)
    ncol = max(1, len(labels))
    while ncol > 1 and sum(sorted(entry_w, reverse=True)[:ncol]) > width - 0.4:
        ncol -= 1
    legend_rows = math.ceil(len(labels) / ncol) if labels else 0
    height = panel_h + 1.1 + 0.22 * legend_rows
    fig = plt.figure(figsize=(width, height), dpi=dpi)

    def draw_cell(ax, u, v, cell):
        block = world.block(cell)
        if block is not None:
            extra = target is not None and cell not in target_cells
            ax.add_patch(
                Rectangle(
                    (u, v),
                    1,
                    1,
                    facecolor=_colour(block),
                    edgecolor="red" if extra else "black",
                    linewidth=2.0 if extra else 0.5,
                )
            )
        elif cell in target_cells:
            want = target_cells[cell]
            ax.add_patch(
                Rectangle(
                    (u + 0.08, v + 0.08),
                    0.84,
                    0.84,
                    fill=False,
                    linestyle="--",
                    linewidth=0.8,
                    edgecolor=_colour(want) if want else "grey",
                )
            )

    for i, y in enumerate(layers):
        ax = fig.add_subplot(1, ncols, i + 1)
        if plane:
            for x in range(w):
                for yy in range(h):
                    draw_cell(ax, x, yy, (x, yy, 0))
            ax.set_xlim(0, w), ax.set_ylim(0, h)
            ax.set_xlabel("x"), ax.set_ylabel("y")
            ax.set_title("front view (z=0)", fontsize=9)
        else:
            # z grows towards the viewer, so it is drawn downwards, as in the text rendering.
            for x in range(w):
                for z in range(d):
                    draw_cell(ax, x, d - 1 - z, (x, y, z))
            ax.set_xlim(0, w), ax.set_ylim(0, d)
            ax.set_yticks([d - 1 - z + 0.5 for z in range(d)], [str(z) for z in range(d)])
            ax.set_xlabel("x"), ax.set_ylabel("z")
            ax.set_title(f"layer y={y}", fontsize=9)
        ax.set_aspect("equal")
        ax.set_xticks([x + 0.5 for x in range(w)], [str(x) for x in range(w)], fontsize=6)
        if plane:
            ax.set_yticks([v + 0.5 for v in range(h)], [str(v) for v in range(h)], fontsize=6)
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_linewidth(0.5)

    if iso:
        import numpy as np

        ax = fig.add_subplot(1, ncols, ncols, projection="3d")
        # matplotlib's voxel axes are (X, Y, Z) with Z up: map world (x, y, z) -> (x, z, y).
        filled = np.zeros((w, d, h), dtype=bool)
        colours = np.empty((w, d, h), dtype=object)
        for (x, y, z), (block, _) in world.cells.items():
            filled[x, z, y] = True
            colours[x, z, y] = _colour(block)
        if filled.any():
            ax.voxels(filled, facecolors=colours, edgecolor="k", linewidth=0.2)
        ax.set_xlim(0, w), ax.set_ylim(0, d), ax.set_zlim(0, h)
        ax.set_box_aspect((w, d, h))
        ax.set_xlabel("x", fontsize=7), ax.set_ylabel("z", fontsize=7), ax.set_zlabel("y", fontsize=7)
        ax.tick_params(labelsize=5)
        ax.view_init(elev=25, azim=-60)
        ax.set_title("isometric view", fontsize=9)

    handles = [Patch(facecolor=_colour(b), edgecolor="black", label=b) for b in blocks]
    if target is not None:
        handles.append(Patch(fill=False, linestyle="--", edgecolor="grey", label="missing target cell"))
        handles.append(Patch(facecolor="white", edgecolor="red", linewidth=2, label="extra block"))
    if handles:
        fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=7, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    bottom = (0.1 + 0.22 * legend_rows) / height
    fig.tight_layout(rect=(0, bottom, 1, 1 - 0.45 / height))
    # bbox_inches="tight": whatever the estimate above missed still lands inside the saved picture.
    fig.savefig(path, dpi=dpi, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    return str(path)
