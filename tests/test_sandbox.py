"""The sandbox contains hostile code: every test runs an attack and checks that the host is untouched."""

from __future__ import annotations

import os
import socket
import textwrap
import time
import uuid

import psutil
import pytest

from trl_collm import sandbox
from trl_collm.sandbox import run_python, run_tests


@pytest.fixture
def host():
    """Snapshot of the host before an attack; ``check(result)`` asserts nothing of the sandbox survived."""
    me = psutil.Process()
    cwd = os.getcwd()
    children_before = {p.pid for p in me.children(recursive=True)}

    def check(result):
        assert result.pid is not None
        assert sandbox._session_members(result.pid) == [], "a process of the sandbox's session is still alive"
        alive = [p for p in me.children(recursive=True) if p.pid not in children_before and p.status() != psutil.STATUS_ZOMBIE]
        assert alive == [], f"stray child processes: {alive}"
        assert os.getcwd() == cwd
        assert result.workdir and not os.path.exists(result.workdir), "the sandbox dir was not removed"

    return check


@pytest.fixture
def outside(tmp_path_factory):
    """A host directory outside the sandbox, world-writable so only the sandbox's own guards stop writes."""
    d = tmp_path_factory.mktemp(f"outside-{uuid.uuid4().hex[:8]}")
    os.chmod(d, 0o777)
    return d


def run(code, **kw):
    return run_python(textwrap.dedent(code), **kw)


# ---------------------------------------------------------------------------------------------------------------
# run_python
# ---------------------------------------------------------------------------------------------------------------


def test_normal_code_passes(host):
    r = run("""
        import json, math
        with open("scratch.txt", "w") as f:   # writing inside the sandbox dir is fine
            f.write("ok")
        print(json.dumps({"pi": round(math.pi, 2), "read": open("scratch.txt").read()}))
    """)
    assert r.ok and r.returncode == 0 and not r.timed_out and r.killed_reason is None
    assert r.stdout.strip() == '{"pi": 3.14, "read": "ok"}'
    assert {"rlimits", "guards"} <= set(r.isolation)
    host(r)


def test_syntax_error_reported_with_line(host):
    r = run("x = 1\ny = 2\ndef f(:\n    return x\n")
    assert not r.ok
    assert r.syntax_error is not None and r.syntax_error["line"] == 3
    assert "def f(:" in r.syntax_error["text"]
    assert "SyntaxError" in r.stderr and "line 3" in r.stderr
    host(r)


def test_infinite_loop_times_out(host):
    start = time.monotonic()
    r = run("while True:\n    pass\n", timeout=1.0)
    assert time.monotonic() - start < 3.0
    assert r.timed_out and r.killed_reason == "timeout" and not r.ok
    assert r.returncode == -9
    host(r)


def test_cpu_limit_kills(host):
    r = run("while True:\n    pass\n", timeout=10.0, cpu_seconds=1)
    assert not r.ok and not r.timed_out
    assert r.killed_reason in ("cpu_limit", "signal:SIGKILL")
    assert r.duration < 5.0
    host(r)


FORK_ATTEMPTS = {
    "os.fork bomb": "import os\nwhile True:\n    os.fork()\n",
    "subprocess": "import subprocess\nsubprocess.run(['sleep', '60'])\n",
    "os.system": "import os\nos.system('sleep 60 &')\n",
    "os.posix_spawn": "import os\nos.posix_spawn('/bin/sleep', ['sleep', '60'], {})\n",
    "multiprocessing": textwrap.dedent("""
        import multiprocessing, time
        p = multiprocessing.Process(target=time.sleep, args=(60,))
        p.start()
    """),
    "pty": "import pty\npty.fork()\n",
    "exec": "import os\nos.execv('/bin/sleep', ['sleep', '60'])\n",
    "ctypes fork": "import ctypes\nctypes.CDLL(None).fork()\n",
    "setsid escape": "import os\nos.setsid()\n",
    "kill the parent": "import os\nos.kill(os.getppid(), 9)\n",
}


@pytest.mark.parametrize("name", list(FORK_ATTEMPTS))
def test_process_creation_is_contained(host, name):
    r = run(FORK_ATTEMPTS[name], timeout=3.0)
    assert not r.ok, r
    assert not r.timed_out
    assert "PermissionError" in r.stderr or "ImportError" in r.stderr, r.stderr
    host(r)


def test_memory_bomb(host):
    r = run("""
        chunks = []
        while True:
            chunks.append(bytearray(50 * 1024 * 1024))
    """, memory_mb=256, timeout=5.0)
    assert not r.ok and not r.timed_out
    assert r.memory_error or r.killed_reason is not None
    host(r)


def test_single_huge_allocation(host):
    r = run("x = bytearray(8 * 1024 ** 3)\n", memory_mb=256)
    assert not r.ok and r.memory_error
    host(r)


