"""The source text of the two programs the host starts: the runner (inside bubblewrap) and the judge (outside).

Both are files of this package, sent with ``python -I -S -B -c``: the sandbox sees none of the project's files,
and neither program can import the package. The codec goes in front of both, so values are encoded and decoded
by one implementation.
"""

from __future__ import annotations

import functools
from pathlib import Path

__all__ = ["source"]

_HERE = Path(__file__).resolve().parent


def _text(name: str) -> str:
    lines = (_HERE / name).read_text(encoding="utf-8").splitlines()
    # A __future__ import is only legal at the top of a program; the codec's is not needed at run time.
    return "\n".join(line for line in lines if not line.startswith("from __future__ import"))


@functools.cache
def source(name: str) -> str:
    """``"runner"`` or ``"judge"``: the codec followed by that program."""
    if name not in ("runner", "judge"):
        raise ValueError(f"programs.source: unknown program {name!r} (use 'runner' or 'judge').")
    return _text("codec.py") + "\n\n" + _text(f"{name}.py") + "\n"
