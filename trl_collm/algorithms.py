"""Tensor-level RL building blocks for multi-agent PPO.

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

import torch
from torch import Tensor

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
]

_KL_ESTIMATORS = ("k1", "k3")


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half precision sums drift badly; float64 callers keep their precision.
    return torch.float64 if dtype == torch.float64 else torch.float32


def _to_acc(x: Tensor) -> Tensor:
    return x.to(_acc_dtype(x.dtype))


def _bool_mask(mask: Tensor | None, like: Tensor) -> Tensor:
    """Return a bool mask broadcast to ``like``'s shape (all True if None)."""
    if mask is None:
        return torch.ones_like(like, dtype=torch.bool)
    m = mask if mask.dtype == torch.bool else mask != 0
    return m.to(like.device).expand_as(like)


def _zero_masked(x: Tensor, m: Tensor) -> Tensor:
    # torch.where instead of x * m so NaN/inf in padding never survive (nan*0 = nan).
    return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))


# --------------------------------------------------------------------------- #
# masked statistics
# --------------------------------------------------------------------------- #
def masked_mean(x: Tensor, mask: Tensor | None = None, dim: int | None = None) -> Tensor:
    """Mean of the unmasked entries (over everything, or along ``dim``).

    An all-masked slice yields 0 instead of NaN: a loss over an empty batch
    should contribute nothing rather than poison the optimiser.
    """
    xa = _to_acc(x)
    m = _bool_mask(mask, xa)
    xs = _zero_masked(xa, m)
    if dim is None:
        total, count = xs.sum(), m.sum()
    else:
        total, count = xs.sum(dim=dim), m.sum(dim=dim)
    count = count.to(xa.dtype)
    return torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))


def masked_var(x: Tensor, mask: Tensor | None = None, unbiased: bool = True) -> Tensor:
    """Variance over all unmasked entries.

    With ``unbiased`` the population variance is scaled by n/(n-1); when only a
    single entry is valid there is no correction to apply, so the (zero)
    population variance is returned rather than dividing by zero.
    """
    xa = _to_acc(x)
    m = _bool_mask(mask, xa)
    mean = masked_mean(xa, m)
    var = masked_mean((xa - mean) ** 2, m)
    if unbiased:
        n = m.sum().to(xa.dtype)
        # torch.where keeps this sync-free (no .item()) on accelerators.
        factor = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.ones_like(n))
        var = var * factor
    return var


