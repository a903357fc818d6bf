"""The critic's value statistics: how much of the returns' spread the values explain, and the running mean and
variance that value normalisation (`value_normalization`) scales the critic's targets by.

Moved out of `algorithms` (the estimators and losses, now the package `algorithms/`) so that module keeps room to grow.
"""

import math

import torch
from torch import Tensor

from .algorithms import masked_var

__all__ = ["explained_variance", "RunningMeanStd"]


def _acc(x: Tensor) -> Tensor:
    """Statistics in at least float32 (float64 stays float64), as in `algorithms`."""
    return x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)


def _mask_like(mask: Tensor | None, like: Tensor) -> Tensor:
    """A bool mask broadcast to `like` (all True when None)."""
    if mask is None:
        return torch.ones_like(like, dtype=torch.bool)
    return (mask if mask.dtype == torch.bool else mask != 0).to(like.device).expand_as(like)


# --------------------------------------------------------------------------- #
# diagnostics
# --------------------------------------------------------------------------- #
def explained_variance(values: Tensor, returns: Tensor, mask: Tensor | None = None) -> float:
    """1 - Var(returns - values) / Var(returns); NaN when returns are constant."""
    with torch.no_grad():
        ret = _acc(returns)
        v = _acc(values).to(ret.device).expand_as(ret)
        m = _mask_like(mask, ret)
        var_y = masked_var(ret, m, unbiased=False)
        if float(var_y) == 0.0:
            return math.nan
        var_res = masked_var(ret - v, m, unbiased=False)
        return float(1.0 - var_res / var_y)


# --------------------------------------------------------------------------- #
# running statistics
# --------------------------------------------------------------------------- #
class RunningMeanStd:
    """Running mean/variance of a scalar stream (Chan et al. parallel merge).

    Stored as Python floats (float64 precision) so the object is device-agnostic
    and trivially checkpointable. ``count`` starts at ``epsilon`` with var 1 so
    normalise() is well defined before the first update.
    """

    def __init__(self, epsilon: float = 1e-4):
        self.mean: float = 0.0
        self.var: float = 1.0
        self.count: float = float(epsilon)

    def update(self, x: Tensor, mask: Tensor | None = None) -> None:
        with torch.no_grad():
            xd = x.detach().to(torch.float64)
            m = _mask_like(mask, xd)
            vals = xd[m]
            n = vals.numel()
            if n == 0:
                return
            b_mean = float(vals.mean())
            b_var = float(((vals - b_mean) ** 2).mean())  # population var of the batch
        total = self.count + n
        delta = b_mean - self.mean
        # Merge sums of squared deviations (M2), then renormalise by the new count.
        m2 = self.var * self.count + b_var * n + delta * delta * self.count * n / total
        self.mean = self.mean + delta * n / total
        self.var = m2 / total
        self.count = total

    def normalize(self, x: Tensor) -> Tensor:
        return (x - self.mean) / math.sqrt(self.var + 1e-8)

    def denormalize(self, x: Tensor) -> Tensor:
        return x * math.sqrt(self.var + 1e-8) + self.mean

    def state_dict(self) -> dict:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, d: dict) -> None:
        # float() accepts both Python numbers and 0-d tensors from older checkpoints.
        self.mean = float(d["mean"])
        self.var = float(d["var"])
        self.count = float(d["count"])
