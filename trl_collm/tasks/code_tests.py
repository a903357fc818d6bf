"""Which of a HumanEval problem's tests the agents may read (``shown``) and which decide the reward (``scored``).

Why: turn 2's feedback quotes failing asserts, and an assert carries its input and its expected value. Scored on the
same asserts, a policy can pass them by reading the answers off the feedback: a turn-2 program that is only a lookup
table of the values turn 1's feedback quoted took HumanEval/35 from 0/2 tests to 2/2 without solving anything. So the
tests are split as EvalPlus and held-out practice split them: a few *shown* tests, whose failures the feedback quotes
in full (the paper's turn-2 form), and the *scored* tests, disjoint from them, which alone decide the reward and
which the feedback never quotes (only how many passed, and for a problem too small to split, which one failed).

The split, deterministic and independent of the solution:

* the test units are ``split_tests``'s (each assert-bearing statement of ``check`` with its setup lines);
* units that call the function under test with the same arguments are one group, so that no scored test has an
  input that a shown test quotes (``assert f(3.5) == 0.5`` and ``assert abs(f(3.5) - 0.5) < 1e-6`` go together);
* ``k = max(1, groups // 3)`` groups are shown, spaced evenly through ``check`` from its first (groups
  ``j * groups // k``), the rest scored: at most a third of the tests is spent on feedback, and spreading them keeps
  both sides alike (HumanEval/56 lists its True cases first: shown as a block, they left the scored side all False,
  which a constant ``False`` passes);
* a problem with fewer than 2 groups (HumanEval/32's one random loop, /34's single assert) cannot be split: all
  its tests are scored, and the feedback names a failing test by its number only.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ..sandbox import split_tests

__all__ = ["TestSplit", "split_shown_scored"]


@dataclass(frozen=True)
class TestSplit:
    """Indices into ``split_tests(test, entry_point)[1]`` (the order of ``TestReport.outcomes``)."""

    __test__ = False  # not a pytest test class

    shown: tuple[int, ...]  # feedback may quote these (assert text and the value obtained); they score nothing
    scored: tuple[int, ...]  # these decide the reward; feedback never quotes them

    @property
    def is_split(self) -> bool:
        return bool(self.shown)


def _call_keys(unit: str, names: set[str]) -> set[str]:
    """The argument lists with which ``unit`` calls the function under test: literal values compare by value
    (``f(3.5)`` and ``f(3.50)`` are one input), anything else by its source."""
    keys = set()
    for node in ast.walk(ast.parse(unit)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
            try:
                args = tuple(ast.literal_eval(a) for a in node.args)
                kwargs = sorted((k.arg, ast.literal_eval(k.value)) for k in node.keywords)
                keys.add(repr((args, kwargs)))
            except (ValueError, TypeError, SyntaxError, RecursionError):
                keys.add(ast.dump(ast.Call(func=ast.Name("f"), args=node.args, keywords=node.keywords)))
    return keys


def _groups(units: list[str], names: set[str]) -> list[list[int]]:
    """Units joined when they share an input (transitively), each group in the order of its first unit."""
    owner: dict[str, int] = {}  # input key -> group id
    groups: dict[int, list[int]] = {}
    for i, unit in enumerate(units):
        keys = _call_keys(unit, names)
        hit = sorted({owner[k] for k in keys if k in owner})
        gid = hit[0] if hit else i
        merged = [i]
        for other in hit:
            merged.extend(groups.pop(other))
        groups[gid] = sorted(merged)
        for k, g in list(owner.items()):
            if g in hit:
                owner[k] = gid
        for k in keys:
            owner[k] = gid
    return sorted(groups.values(), key=lambda g: g[0])


def split_shown_scored(test: str, entry_point: str) -> TestSplit:
    """The shown / scored split of a problem's test program (a HumanEval ``check``); see the module docstring."""
    _, units, names = split_tests(test, entry_point)
    groups = _groups(units, set(names))
    if len(groups) < 2:
        return TestSplit(shown=(), scored=tuple(range(len(units))))
    k = max(1, len(groups) // 3)
    picked = {j * len(groups) // k for j in range(k)}
    shown = tuple(sorted(i for n, g in enumerate(groups) if n in picked for i in g))
    scored = tuple(sorted(i for n, g in enumerate(groups) if n not in picked for i in g))
    return TestSplit(shown=shown, scored=scored)
