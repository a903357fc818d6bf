"""``run_tests``: judge a solution against tests, with the judge outside the solution's sandbox.

Three processes per call, none of them the trainer:

* the **sandbox** (``runner.py`` inside bubblewrap) defines the solution and answers calls of the function under
  test, one JSON line per call;
* the **judge** (``judge.py``, a plain ``python -I -S -B`` with its own limits) runs only trusted text: the
  problem's setup, the tests' setup and asserts; its ``candidate`` is a proxy whose calls travel as plain data;
* this **host** side starts both, carries call requests and replies between them (a line per message, capped in
  size), enforces the per-call and total time limits, restarts a sandbox that timed out or died so the next test
  still runs, kills the sandbox at the end and keeps a judge that behaved for the next call (``pool.py``). The host
  never parses a sandbox's reply: the judge does.

Replies the sandbox makes up, exit codes, printed lines, signals or patches inside the sandbox can at most claim a
return value; whether it passes is decided by the judge's own comparison.
"""

from __future__ import annotations

import ast
import json
import math
import time
from dataclasses import dataclass, field

from .bwrap import Limits, SandboxUnavailable
from .pool import JUDGES, start
from .process import TIMEOUT, TOO_LONG, Child

__all__ = ["TestOutcome", "TestReport", "run_tests", "split_tests"]

MAX_REPLY_BYTES = 1 << 20  # one reply line of the sandbox
_JUDGE_LINE_BYTES = 4 << 20


@dataclass
class TestOutcome:
    """One test unit: an assert-bearing statement plus the setup statements just before it."""

    __test__ = False  # not a pytest test class

    index: int
    source: str
    status: str = "not_run"  # "passed" | "failed" | "error" | "timeout" | "not_run"
    message: str = ""  # failing assert (with the value obtained when it is a comparison) or the exception
    got: str | None = None  # repr of the left side of a failing comparison

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass
class TestReport:
    """Per-test results of ``run_tests``."""

    __test__ = False

    outcomes: list[TestOutcome]
    syntax_error: dict | None = None  # {"line", "offset", "message", "text"} of the solution
    load_error: str | None = None  # exception raised while defining the solution (module level)
    entry_point_missing: bool = False
    timed_out: bool = False  # the whole run hit its wall-clock limit
    setup_error: str | None = None  # the trusted setup (problem helpers, test module lines) raised
    duration: float = 0.0
    sandbox_pids: list[int] = field(default_factory=list)  # every sandbox started (host pids of their bwrap)
    restarts: int = 0  # sandboxes started again after a time-out or a death
    judge_error: str | None = None  # the judge itself failed (a bug, never the solution's doing)

    @property
    def total(self) -> int:
        return len(self.outcomes)

    @property
    def passed(self) -> int:
        return sum(o.passed for o in self.outcomes)

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total

    def failures(self) -> list[TestOutcome]:
        return [o for o in self.outcomes if not o.passed]

    def summary(self, max_failures: int = 3) -> str:
        """Short human-readable feedback (used in multi-turn prompts)."""
        if self.syntax_error is not None:
            se = self.syntax_error
            text = f"\n    {se['text']}" if se.get("text") else ""
            return f"SyntaxError at line {se['line']}: {se['message']}{text}"
        lines = [f"{self.passed}/{self.total} tests passed."]
        if self.load_error:
            lines.append(f"Defining the code raised: {self.load_error}")
        if self.entry_point_missing:
            lines.append("The function under test is not defined.")
        if self.timed_out:
            lines.append("The run was stopped: it exceeded the time limit.")
        fails = self.failures()
        for o in fails[:max_failures]:
            lines.append(f"- {o.message or o.source} [{o.status}]")
        if len(fails) > max_failures:
            lines.append(f"- ... and {len(fails) - max_failures} more")
        return "\n".join(lines)


def _unparse(node: ast.AST) -> str:
    return ast.unparse(node)


def _is_trivial_assert(stmt: ast.stmt) -> bool:
    """`assert True, "..."` (HumanEval's debugging placeholders) tests nothing and is not counted."""
    return isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant) and bool(stmt.test.value)


def _has_assert(stmt: ast.stmt) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(stmt))


def _group_units(stmts: list[ast.stmt]) -> tuple[list[str], list[str]]:
    """Split statements into test units: each assert-bearing statement with the setup lines just before it.
    Returns (units, trailing setup). Trivial asserts are dropped."""
    units, pending = [], []
    for stmt in stmts:
        if _is_trivial_assert(stmt):
            continue
        pending.append(_unparse(stmt))
        if _has_assert(stmt):
            units.append("\n".join(pending))
            pending = []
    return units, pending