def test_network_refused(host):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.3)
    port = server.getsockname()[1]
    try:
        r = run(f"""
            import socket, _socket
            results = []
            for attempt in (
                lambda: socket.create_connection(("127.0.0.1", {port}), timeout=1),
                lambda: socket.socket().connect(("127.0.0.1", {port})),
                lambda: _socket.socket().connect(("127.0.0.1", {port})),
                lambda: socket.socketpair(),
            ):
                try:
                    attempt()
                    results.append("connected")
                except PermissionError:
                    results.append("refused")
                except OSError as e:
                    results.append("oserror")
            print(",".join(results))
            socket.create_connection(("127.0.0.1", {port}), timeout=1)
        """)
        assert r.stdout.strip() == "refused,refused,refused,refused"
        assert not r.ok and "network access is not allowed" in r.stderr
        with pytest.raises(socket.timeout):
            server.accept()  # nothing ever reached the host's listener
    finally:
        server.close()
    host(r)


def test_writes_outside_are_blocked(host, outside):
    target = outside / "pwned"
    victim = outside / "keep.txt"
    victim.write_text("precious")
    r = run(f"""
        import io, os, pathlib, shutil
        target, victim = {str(target)!r}, {str(victim)!r}
        attempts = {{
            "open": lambda: open(target, "w").write("x"),
            "open append": lambda: open(target, "a").write("x"),
            "pathlib": lambda: pathlib.Path(target).write_text("x"),
            "os.open": lambda: os.write(os.open(target, os.O_WRONLY | os.O_CREAT), b"x"),
            "FileIO": lambda: io.FileIO(target, "w").write(b"x"),
            "relative": lambda: open(os.path.relpath(target), "w").write("x"),
            "remove": lambda: os.remove(victim),
            "rename in": lambda: os.rename(victim, "stolen"),
            "rmtree": lambda: shutil.rmtree(os.path.dirname(victim)),
            "truncate": lambda: os.truncate(victim, 0),
            "chmod": lambda: os.chmod(victim, 0),
        }}
        def symlink_trick():
            os.symlink(os.path.dirname(target), "link")
            open(os.path.join("link", "pwned"), "w").write("x")
        attempts["symlink"] = symlink_trick
        def move_out():
            open("inside.txt", "w").write("x")
            os.replace("inside.txt", target)
        attempts["replace out"] = move_out
        def hardlink():
            os.link(victim, "hard")
            open("hard", "w").write("x")
        attempts["hardlink"] = hardlink
        blocked = []
        for name, attempt in attempts.items():
            try:
                attempt()
                print("WROTE", name)
            except PermissionError:
                blocked.append(name)
        print(len(blocked), "blocked")
    """)
    assert "WROTE" not in r.stdout, r.stdout
    assert r.stdout.strip().endswith("14 blocked"), r.stdout + r.stderr
    assert not target.exists()
    assert victim.read_text() == "precious"
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    host(r)


def test_huge_output_truncated(host):
    r = run("while True:\n    print('y' * 1000)\n", max_output_bytes=10_000, timeout=5.0)
    assert r.stdout_truncated and r.killed_reason == "output_limit" and not r.ok
    assert not r.timed_out and r.duration < 3.0
    assert r.stdout.startswith("y" * 1000) and "truncated by the sandbox" in r.stdout
    assert len(r.stdout) < 10_000 + 200
    host(r)


def test_huge_stderr_truncated(host):
    r = run("import sys\nsys.stderr.write('e' * 10**7)\n", max_output_bytes=4096)
    assert r.stderr_truncated and "truncated by the sandbox" in r.stderr
    assert len(r.stderr) < 4096 + 200
    host(r)


def test_dangerous_modules_blocked(host):
    r = run("""
        out = []
        for name in ("ctypes", "resource"):
            try:
                __import__(name)
                out.append("imported " + name)
            except ImportError:
                out.append("blocked " + name)
        print(",".join(out))
    """)
    assert r.ok and r.stdout.strip() == "blocked ctypes,blocked resource"
    host(r)


def test_environment_is_minimal(host):
    os.environ["TRL_COLLM_TEST_SECRET"] = "s3cret"
    try:
        r = run("import os\nprint(sorted(os.environ))\nprint(os.environ['HOME'] == os.getcwd())\n")
    finally:
        del os.environ["TRL_COLLM_TEST_SECRET"]
    assert r.ok and "TRL_COLLM_TEST_SECRET" not in r.stdout and "PROXY" not in r.stdout.upper()
    assert r.stdout.splitlines()[1] == "True"
    host(r)


@pytest.mark.skipif(os.geteuid() != 0, reason="privilege drop only applies when the trainer runs as root")
def test_root_is_dropped_when_possible(host):
    if sandbox._interpreter_for_nobody(os.path.realpath(os.sys.executable)) is None:
        pytest.skip("no interpreter that user nobody can execute")
    r = run("import os\nprint(os.getuid(), os.getgid())\n")
    assert r.ok and r.stdout.split() == ["65534", "65534"] and "uid:nobody" in r.isolation
    host(r)


# ---------------------------------------------------------------------------------------------------------------
# run_tests
# ---------------------------------------------------------------------------------------------------------------

