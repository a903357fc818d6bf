"""Multi-agent environments: the interface between a team rollout and the task.

- `protocol.py`: `MultiAgentEnv` (episode layer `reset` / `step`, batch layer `reset_batch` / `step_batch`),
  `StepResult`, `BatchStep`, reward validation;
- `reward_functions.py`: `RewardFunctionEnv`, a single-turn dataset + GRPO-style reward functions;
- `reward_model.py`: `RewardModelFunction`, a TRL-PPO-style reward model as a reward function.
"""

from .protocol import BatchStep, MultiAgentEnv, Observation, StepResult, as_float_rewards, check_agent_names
from .reward_functions import RewardFunctionEnv, per_agent
from .reward_model import RewardModelFunction

__all__ = [
    "Observation",
    "StepResult",
    "BatchStep",
    "MultiAgentEnv",
    "RewardFunctionEnv",
    "RewardModelFunction",
    "as_float_rewards",
    "check_agent_names",
    "per_agent",
]
