"""trl-collm: train teams of language models to collaborate (CoLLM-CC / CoLLM-DC actor-critic, MC baseline), on TRL."""

__version__ = "0.1.0"

from .configs import MC_PRESETS, PRESETS, MultiAgentMCConfig, MultiAgentPPOConfig, TeamConfig
from .envs import MultiAgentEnv, RewardFunctionEnv, RewardModelFunction, StepResult
from .trainers import MultiAgentMCTrainer, MultiAgentPPOTrainer

__all__ = [
    "PRESETS",
    "MultiAgentPPOConfig",
    "MultiAgentPPOTrainer",
    "MultiAgentMCConfig",
    "MultiAgentMCTrainer",
    "MC_PRESETS",
    "TeamConfig",
    "MultiAgentEnv",
    "RewardFunctionEnv",
    "RewardModelFunction",
    "StepResult",
]
