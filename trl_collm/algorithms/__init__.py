"""Tensor-level RL building blocks for multi-agent PPO (this face re-exports them; import from `trl_collm.algorithms`).

- `masked.py`: masked statistics, whitening, group baselines and the normalisation by scope;
- `returns.py`: GAE, MC's tree returns, the per-token KL and the KL-shaped rewards;
- `losses.py`: the policy losses (PPO's clipped, REINFORCE, GRPO's loss types), importance-sampling weights, the
  value loss.

Everything here is pure torch: no models, no trainers. Trainers call these
functions with per-token or per-turn tensors plus a ``mask`` that marks the
valid entries.

Mask convention used throughout: a mask is bool or 0/1 float with the same
shape as the data (broadcastable is accepted). Masked-out entries never
influence a result -- they are replaced with zeros *before* any arithmetic, so
even NaN/inf padding cannot leak in -- and element-wise outputs are 0 there.

Precision: statistics and losses are accumulated in at least float32 (bf16 /
fp16 sums lose too much precision over long sequences). Element-wise outputs
(whiten, zscore, gae, kl, rewards) are cast back to the input dtype;
reductions used as losses/stats stay in the accumulation dtype.
"""

from .losses import (
    GRPO_LOSS_TYPES,
    IMPORTANCE_SAMPLING_MODES,
    grpo_scaled_advantages,
    grpo_token_loss,
    importance_sampling_weights,
    normalised_token_loss,
    policy_loss_clipped,
    policy_loss_reinforce,
    value_loss_clipped,
)
from .masked import NORM_SCOPES, group_advantages, masked_mean, masked_var, normalize_by_scope, whiten, zscore_by_group
from .returns import gae, kl_per_token, token_level_rewards, tree_returns

__all__ = [
    "masked_mean",
    "masked_var",
    "whiten",
    "zscore_by_group",
    "group_advantages",
    "normalize_by_scope",
    "gae",
    "tree_returns",
    "kl_per_token",
    "token_level_rewards",
    "policy_loss_clipped",
    "policy_loss_reinforce",
    "grpo_token_loss",
    "normalised_token_loss",
    "grpo_scaled_advantages",
    "value_loss_clipped",
    "importance_sampling_weights",
    "NORM_SCOPES",
    "GRPO_LOSS_TYPES",
    "IMPORTANCE_SAMPLING_MODES",
]