def whiten(
    x: Tensor,
    mask: Tensor | None = None,
    shift_mean: bool = True,
    unbiased: bool = True,
    eps: float = 1e-8,
) -> Tensor:
    """Normalise to unit variance (and zero mean unless ``shift_mean`` is False).

    ``shift_mean=False`` keeps the original mean, which PPO uses for rewards so
    the sign of the total reward is preserved.
    """
    xa = _to_acc(x)
    m = _bool_mask(mask, xa)
    mean = masked_mean(xa, m)
    var = masked_var(xa, m, unbiased=unbiased)
    out = (xa - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return _zero_masked(out, m).to(x.dtype)


def zscore_by_group(
    x: Tensor,
    group_ids: Tensor,
    mask: Tensor | None = None,
    unbiased: bool = False,
    eps: float = 1e-8,
    std_floor: float | None = None,
) -> Tensor:
    """Z-score ``x`` within each group id (e.g. rollouts sharing a prompt).

    Vectorised with index_add over compacted group indices, so cost is
    independent of the number of groups. Groups with exactly one unmasked
    element are returned unchanged: a singleton has no spread to normalise by
    (and the reference implementation only normalises groups with >1 sample).
    """
    if group_ids.shape != x.shape:
        raise ValueError(f"group_ids shape {tuple(group_ids.shape)} must match x shape {tuple(x.shape)}")
    xa = _to_acc(x)
    m = _bool_mask(mask, xa)
    flat_x = xa.reshape(-1)
    flat_m = m.reshape(-1)
    # Compact arbitrary (possibly negative / sparse) ids to 0..G-1 for index_add.
    uniq, inv = torch.unique(group_ids.reshape(-1).to(xa.device), return_inverse=True)
    num_groups = uniq.numel()

    wm = flat_m.to(xa.dtype)
    xs = _zero_masked(flat_x, flat_m)
    counts = torch.zeros(num_groups, dtype=xa.dtype, device=xa.device).index_add_(0, inv, wm)
    sums = torch.zeros_like(counts).index_add_(0, inv, xs)
    means = sums / counts.clamp(min=1)
    centered = _zero_masked(flat_x - means[inv], flat_m)
    sq = torch.zeros_like(counts).index_add_(0, inv, centered**2)
    if unbiased:
        var = sq / (counts - 1).clamp(min=1)
    else:
        var = sq / counts.clamp(min=1)

    if std_floor is not None:
        denom = var.sqrt().clamp(min=std_floor)
    else:
        denom = torch.sqrt(var + eps)

    normed = (flat_x - means[inv]) / denom[inv]
    multi = counts[inv] > 1
    out = torch.where(multi, normed, flat_x)
    out = _zero_masked(out, flat_m)
    return out.reshape(x.shape).to(x.dtype)


def group_advantages(
    returns: Tensor,
    group_ids: Tensor,
    mask: Tensor | None = None,
    baseline: str = "mean",
    scale: bool = False,
    eps: float = 1e-8,
) -> Tensor:
    """Monte-Carlo advantages: each return minus a baseline computed from its group (e.g. one prompt, agent, turn).

    baseline: "mean" (group mean, MAGRPO), "loo" (mean of the *other* members: unbiased, and a singleton gets 0),
    "max" (A <= 0: only the best sample is not pushed down), "none" (the return itself).
    scale: divide by the group's population std (+eps), GRPO-style; groups with one member are not scaled.
    """
    if baseline not in ("mean", "loo", "max", "none"):
        raise ValueError(f"baseline must be one of ('mean', 'loo', 'max', 'none'), got {baseline!r}")
    if group_ids.shape != returns.shape:
        raise ValueError(f"group_ids shape {tuple(group_ids.shape)} must match returns shape {tuple(returns.shape)}")
    ra = _to_acc(returns)
    m = _bool_mask(mask, ra).reshape(-1)
    flat = _zero_masked(ra.reshape(-1), m)
    uniq, inv = torch.unique(group_ids.reshape(-1).to(ra.device), return_inverse=True)
    wm = m.to(ra.dtype)
    counts = torch.zeros(uniq.numel(), dtype=ra.dtype, device=ra.device).index_add_(0, inv, wm)
    sums = torch.zeros_like(counts).index_add_(0, inv, flat)
    means = sums / counts.clamp(min=1)
    if baseline == "mean":
        base = means[inv]
    elif baseline == "loo":
        others = (counts[inv] - 1).clamp(min=1)
        base = torch.where(counts[inv] > 1, (sums[inv] - flat) / others, flat)
    elif baseline == "max":
        masked = torch.where(m, flat, torch.full_like(flat, float("-inf")))
        maxes = torch.full_like(counts, float("-inf")).scatter_reduce(0, inv, masked, reduce="amax")
        base = maxes[inv]
    else:
        base = torch.zeros_like(flat)
    adv = flat - base
    if scale:
        centered = _zero_masked(flat - means[inv], m)
        var = torch.zeros_like(counts).index_add_(0, inv, centered**2) / counts.clamp(min=1)
        adv = torch.where(counts[inv] > 1, adv / (var.sqrt()[inv] + eps), adv)
    adv = _zero_masked(adv, m)
    return adv.reshape(returns.shape).to(returns.dtype)


NORM_SCOPES = ("agent_turn", "agent", "batch", "none")  # what the advantages are z-scored within


def normalize_by_scope(
    adv: Tensor, mask: Tensor, agent_ids: Tensor, turn_ids: Tensor, scope: str, std_floor: float | None = None
) -> Tensor:
    """The advantages' one normalisation, turn or token level: z-scored within each agent's turn ('agent_turn'), each
    agent ('agent'), the whole batch ('batch'), or left as they are ('none'). `agent_ids` / `turn_ids`: each entry's
    agent and turn (shaped as `adv`). Divided by max(population std, std_floor) when a floor is set (the reference),
    else by sqrt(sample variance + 1e-8); a group of one entry is left as it is (`zscore_by_group`)."""
    if scope not in NORM_SCOPES:
        raise ValueError(f"scope must be one of {NORM_SCOPES}, got {scope!r}")
    if scope == "none":
        return adv
    turns = int(turn_ids.max()) + 1 if turn_ids.numel() else 1
    groups = {"batch": torch.zeros_like(agent_ids), "agent": agent_ids, "agent_turn": agent_ids * turns + turn_ids}
    if std_floor is None:
        return zscore_by_group(adv, groups[scope], mask, unbiased=True)
    return zscore_by_group(adv, groups[scope], mask, unbiased=False, std_floor=std_floor)


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
