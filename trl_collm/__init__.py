"""trl-collm: train teams of language models to collaborate (CoLLM-CC / CoLLM-DC actor-critic, MC baseline), on TRL."""

__version__ = "0.1.0"

from .configs import MC_PRESETS, PRESETS, MultiAgentMCConfig, MultiAgentPPOConfig, TeamConfig
from .envs import MultiAgentEnv, RewardFunctionEnv, RewardModelFunction, StepResult
from .trainers import MultiAgentPPOTrainer

__all__ = [
    "PRESETS",
    "MultiAgentPPOConfig",
    "MultiAgentPPOTrainer",
    "MultiAgentEnv",
    "RewardFunctionEnv",
    "RewardModelFunction",
    "StepResult",
]
