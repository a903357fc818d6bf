"""The losses: PPO's clipped policy loss, REINFORCE, GRPO's token losses and loss types, the scaled advantages GRPO
feeds them, the importance-sampling weights of an engine's sampler log-probs, the clipped value loss. The package's
conventions (masks, precision) are in `trl_collm/algorithms/__init__.py`.
"""

import torch
from torch import Tensor

from .masked import _bool_mask, _to_acc, _zero_masked, group_advantages, masked_mean, masked_var
from .returns import kl_per_token


# --------------------------------------------------------------------------- #
# losses
# --------------------------------------------------------------------------- #
def _expand_adv(advantages: Tensor, like: Tensor) -> Tensor:
    # (B,) per-sequence advantages apply to every token of the sequence.
    a = _to_acc(advantages).to(like.device)
    if a.dim() == like.dim() - 1:
        a = a.unsqueeze(-1)
    return a.expand_as(like)


def policy_loss_clipped(
    new_logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cliprange: float | None,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate loss (to minimise) plus detached diagnostics.

    Advantages are detached: they are targets, and a gradient leaking into a
    shared value head through them would silently change the objective.
    `token_weights`: (B, L) constants multiplying each token's loss (the importance-sampling correction).
    """
    new = _to_acc(new_logprobs)
    m = _bool_mask(mask, new)
    diff = _zero_masked(new - _to_acc(old_logprobs).to(new.device), m)
    ratio = torch.exp(diff)
    adv = _zero_masked(_expand_adv(advantages.detach(), new), m)
    l1 = -adv * ratio
    if cliprange is None:
        l2 = l1
    else:
        l2 = -adv * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    per_token = torch.max(l1, l2)
    if token_weights is not None:
        per_token = per_token * _to_acc(token_weights.detach()).to(new.device)
    loss = masked_mean(per_token, m)
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean((l2 > l1).to(new.dtype), m),
            "approxkl": 0.5 * masked_mean(diff**2, m),
            "ratio_mean": masked_mean(ratio, m),
            "ratio_var": masked_var(ratio, m, unbiased=False),
        }
    return loss, {k: v.detach() for k, v in stats.items()}


def policy_loss_reinforce(
    new_logprobs: Tensor, advantages: Tensor, mask: Tensor, token_weights: Tensor | None = None
) -> Tensor:
    """REINFORCE: mean over sequences of -(sum of valid-token logprobs) * A.

    Summing (not averaging) over tokens matches the reference rule, so each
    valid token gets gradient -A/B. Advantages are detached (constants).
    `token_weights`: (B, L) constants multiplying each token's term (the importance-sampling correction).
    """
    lp = _to_acc(new_logprobs)
    if token_weights is not None:
        lp = lp * _to_acc(token_weights.detach()).to(lp.device)
    m = _bool_mask(mask, lp)
    seq_lp = _zero_masked(lp, m).sum(dim=-1)
    adv = _to_acc(advantages.detach()).to(lp.device).reshape(seq_lp.shape)
    return (-(seq_lp * adv)).mean()


# GRPO's loss types, by what the summed token losses are divided by (TRL's GRPOTrainer, written here in our own terms)
GRPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def grpo_token_loss(
    new_logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
    token_weights: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: str = "k3",
    kl_times_ratio: bool = True,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GRPO's per-token loss (B, L), zero on masked tokens: -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) with the
    ratio r = exp(new - old) (capped at `delta` first when given), times `token_weights` (the importance-sampling
    correction), plus beta x KL(new || ref) per token (times r, with its gradient, when `kl_times_ratio`: GRPO's
    `use_bias_correction_kl`). Diagnostics (detached): the per-token `kl`, and the clipped tokens `low`
    (r < 1 - eps_low, A < 0) and `high` (r > 1 + eps_high, A > 0)."""
    new = _to_acc(new_logprobs)
    m = _bool_mask(mask, new)
    ratio = torch.exp(_zero_masked(new - _to_acc(old_logprobs).to(new.device), m))
    adv = _zero_masked(_expand_adv(advantages.detach(), new), m)
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    capped = ratio if delta is None else torch.clamp(ratio, max=delta)
    per_token = -torch.min(capped * adv, clipped * adv)
    if token_weights is not None:
        per_token = per_token * _to_acc(token_weights.detach()).to(new.device)
    stats = {"low": (ratio < 1.0 - epsilon_low) & (adv < 0) & m, "high": (ratio > 1.0 + epsilon_high) & (adv > 0) & m}
    if beta != 0:
        kl = kl_per_token(new, _to_acc(ref_logprobs).to(new.device), kl_estimator)
        kl = kl * ratio if kl_times_ratio else kl
        per_token = per_token + beta * kl
        stats["kl"] = _zero_masked(kl, m)
    return _zero_masked(per_token, m), {k: v.detach() for k, v in stats.items()}


def normalised_token_loss(
    per_token: Tensor,
    mask: Tensor,
    loss_type: str,
    max_completion_length: int | None = None,
    num_tokens: Tensor | float | None = None,
) -> Tensor:
    """The summed token losses divided as GRPO's `loss_type` says: 'grpo' each row's token mean, then the mean over
    rows; 'bnpo' the token mean of these rows; 'dr_grpo' the token sum over rows x `max_completion_length`; 'dapo'
    the token sum over `num_tokens`, the valid tokens of everything one optimizer step sees (these rows' own by
    default)."""
    x = _to_acc(per_token)
    m = _bool_mask(mask, x)
    x = _zero_masked(x, m)
    tokens = m.to(x.dtype)
    if loss_type == "grpo":
        return (x.sum(-1) / tokens.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return x.sum() / tokens.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("loss_type 'dr_grpo' divides by rows x max_completion_length; pass max_completion_length.")
        return x.sum() / (x.shape[0] * max_completion_length)
    if loss_type == "dapo":
        n = tokens.sum() if num_tokens is None else torch.as_tensor(num_tokens, dtype=x.dtype, device=x.device)
        return x.sum() / n.clamp(min=1.0)
    raise ValueError(f"loss_type must be one of {GRPO_LOSS_TYPES}, got {loss_type!r}")


def grpo_scaled_advantages(
    returns: Tensor, group_ids: Tensor, mask: Tensor | None, baseline: str, scale_rewards: str
) -> Tensor:
    """GRPO's `scale_rewards`: the group-baseline advantages (`group_advantages`, unscaled) divided by GRPO's std +
    1e-4 (the unbiased std of the group, 'group', or of every valid return, 'batch'); 'none' leaves them as they are.
    A group (or batch) of one has std 0 here, as GRPO's nanstd would not."""
    adv = group_advantages(returns, group_ids, mask, baseline, scale=False)
    if scale_rewards == "none":
        return adv
    if scale_rewards not in ("group", "batch"):
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
    ra = _to_acc(returns).reshape(-1)
    m = _bool_mask(mask, _to_acc(returns)).reshape(-1)
    ids = group_ids.reshape(-1).to(ra.device) if scale_rewards == "group" else torch.zeros_like(ra, dtype=torch.long)
    uniq, inv = torch.unique(ids, return_inverse=True)
    wm = m.to(ra.dtype)
    counts = torch.zeros(uniq.numel(), dtype=ra.dtype, device=ra.device).index_add_(0, inv, wm)
    means = torch.zeros_like(counts).index_add_(0, inv, _zero_masked(ra, m)) / counts.clamp(min=1)
    centered = _zero_masked(ra - means[inv], m)
    var = torch.zeros_like(counts).index_add_(0, inv, centered**2) / (counts - 1).clamp(min=1)
    scaled = _to_acc(adv).reshape(-1) / (var.sqrt()[inv] + 1e-4)
    return _zero_masked(scaled, m).reshape(returns.shape).to(returns.dtype)


IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def importance_sampling_weights(
    trainer_logprobs: Tensor,
    sampler_logprobs: Tensor,
    mask: Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> Tensor:
    """(B, L) weights correcting for tokens sampled by an engine whose numerics differ from the trainer's (TRL GRPO's
    `vllm_importance_sampling_*`): the ratio pi_trainer / pi_sampler per token (`token_*`) or per response (the
    product over its tokens, `sequence_*`), clipped to [clip_min, clip_max] (`*_truncate`) or zeroed outside it
    (`*_mask`). A bound left None is not applied. Zero on masked tokens."""
    if mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"importance-sampling mode {mode!r} is not one of {IMPORTANCE_SAMPLING_MODES}.")
    m = _bool_mask(mask, trainer_logprobs)
    log_ratio = _zero_masked(_to_acc(trainer_logprobs) - _to_acc(sampler_logprobs).to(trainer_logprobs.device), m)
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(m)
    ratio = torch.exp(log_ratio)
    if mode.endswith("truncate"):
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        keep = torch.ones_like(m)
        if clip_min is not None:
            keep = keep & (ratio >= clip_min)
        if clip_max is not None:
            keep = keep & (ratio <= clip_max)
        ratio = ratio * keep
    return _zero_masked(ratio, m).detach()


def value_loss_clipped(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor | None,
    cliprange_value: float | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped value loss: 0.5 * mean(max(unclipped, clipped) squared error)."""
    v = _to_acc(values)
    m = _bool_mask(mask, v)
    old = _zero_masked(_to_acc(old_values).to(v.device).expand_as(v), m)
    ret = _zero_masked(_to_acc(returns).to(v.device).expand_as(v), m)
    v = _zero_masked(v, m)
    err1 = (v - ret) ** 2
    if cliprange_value is None:
        loss = 0.5 * masked_mean(err1, m)
        clipfrac = torch.zeros((), dtype=v.dtype, device=v.device)
    else:
        # clamp(v, old - c, old + c) rather than old + clamp(v - old, -c, c): the same number when clipped, but an
        # unclipped value stays exactly v, so rounding in `old + (v - old)` cannot count it as clipped.
        v_clipped = torch.clamp(v, old - cliprange_value, old + cliprange_value)
        err2 = (v_clipped - ret) ** 2
        loss = 0.5 * masked_mean(torch.max(err1, err2), m)
        clipfrac = masked_mean((err2 > err1).to(v.dtype), m)
    return loss, {"clipfrac": clipfrac.detach()}
