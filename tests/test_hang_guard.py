"""The suite's hang guard is one figure: tests/hang_guard.py's constant and pytest-timeout's setting agree."""

import re
from pathlib import Path

from hang_guard import HANG_GUARD_S


def test_pytest_timeout_is_the_hang_guard():
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    section = text.split("[tool.pytest.ini_options]", 1)[1].split("\n[", 1)[0]  # tomllib is Python 3.11+
    assert re.findall(r"^timeout = (\d+)$", section, re.M) == [str(HANG_GUARD_S)]
