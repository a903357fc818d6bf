"""Critics: value heads, where their parameters live (placements) and what they read (layouts: CC vs DC).

- `layouts.py`: `TeamCritic` and the two layouts, `CentralizedCritic` (CoLLM-CC) and `DecentralizedCritic`
  (CoLLM-DC), registered by `critic_type`; each owns its unit keys, outputs and views.
- `units.py`: one `CriticUnit` class per `critic_placement` (a separate value model, a head on an actor, an adapter
  plus a head on the shared base), each owning its body, parameters and saving.
- `heads.py`: the value head (the model introspection it needs is `trl_collm.team.modeling`'s, re-exported here).

No module outside this package reads `critic_type` or `critic_placement`.
"""

from ..team.modeling import backbone_of, hidden_size_of, value_model_outputs
from .heads import ValueHead
from .layouts import (
    CRITIC_TYPES,
    CentralizedCritic,
    CriticBatch,
    DecentralizedCritic,
    TeamCritic,
    build_critic,
    check_critic_config,
    critic_outputs,
    ignored_critic_fields,
    register_critic_type,
)
from .units import PLACEMENTS, ActorHeadUnit, CriticUnit, SharedBaseAdapterUnit, UnitSpec, ValueModelUnit

__all__ = [
    "CRITIC_TYPES",
    "PLACEMENTS",
    "ActorHeadUnit",
    "CentralizedCritic",
    "CriticBatch",
    "CriticUnit",
    "DecentralizedCritic",
    "SharedBaseAdapterUnit",
    "TeamCritic",
    "UnitSpec",
    "ValueHead",
    "ValueModelUnit",
    "backbone_of",
    "build_critic",
    "check_critic_config",
    "critic_outputs",
    "ignored_critic_fields",
    "hidden_size_of",
    "register_critic_type",
    "value_model_outputs",
]
