"""Masked statistics and the advantages' normalisations: the mask helpers every estimator and loss of this package
uses (accumulation dtype, bool masks, zeroing masked entries), `masked_mean` / `masked_var`, `whiten`,
`zscore_by_group`, `group_advantages` and `normalize_by_scope` (the one normalisation by scope, turn and token level).
The package's conventions (masks, precision) are in `trl_collm/algorithms/__init__.py`.
"""

import torch
from torch import Tensor


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
