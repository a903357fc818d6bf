"""The team trainers. Imported on first use (module `__getattr__`), so that the configs beside them
(`trainers.ppo_config`, `trainers.mc_config`) load without the trainers' torch / model code: `trl-collm ppo --help`
and the CLI's argument errors need only the configs."""

from __future__ import annotations

import importlib

# public name -> submodule that defines it
_EXPORTS = {"TeamTrainerBase": "base", "MultiAgentMCTrainer": "mc", "MultiAgentPPOTrainer": "ppo"}

__all__ = ["TeamTrainerBase", "MultiAgentMCTrainer", "MultiAgentPPOTrainer"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
