"""The judge: a separate, trusted process that runs the TESTS and never runs model-written code (its source is sent
with ``python -c``; the codec's source is put in front of it).

It executes only trusted text: the problem's own setup (e.g. a HumanEval prompt's helpers such as ``poly`` or
``encode_cyclic``), the test file's module-level lines and its asserts. The function under test is a proxy: a call
encodes the arguments as plain data, the host carries them to the sandbox, and the reply is decoded here into
fresh built-in values, which the asserts compare with this process's own, untouched operators and builtins. So
nothing the solution does in its own process (patching builtins / modules / frames, exit codes, printed lines,
signals, crashes) reaches the comparisons: the most a hostile sandbox can do is claim a return value.

Protocol on stdin, per problem: one JSON payload line, then one line per host message (``ready``, ``reply``,
``timeout``, ``died``). On stdout: ``load`` / ``syntax_error`` once, ``call`` per candidate call, ``test`` per
test, ``done``. After ``done`` the judge waits for the next problem's payload (the host keeps a few judges warm).
"""

import ast
import json
import operator
import os
import resource
import signal
import sys
import traceback

_OUT = [1]  # the protocol's private copy of stdout (set in _judge_main)


def emit(**message):
    os.write(_OUT[0], (json.dumps(message) + "\n").encode("utf-8", "replace"))


def receive():
    line = sys.stdin.buffer.readline()
    if not line:
        os._exit(0)  # the host is gone
    return json.loads(line)


def short(text, n=300):
    return text if len(text) <= n else text[: n - 3] + "..."


def describe(err):
    lines = "".join(traceback.format_exception_only(type(err), err)).strip().splitlines()
    return short(lines[-1] if lines else type(err).__name__)


class TrustedCodeTimeout(BaseException):
    """The test's own code used up its CPU time in the judge."""


def _on_cpu_alarm(signum, frame):
    raise TrustedCodeTimeout()


def arm(seconds):  # CPU time of THIS process: waiting for the sandbox does not count
    signal.setitimer(signal.ITIMER_VIRTUAL, seconds)


class CandidateError(Exception):
    """The function under test raised (in the sandbox) or its reply was not plain data."""


class CandidateStopped(BaseException):
    """The call timed out or the sandbox died: not catchable by a test's ``except Exception``."""

    def __init__(self, status, why):
        super().__init__(why)
        self.status, self.why = status, why


