from .base import TeamTrainerBase
from .mc import MultiAgentMCTrainer
from .ppo import MultiAgentPPOTrainer

__all__ = ["TeamTrainerBase", "MultiAgentMCTrainer", "MultiAgentPPOTrainer"]
