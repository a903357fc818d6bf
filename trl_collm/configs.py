"""The configurations, re-exported from beside their trainers (`trainers/team_config.py`, `trainers/ppo_config.py`,
`trainers/mc_config.py`), so `from trl_collm.configs import MultiAgentPPOConfig` keeps working."""

from .trainers.mc_config import MC_PRESETS, MultiAgentMCConfig
from .trainers.ppo_config import PRESETS, MultiAgentPPOConfig
from .trainers.team_config import TeamConfig

__all__ = ["MC_PRESETS", "PRESETS", "MultiAgentMCConfig", "MultiAgentPPOConfig", "TeamConfig"]