def _judge_main():
    config = json.loads(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (config["memory_mb"] * 1024 * 1024,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _OUT[0] = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # prints in the test code must not be taken for protocol lines
    signal.signal(signal.SIGVTALRM, _on_cpu_alarm)
    # One problem per payload line: a warm judge is given several problems one after the other, each judged in a
    # fresh namespace.
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            return
        judge_one(json.loads(line))


def judge_one(payload):
    # --- how the solution loaded -------------------------------------------------------------------------------
    first = receive()
    info = {}
    if first["kind"] == "ready":
        try:
            info = json.loads(first["line"])
        except ValueError:
            info = {}
        if type(info) is not dict:
            info = {}
    if "syntax_error" in info and type(info["syntax_error"]) is dict:
        se = info["syntax_error"]
        emit(
            op="syntax_error",
            line=se.get("line") if type(se.get("line")) is int else None,
            offset=se.get("offset") if type(se.get("offset")) is int else None,
            message=short(str(se.get("message", ""))),
            text=short(str(se.get("text", "")), 500),
        )
        emit(op="done")
        return
    if first["kind"] != "ready" or info.get("ready") is not True:
        why = {"timeout": "defining the code timed out"}.get(first["kind"], first.get("why") or "no start-up reply")
        emit(op="load", load_error=short(str(why)), entry_missing=False, started=False)
        dead_why = why
    else:
        load_error = info.get("load_error")
        emit(
            op="load",
            load_error=short(str(load_error)) if load_error is not None else None,
            entry_missing=info.get("entry") is not True,
            started=True,
        )
        dead_why = None

    # --- the proxy -------------------------------------------------------------------------------------------
    per_call = payload["per_test_timeout"]
    returned = []
    counter = [0]

    def candidate(*args, **kwargs):
        if dead_why is not None:
            raise CandidateStopped("error", f"the code did not start: {dead_why}")
        counter[0] += 1
        try:
            message = {"id": counter[0], "args": encode(list(args)), "kwargs": encode(dict(kwargs))}  # noqa: F821
        except Unencodable as err:  # noqa: F821
            raise TypeError(f"the test passes {err}, which cannot cross the sandbox boundary") from None
        emit(op="call", msg=message)
        reply = receive()
        if reply["kind"] == "timeout":
            raise CandidateStopped("timeout", f"timed out after {per_call}s")
        if reply["kind"] != "reply":
            raise CandidateStopped("error", f"the program died ({reply.get('why', 'no reply')})")
        try:
            answer = json.loads(reply["line"])
            if type(answer) is not dict or answer.get("id") != counter[0]:
                raise ValueError("a reply to another call")
            if "error" in answer:
                raise CandidateError(short(str(answer["error"])))
            value = decode(answer["value"])  # noqa: F821
        except CandidateError:
            raise
        except (ValueError, TypeError, KeyError, RecursionError, OverflowError, MemoryError) as err:
            raise CandidateError(f"unreadable reply ({describe(err)})") from None
        returned[:] = [value]
        return value

    # --- the tests ---------------------------------------------------------------------------------------------
    namespace = {"__name__": "__tests__"}
    names = payload["names"]
    for name in names:
        namespace[name] = candidate
    setup_error = None
    for label, source in (("problem", payload["trusted_setup"]), ("tests", payload["setup"])):
        try:
            arm(payload["setup_cpu_seconds"])
            exec(compile(source, f"{label}.py", "exec"), namespace)  # noqa: S102
        except BaseException as err:  # noqa: BLE001
            setup_error = setup_error or f"{label} setup raised {describe(err)}"
        finally:
            arm(0)
    for name in names:  # the setup must not shadow the function under test
        namespace[name] = candidate
    if setup_error:
        emit(op="setup_error", error=setup_error)

    ops = {
        ast.Eq: operator.eq,
        ast.NotEq: operator.ne,
        ast.Lt: operator.lt,
        ast.LtE: operator.le,
        ast.Gt: operator.gt,
        ast.GtE: operator.ge,
        ast.Is: operator.is_,
        ast.IsNot: operator.is_not,
        ast.In: lambda a, b: a in b,
        ast.NotIn: lambda a, b: a not in b,
    }

    dirty = [False]
    for index, src in enumerate(payload["units"]):
        returned.clear()
        status, message, got = "passed", "", None
        body = ast.parse(src).body
        last = body[-1]
        head = ast.Module(body=body[:-1], type_ignores=[])
        summary = ast.unparse(last).splitlines()[0]
        try:
            arm(per_call)
            exec(compile(head, "tests.py", "exec"), namespace)  # noqa: S102
            test = last.test if isinstance(last, ast.Assert) else None
            if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in ops:
                left = eval(compile(ast.Expression(test.left), "tests.py", "eval"), namespace)
                right = eval(compile(ast.Expression(test.comparators[0]), "tests.py", "eval"), namespace)
                if not ops[type(test.ops[0])](left, right):
                    got = short(repr(returned[0] if returned else left), 200)
                    raise AssertionError(None)
            else:
                exec(compile(ast.Module(body=[last], type_ignores=[]), "tests.py", "exec"), namespace)  # noqa: S102
        except CandidateStopped as err:
            status, message = err.status, f"{summary}  # {err.why}"
        except TrustedCodeTimeout:
            # It may have struck between a call and its reply: later replies could be out of step, so the rest
            # of this problem is not run and this judge is not reused.
            status, message = "timeout", f"{summary}  # the test itself ran out of time"
            dirty[0] = True
        except CandidateError as err:
            status, message = "error", f"{summary}  # raised {err}"
        except AssertionError as err:
            status = "failed"
            message = summary + (f"  # got {got}" if got is not None else "")
            if err.args and err.args[0] is not None:
                message += f"  ({short(str(err.args[0]), 200)})"
        except BaseException as err:  # noqa: BLE001
            status, message = "error", f"{summary}  # raised {describe(err)}"
        finally:
            arm(0)
        emit(op="test", index=index, status=status, message=message, got=got)
        if dirty[0]:
            for later in range(index + 1, len(payload["units"])):
                last_line = payload["units"][later].splitlines()[-1]
                emit(
                    op="test",
                    index=later,
                    status="not_run",
                    got=None,
                    message=f"{last_line}  # not run: an earlier test ran out of time",
                )
            break
    emit(op="done", reusable=not dirty[0])


_judge_main()
