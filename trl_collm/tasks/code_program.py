"""The program the ``code-humaneval`` team writes together, and its score (no environment, no prompts):

- ``extract_code``: the code of one completion (a fenced block, else the longest stretch that parses);
- ``join_program``: the problem's own preamble + aux's code + main's code as one program, with each part's lines;
- ``score_attempt``: that program scored level by level (``CodeScore``; the rules are in ``trl_collm/tasks/code.py``
  and ``docs/tasks/code.md``), its tests run only in ``trl_collm.sandbox``; only the *scored* tests count, the
  *shown* ones are for feedback (``code_tests.py``).

``trl_collm/tasks/code.py`` builds the task (prompts, feedback, the environment, the dataset) on these.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass, field

from ..sandbox import TestOutcome, TestReport, run_tests
from .code_tests import TestSplit, split_shown_scored

W_AUX_DEF, W_MAIN_DEF, W_SYNTAX, W_TESTS, W_BONUS = 0.5, 0.5, 0.5, 2.0, 0.5
MAX_SCORE = W_AUX_DEF + W_MAIN_DEF + W_SYNTAX + W_TESTS + W_BONUS  # 4.0

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


def def_line(prompt: str, entry_point: str) -> str:
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
    tests_passed: int = 0  # of the scored tests (the reward's); the shown ones are in ``shown``
    tests_total: int = 0
    calls_aux: bool = False
    thin_wrapper: bool = False
    levels: dict = field(default_factory=dict)  # {"definitions", "syntax", "tests", "bonus"} -> points
    program: JointProgram | None = None
    report: TestReport | None = None
    syntax_error: dict | None = None  # {"line", "message", "text", "part", "part_line"}
    split: TestSplit | None = None  # which of the problem's tests are shown and which are scored
    shown: list[TestOutcome] = field(default_factory=list)  # outcomes feedback may quote; they score nothing
    scored: list[TestOutcome] = field(default_factory=list)  # outcomes that decide the tests level and the bonus

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
    s.split = split_shown_scored(row["test"], entry)  # the same units, in the same order, as report.outcomes
    s.shown = [report.outcomes[i] for i in s.split.shown]
    s.scored = [report.outcomes[i] for i in s.split.scored]
    s.tests_passed, s.tests_total = sum(o.passed for o in s.scored), len(s.scored)
    s.levels["tests"] = W_TESTS * s.tests_passed / s.tests_total if s.tests_total else 0.0
    s.calls_aux, s.thin_wrapper = _collaboration(program.main_code, entry)
    if s.calls_aux and not s.thin_wrapper and s.aux_defined and s.tests_passed > 0:
        s.levels["bonus"] = W_BONUS
    return s
