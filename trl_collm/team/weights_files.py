"""Whether a folder's safetensors files can be read, checked from their headers before any model loads.

A truncated or corrupt weights file (an interrupted copy or conversion, a full disk) otherwise surfaces deep inside
``from_pretrained`` as safetensors' own error, which names no file. Reading a header costs a few kilobytes; a
truncated file is caught because the header declares where the last tensor ends.
"""

from __future__ import annotations

import os

__all__ = ["unreadable_weights"]


def unreadable_weights(folder: str | os.PathLike) -> tuple[str, str] | None:
    """(the path, why) of the first ``*.safetensors`` file in ``folder`` that cannot be read; None if all can."""
    from safetensors import SafetensorError, safe_open

    for name in sorted(os.listdir(folder)):
        if not name.endswith(".safetensors"):
            continue
        path = os.path.join(folder, name)
        try:
            with safe_open(path, "pt"):
                pass
        except (SafetensorError, OSError) as err:
            return path, " ".join(str(err).split())
    return None
