"""The suite's one wall-clock limit for work that ends on its own (a subprocess, a sandbox run, a whole test).

A verdict never depends on how long something took: on a machine shared with other jobs (load 10 on 2 cores) a
command that takes 2 s alone takes minutes. A limit set here only keeps a hang from holding the suite forever, so
it is an hour. A test whose *scenario* is a time limit (code that never returns, stopped by the sandbox's deadline)
keeps its own short limit, and judges what the limit did (the status says it was stopped), not when.
pyproject.toml's pytest-timeout setting is the same hour (tests/test_hang_guard.py holds them equal)."""

HANG_GUARD_S = 3600