def split_tests(tests: list[str] | str, entry_point: str | None = None) -> tuple[str, list[str], list[str]]:
    """(module setup source, test unit sources, names bound to the function under test).

    * a list of strings: each is one test (e.g. ``"assert add(1, 2) == 3"``);
    * a HumanEval-style program defining ``check(candidate)``: the module-level lines are setup and each
      assert-bearing statement of ``check``'s body is one test (``candidate`` = the entry point);
    * any other program: each assert-bearing module-level statement is one test.
    """
    names = [entry_point] if entry_point else []
    if not isinstance(tests, str):
        tests = [str(t) for t in tests]
        for t in tests:
            ast.parse(t)  # a malformed test is the caller's bug: fail loudly here, not as a "failed test"
        return "", tests, names
    module = ast.parse(tests)
    check = next((n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is not None:
        setup = "\n".join(_unparse(n) for n in module.body if n is not check)
        if check.args.args:
            names = names + [check.args.args[0].arg]
        units, _trailing = _group_units(check.body)  # lines after the last assert test nothing
        return setup, units, names
    units, trailing = _group_units(module.body)
    return "\n".join(trailing), units, names


# ----------------------------------------------------------------------------------------------------------------
# The host: start the judge and the sandbox, carry messages between them
# ----------------------------------------------------------------------------------------------------------------


class _Sandbox:
    """The sandbox side of one ``run_tests`` call: (re)started on demand, always killed at the end."""

    def __init__(self, code: str, entry_point: str | None, limits: Limits, report: TestReport):
        self.request = (json.dumps({"mode": "serve", "code": code, "entry_point": entry_point}) + "\n").encode(
            "utf-8", "surrogatepass"
        )
        self.limits, self.report = limits, report
        self.child: Child | None = None
        self.sent: bool | str = False  # how sending the request went: True, or EOF / TIMEOUT
        self.loaded = False  # the first sandbox answered "ready" (else restarting is pointless)

    def start(self, deadline: float) -> None:
        self.child = start(self.limits)
        self.report.sandbox_pids.append(self.child.pid)
        self.sent = self.child.send(self.request, deadline)

    def ready_line(self, deadline: float) -> dict:
        """The host message for the judge about the start-up reply."""
        line = self.child.read_line(deadline, MAX_REPLY_BYTES) if self.sent is True else self.sent
        if line == TIMEOUT:
            self.stop()
            return {"kind": "timeout"}
        if isinstance(line, str):
            self.child.wait(time.monotonic() + 1.0)
            stderr = self.child.stderr_text().strip()
            if stderr.startswith("bwrap:") or "sandbox set-up:" in stderr:
                # bubblewrap or the runner's set-up failed (the solution, whose stderr is /dev/null, cannot write
                # there): never a silent zero reward.
                self.stop()
                line = next(x for x in stderr.splitlines() if "bwrap:" in x or "sandbox set-up:" in x)
                raise SandboxUnavailable(f"a sandbox failed to start: {line[:300]}")
            why = self.stop_and_explain(line)
            return {"kind": "died", "why": why}
        self.loaded = True
        return {"kind": "ready", "line": line.decode("utf-8", "replace")}

    def call(self, message: dict, per_call: float, deadline: float) -> dict:
        if self.child is None or not self.child.alive():
            if not self.loaded:
                return {"kind": "died", "why": "the code did not start"}
            self.stop()
            self.report.restarts += 1
            self.start(deadline)
            ready = self.ready_line(deadline)
            if ready["kind"] != "ready":
                return ready
        call_deadline = min(deadline, time.monotonic() + per_call)
        # A large argument fills the pipe: sending it waits for the sandbox to read, within the call's time limit.
        sent = self.child.send((json.dumps(message) + "\n").encode("utf-8"), call_deadline)
        line = self.child.read_line(call_deadline, MAX_REPLY_BYTES) if sent is True else sent
        if line == TIMEOUT:
            self.stop()
            return {"kind": "timeout"}
        if isinstance(line, str):
            return {"kind": "died", "why": self.stop_and_explain(line)}
        return {"kind": "reply", "line": line.decode("utf-8", "replace")}

    def stop_and_explain(self, why: str) -> str:
        if why == TOO_LONG:
            self.stop()
            return f"a reply longer than {MAX_REPLY_BYTES} bytes"
        status = self.child.wait(time.monotonic() + 1.0) if self.child is not None else None
        self.stop()
        if status is None:
            return "no reply"
        if status > 128:
            return f"killed by signal {status - 128}"
        return f"exit status {status}"

    def stop(self) -> None:
        if self.child is not None:
            self.child.kill()
        self.child = None


def run_tests(
    code: str,
    tests: list[str] | str,
    entry_point: str | None = None,
    timeout: float = 10.0,
    per_test_timeout: float = 3.0,
    memory_mb: int = 512,
    *,
    trusted_setup: str = "",
    tmp_mb: int = 16,
    judge_memory_mb: int = 1024,
) -> TestReport:
    """Judge ``code`` against ``tests``, each test reported separately (see the module docstring).

    ``tests`` is a list of test statements or a test program (see ``split_tests``); ``entry_point`` names the
    function under test, bound to ``candidate`` in HumanEval-style checks. ``trusted_setup`` is source the judge
    runs before the tests: the problem's own helpers that tests call (HumanEval/32's ``poly``), taken from the
    problem's text, never from the solution. ``per_test_timeout`` bounds each call of the function under test
    (and the CPU time of each test's own code in the judge), ``timeout`` the whole run; ``memory_mb`` is the
    sandbox's memory cap. Arguments and return values must be plain data (see ``codec.py``): any other return
    value fails its test.
    """
    if not (timeout > 0 and per_test_timeout > 0):
        raise ValueError(f"run_tests: timeout and per_test_timeout must be > 0, got {timeout!r}, {per_test_timeout!r}.")
    setup, units, names = split_tests(tests, entry_point)
    if entry_point and "candidate" not in names and not isinstance(tests, str):
        names = names + ["candidate"]
    outcomes = [TestOutcome(index=i, source=u) for i, u in enumerate(units)]
    report = TestReport(outcomes=outcomes)
    begin = time.monotonic()
    deadline = begin + timeout
    limits = Limits(memory_mb=int(memory_mb), tmp_mb=int(tmp_mb), cpu_seconds=math.ceil(timeout) + 1)
    payload = {
        "trusted_setup": trusted_setup or "",
        "setup": setup,
        "units": units,
        "names": names,
        "entry_point": entry_point,
        "per_test_timeout": float(per_test_timeout),
        "setup_cpu_seconds": float(max(per_test_timeout, 1.0)),
    }
    box = _Sandbox(code, entry_point, limits, report)
    judge, uses = None, 0
    done = reusable = False

    def tell(message: dict) -> bool:
        """Send one line to the judge by the run's deadline; False (with the reason in the report) if it failed."""
        sent = judge.send((json.dumps(message) + "\n").encode("utf-8", "surrogatepass"), deadline)
        if sent == TIMEOUT:
            report.timed_out = True
        elif sent is not True:
            report.judge_error = f"the judge stopped ({sent}): {judge.stderr_text()[-2000:]}"
        return sent is True

    try:
        # The sandbox first: it is the slower to start, the judge starts meanwhile.
        box.start(min(deadline, time.monotonic() + per_test_timeout))
        judge, uses = JUDGES.take(int(judge_memory_mb))
        talking = tell(payload) and tell(box.ready_line(min(deadline, time.monotonic() + per_test_timeout)))
        while talking:
            line = judge.read_line(deadline, _JUDGE_LINE_BYTES)
            if line == TIMEOUT:
                report.timed_out = True
                break
            if isinstance(line, str):
                report.judge_error = f"the judge stopped ({line}): {judge.stderr_text()[-2000:]}"
                break
            try:
                msg = json.loads(line)
                op = msg["op"]
            except (ValueError, TypeError, KeyError) as err:
                report.judge_error = f"unreadable judge output ({err}): {line[:200]!r}"
                break
            if op == "call":
                answer = box.call(msg["msg"], per_test_timeout, deadline)
                if answer["kind"] == "timeout" and time.monotonic() >= deadline:
                    report.timed_out = True
                if not tell(answer):
                    break
            elif op == "test" and 0 <= msg["index"] < len(outcomes):
                o = outcomes[msg["index"]]
                o.status, o.message, o.got = msg["status"], msg["message"], msg["got"]
            elif op == "load":
                report.load_error = msg["load_error"]
                report.entry_point_missing = bool(entry_point) and msg["started"] and msg["entry_missing"]
            elif op == "setup_error":
                report.setup_error = msg["error"]
            elif op == "syntax_error":
                report.syntax_error = {k: msg.get(k) for k in ("line", "offset", "message", "text")}
            elif op == "done":
                done, reusable = True, msg.get("reusable", False)
                break
    finally:
        box.stop()
        if judge is not None:
            if done and reusable and report.judge_error is None:
                JUDGES.give(int(judge_memory_mb), judge, uses + 1)
            else:
                judge.kill()
    report.duration = time.monotonic() - begin
    if report.syntax_error is not None:
        for o in outcomes:
            o.status, o.message = "error", "the code does not compile"
    elif not done:
        why = "the time limit of the whole run" if report.timed_out else "a judge failure"
        for o in outcomes:
            if o.status == "not_run":
                o.status = "timeout" if report.timed_out else "not_run"
                o.message = f"{o.source.splitlines()[-1]}  # not completed: {why}"
    return report
