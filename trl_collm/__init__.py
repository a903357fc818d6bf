"""trl-collm: train teams of language models to collaborate (CoLLM-CC / CoLLM-DC actor-critic, MC baseline), on TRL.

The public names below are imported on first use (module `__getattr__`): `import trl_collm` and the command line's
`--help` / `tasks` stay fast because torch, transformers and TRL load only when a trainer, config or environment is
actually asked for.
"""

from __future__ import annotations

import importlib

from .team.load_report import install_value_head_report_filter

__version__ = "0.1.0"

# public name -> submodule that defines it
_EXPORTS = {
    "PRESETS": "trainers.ppo_config",
    "MC_PRESETS": "trainers.mc_config",
    "MultiAgentPPOConfig": "trainers.ppo_config",
    "MultiAgentMCConfig": "trainers.mc_config",
    "TeamConfig": "trainers.team_config",
    "MultiAgentEnv": "envs",
    "RewardFunctionEnv": "envs",
    "RewardModelFunction": "envs",
    "StepResult": "envs",
    "MultiAgentPPOTrainer": "trainers",
    "MultiAgentMCTrainer": "trainers",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trl_collm' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


install_value_head_report_filter()