CHECK = '''
def check(candidate):
    assert candidate(1, 2) == 3
    assert candidate(-1, 1) == 0
    x = candidate(10, 5)
    assert x == 15
    assert True, "placeholder, not counted"
    import math
    assert math.isclose(candidate(0.1, 0.2), 0.3)
'''


def test_run_tests_all_pass():
    rep = run_tests("def add(a, b):\n    return a + b\n", CHECK, entry_point="add")
    assert [o.status for o in rep.outcomes] == ["passed"] * 4
    assert rep.all_passed and rep.fraction == 1.0 and rep.total == 4


def test_run_tests_reports_failing_asserts_with_value():
    rep = run_tests("def add(a, b):\n    return a - b if a < 5 else a + b\n", CHECK, entry_point="add")
    assert [o.status for o in rep.outcomes] == ["failed", "failed", "passed", "failed"]
    assert rep.outcomes[0].message == "assert candidate(1, 2) == 3  # got -1"
    assert rep.passed == 1 and rep.fraction == 0.25
    assert "1/4 tests passed" in rep.summary()


def test_run_tests_syntax_error():
    rep = run_tests("def add(a, b):\n    return a +\n", CHECK, entry_point="add")
    assert rep.syntax_error["line"] == 2 and rep.passed == 0
    assert rep.summary().startswith("SyntaxError at line 2")


def test_run_tests_list_of_asserts_and_missing_entry_point():
    rep = run_tests("def mul(a, b):\n    return a * b\n", ["assert mul(2, 3) == 6", "assert mul(2, 2) == 5"], entry_point="mul")
    assert [o.status for o in rep.outcomes] == ["passed", "failed"]
    rep = run_tests("def other(a, b):\n    return a * b\n", ["assert mul(2, 3) == 6"], entry_point="mul")
    assert rep.entry_point_missing and rep.outcomes[0].status == "error"


def test_run_tests_per_test_timeout_keeps_going():
    code = "def add(a, b):\n    while a < 0:\n        pass\n    return a + b\n"
    rep = run_tests(code, CHECK, entry_point="add", per_test_timeout=0.5, timeout=10)
    assert [o.status for o in rep.outcomes] == ["passed", "timeout", "passed", "passed"]


@pytest.mark.parametrize(
    "hack",
    [
        "import sys\n    sys.exit(0)",  # exit 0 before any assert fails
        "import os\n    os._exit(0)",
        "class Eq:\n        def __eq__(self, other): return True\n    return Eq()",  # always-equal object
        "class I(int):\n        def __eq__(self, other): return True\n    return I(0)",
        "import builtins, math\n    math.isclose = lambda *a, **k: True\n    builtins.abs = lambda x: 0\n    return -7",
        "import sys\n    sys.modules['math'] = type(sys)('math')\n    return -7",
    ],
    ids=["sys.exit", "os._exit", "always-equal", "int-subclass", "patch-builtins", "fake-module"],
)
def test_run_tests_resists_simple_reward_hacks(hack, host):
    code = f"def add(a, b):\n    {hack}\n"
    rep = run_tests(code, CHECK, entry_point="add")
    assert rep.passed == 0, [(o.status, o.message) for o in rep.outcomes]
    host(rep.sandbox)


def test_run_tests_contains_adversarial_solution(host, outside):
    target = outside / "pwned"
    code = f"import os\nos.system('touch {target}')\ndef add(a, b):\n    open({str(target)!r}, 'w')\n    return a + b\n"
    rep = run_tests(code, CHECK, entry_point="add")
    assert rep.load_error and "PermissionError" in rep.load_error
    assert rep.passed == 0 and not target.exists()
    host(rep.sandbox)


def test_guards_work_without_the_os_layers(host, outside):
    """The in-process guards alone (no uid drop, no network namespace) still refuse processes, sockets, writes."""
    target = outside / "pwned"
    r = run(f"""
        import os, socket, subprocess
        for attempt in (lambda: subprocess.run(["true"]), lambda: os.fork(),
                        lambda: socket.create_connection(("127.0.0.1", 9)), lambda: open({str(target)!r}, "w")):
            try:
                attempt()
                print("ESCAPED")
            except PermissionError:
                print("refused")
    """, drop_privileges=False, network_namespace=False)
    assert r.ok and r.stdout.split() == ["refused"] * 4
    assert "uid:nobody" not in r.isolation and "netns" not in r.isolation
    assert not target.exists()
    host(r)


def test_run_tests_solution_cannot_read_the_tests_from_disk():
    code = (
        "import os, sys\n"
        "seen = open(sys.argv[0]).read() + ' '.join(open(f).read() for f in os.listdir('.') if os.path.isfile(f))\n"
        "def add(a, b):\n"
        "    return 3 if 'candidate(1, 2) == 3' in seen else -7\n"
    )
    rep = run_tests(code, CHECK, entry_point="add")
    assert rep.load_error is None and rep.passed == 0
