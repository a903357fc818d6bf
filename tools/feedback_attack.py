"""The feedback attack on the code task: a turn-2 program built only from turn 1's feedback.

A policy under RL that reads ``- Failed: assert f(x) == y  # got z`` in its turn-2 prompt can answer with a lookup
table ``{x: y}`` instead of a solution. ``lookup_table_main`` builds that program from the feedback text alone (the
attacker knows nothing else); ``tests/test_feedback_attack.py`` checks that it scores no more than the honest turn-1
program, and this script counts, over all 164 HumanEval problems, how many problems such a table passes fully:

* ``before``: the rule of commit 8e522e7 (every test scored; the feedback quotes the first 3 failing asserts),
  replayed on the same sandbox report;
* ``after``: the code task as it is (``CodeEnv``'s own feedback; only the hidden tests score).

    PYTHONPATH=$PWD python tools/feedback_attack.py            # prints the counts and the problems
"""

from __future__ import annotations

import ast
import re
import sys

_QUOTED = re.compile(r"^- Failed: assert (.*?)(?:  # got .*)?$")


def _entry_call(node: ast.AST, entry_point: str):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == entry_point:
        return node
    return None


def _quoted_pair(expr: ast.AST, entry_point: str):
    """(args, expected) that a quoted assert gives away, or None: ``f(x) == y``, ``y == f(x)``,
    ``abs(f(x) - y) < eps``, ``f(x) is True``, ``f(x)`` and ``not f(x)``."""
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not) and _entry_call(expr.operand, entry_point):
        return expr.operand, ast.Constant(False)
    if _entry_call(expr, entry_point):
        return expr, ast.Constant(True)
    if not (isinstance(expr, ast.Compare) and len(expr.ops) == 1):
        return None
    left, right, op = expr.left, expr.comparators[0], expr.ops[0]
    if isinstance(op, (ast.Eq, ast.Is)):
        if _entry_call(left, entry_point):
            return left, right
        if _entry_call(right, entry_point):
            return right, left
    if (
        isinstance(op, ast.Lt)
        and isinstance(left, ast.Call)
        and isinstance(left.func, ast.Name)
        and left.func.id == "abs"
        and isinstance(left.args[0], ast.BinOp)
        and isinstance(left.args[0].op, ast.Sub)
        and _entry_call(left.args[0].left, entry_point)
    ):
        return left.args[0].left, left.args[0].right
    return None


def lookup_table(feedback: str, entry_point: str) -> dict[str, object]:
    """``repr(args) -> expected value`` for every quoted failing assert whose input and answer are literals."""
    table = {}
    for line in feedback.splitlines():
        match = _QUOTED.match(line.strip())
        if not match:
            continue
        try:
            pair = _quoted_pair(ast.parse(match.group(1), mode="eval").body, entry_point)
            if pair is None or pair[0].keywords:
                continue
            args = tuple(ast.literal_eval(a) for a in pair[0].args)
            table[repr(args)] = ast.literal_eval(pair[1])
        except (SyntaxError, ValueError, TypeError, IndexError, RecursionError):
            continue
    return table


def lookup_table_main(turn1_main: str, feedback: str, entry_point: str) -> str:
    """Turn 1's main code, wrapped: the quoted inputs get the quoted answers, anything else turn 1's answer. It keeps
    calling ``aux`` (a dead branch) so that the collaboration bonus is not what tells it apart."""
    table = lookup_table(feedback, entry_point)
    return (
        f"{turn1_main.rstrip()}\n\n"
        f"_LOOKUP = {table!r}\n"
        f"_TURN1 = {entry_point}\n\n"
        f"def {entry_point}(*args):\n"
        "    if not _LOOKUP:\n"
        "        aux()\n"
        "    key = repr(args)\n"
        "    if key in _LOOKUP:\n"
        "        return _LOOKUP[key]\n"
        "    return _TURN1(*args)\n"
    )


AUX = "def aux(*args):\n    return None\n"


def turn1_main(entry_point: str) -> str:
    """An honest turn 1 that solves nothing (it returns None), as a weak policy's first attempt would."""
    return f"def {entry_point}(*args):\n    aux(*args)\n    return None\n"


def _before_feedback(score, entry_point: str) -> str:
    """The feedback of 8e522e7: every test scored, the first 3 failing asserts quoted with the value obtained."""
    fails = [o for o in score.report.outcomes if not o.passed][:3]
    quoted = [re.sub(r"\bcandidate\b", entry_point, o.message) for o in fails]
    return "\n".join(f"- Failed: {q}" for q in quoted)


def main() -> int:
    from trl_collm.tasks.code import feedback_text, load_humaneval, score_attempt

    before, after, gains = [], [], []
    rows = list(load_humaneval("all"))
    for row in rows:
        entry = row["entry_point"]
        first = score_attempt(row, AUX, turn1_main(entry), per_test_timeout=2.0)
        old = score_attempt(row, AUX, lookup_table_main(turn1_main(entry), _before_feedback(first, entry), entry))
        if old.report is not None and old.report.all_passed and not first.report.all_passed:
            before.append(row["task_id"])
        new = score_attempt(row, AUX, lookup_table_main(turn1_main(entry), feedback_text(first, entry), entry))
        if new.all_tests_pass and not first.all_tests_pass:
            after.append(row["task_id"])
        if new.tests_passed > first.tests_passed:
            gains.append(row["task_id"])
    print(f"problems: {len(rows)}")
    print(
        f"before (all tests scored, failures quoted): a lookup table turns a failing turn 1 into a full pass on "
        f"{len(before)}: {before}"
    )
    print(f"after (hidden tests score): the same on {len(after)}: {after}")
    print(f"after: it passes more scored tests than the honest turn 1 on {len(gains)}: {gains}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
