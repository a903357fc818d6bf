"""Returns and the rewards they are made of: GAE, MC's tree returns (`tree_returns`), the per-token KL estimate and the
KL-shaped per-token rewards. The package's conventions (masks, precision) are in `trl_collm/algorithms/__init__.py`.
"""

import torch
from torch import Tensor

from .masked import _bool_mask, _to_acc, _zero_masked

_KL_ESTIMATORS = ("k1", "k3")


# --------------------------------------------------------------------------- #
# advantages / returns
# --------------------------------------------------------------------------- #
def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation over the last dim of (B, T) tensors.

    The step after the last valid one is terminal (value 0): rollouts end there,
    so bootstrapping from padding would inject garbage. Works for turns or
    tokens alike; the backward loop is over T (small), vectorised over B.
    """
    r = _to_acc(rewards)
    m = _bool_mask(mask, r)
    r = _zero_masked(r, m)
    v = _zero_masked(_to_acc(values).expand_as(r), m)
    mf = m.to(r.dtype)
    T = r.shape[-1]
    adv = torch.zeros_like(r)
    next_adv = torch.zeros_like(r[..., 0])
    next_val = torch.zeros_like(r[..., 0])
    for t in reversed(range(T)):
        # next_val/next_adv are already 0 if step t+1 is masked (zeroed above / below).
        delta = r[..., t] + gamma * next_val - v[..., t]
        cur = (delta + gamma * lam * next_adv) * mf[..., t]
        adv[..., t] = cur
        next_adv = cur
        next_val = v[..., t]
    returns = (adv + v) * mf
    return adv.to(rewards.dtype), returns.to(rewards.dtype)


def tree_returns(rewards: list[Tensor], parents: list[Tensor], gamma: float) -> list[Tensor]:
    """Monte-Carlo returns over a sample tree, per turn t: R_t(node) = r_t(node) + gamma * the mean of R_{t+1} over the
    node's children (its reward alone where it has none). rewards[t]: (N_t, n); parents[t]: (N_t,), each node's parent
    among the N_{t-1} nodes of turn t-1."""
    out = [None] * len(rewards)
    for t in reversed(range(len(rewards))):
        ret = rewards[t].clone()
        if t + 1 < len(rewards) and len(parents[t + 1]):
            n_nodes, n = ret.shape
            sums = torch.zeros(n_nodes, n).index_add_(0, parents[t + 1], out[t + 1])
            counts = torch.zeros(n_nodes).index_add_(0, parents[t + 1], torch.ones(len(parents[t + 1])))
            has_children = counts > 0
            ret[has_children] += gamma * sums[has_children] / counts[has_children].unsqueeze(-1)
        out[t] = ret
    return out


# --------------------------------------------------------------------------- #
# KL and rewards
# --------------------------------------------------------------------------- #
def kl_per_token(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k1") -> Tensor:
    """Per-token KL(policy || ref) estimate from sampled-token logprobs.

    k1 is unbiased but can be negative per token; k3 is unbiased and always
    >= 0 (lower variance), see Schulman's "Approximating KL divergence".
    """
    if estimator == "k1":
        return logprobs - ref_logprobs
    if estimator == "k3":
        logr = ref_logprobs - logprobs
        return torch.expm1(logr) - logr  # expm1 is exact for small logr, where exp(x)-1 cancels
    raise ValueError(f"kl_estimator must be one of {_KL_ESTIMATORS}, got {estimator!r}")


def token_level_rewards(scores: Tensor, kl: Tensor, response_mask: Tensor, kl_coef: float) -> tuple[Tensor, Tensor]:
    """Per-token PPO rewards: -kl_coef*kl everywhere valid, score at the last valid token.

    Returns (rewards, non_score_reward), both (B, L), in ``kl``'s dtype.
    The "last valid token" is found as the largest valid index, so it does not
    rely on the mask being a strict prefix. Rows with no valid token get 0.
    """
    k = _to_acc(kl)
    m = _bool_mask(response_mask, k)
    non_score = _zero_masked(-kl_coef * k, m)
    L = k.shape[-1]
    pos = torch.arange(L, device=k.device).expand_as(m)
    last = torch.where(m, pos, torch.full_like(pos, -1)).max(dim=-1).values  # (B,)
    has_valid = last >= 0
    s = scores.to(device=k.device, dtype=k.dtype).reshape(last.shape)
    s = torch.where(has_valid, s, torch.zeros_like(s))
    bonus = torch.zeros_like(k).scatter_(-1, last.clamp(min=0).unsqueeze(-1), s.unsqueeze(-1))
    rewards = non_score + bonus
    return rewards.to(kl.dtype), non_score.to(kl.dtype)
