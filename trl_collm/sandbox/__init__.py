"""Run untrusted, model-written Python: bubblewrap isolation, and a judge that never runs the model's code.

* ``run_tests`` (the code task's reward): the solution runs in a bubblewrap sandbox; the tests run in a separate
  trusted judge process, where the function under test is a proxy whose calls cross the boundary as plain data
  (``judging.py``, ``judge.py``, ``runner.py``, ``codec.py``).
* ``run_python``: run a whole program in a sandbox and report its exit, output, time-out or memory error.
* ``require_sandbox``: the start-up check; raises ``SandboxUnavailable`` with one line saying how to fix it.
* ``shutdown``: end the processes kept warm for later calls (``pool.py``; also done at exit).

What each sandbox gets and what is guaranteed: ``bwrap.py``, ``seccomp.py`` and docs/security.md.
"""

from .bwrap import Limits, SandboxUnavailable, require_sandbox, unsafe_mode
from .judging import TestOutcome, TestReport, run_tests, split_tests
from .pool import shutdown
from .scripts import SandboxResult, run_python

__all__ = [
    "Limits",
    "SandboxResult",
    "SandboxUnavailable",
    "TestOutcome",
    "TestReport",
    "require_sandbox",
    "run_python",
    "run_tests",
    "shutdown",
    "split_tests",
    "unsafe_mode",
]
