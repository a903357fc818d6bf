from .base import TeamTrainerBase
from .ppo import MultiAgentPPOTrainer

__all__ = ["TeamTrainerBase", "MultiAgentPPOTrainer"]
