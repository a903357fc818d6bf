"""Guards that keep non-finite numbers away from the weights and from checkpoints.

A reward that is finite as a Python float can still overflow float32 (1e39); a product of finite weights can
overflow; a learning rate can make one update explode. Each guard here names what it found, so the error says
which reward function, episode, parameter or file is at fault.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def fits_float32(value: float) -> bool:
    """Whether a Python float stays finite once stored as float32 (the dtype rewards are used in)."""
    return math.isfinite(value) and abs(value) <= FLOAT32_MAX


def first_nonfinite(named: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """Name of the first tensor holding NaN or +-inf, or None when all are finite."""
    for name, tensor in named:
        if tensor is not None and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return name
    return None


def gradients_finite(params: Iterable[torch.nn.Parameter]) -> bool:
    """One device sync for all gradients: the sum of per-tensor norms is finite iff every entry is."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return True
    norms = torch._foreach_norm(grads)
    return bool(torch.isfinite(torch.stack([n.float() for n in norms])).all())


def optimizer_state_nonfinite(state_dict: dict) -> str | None:
    """'state[i].key' of the first non-finite tensor in an optimizer state_dict (AdamW's moments), else None."""
    for index, slot in state_dict.get("state", {}).items():
        for key, value in slot.items():
            if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
                return f"state[{index}].{key}"
    return None


class NonFiniteSteps:
    """Counts optimizer steps skipped because a loss or gradient was non-finite; raises after `limit` in a row."""

    def __init__(self, limit: int):
        self.limit = limit
        self.in_a_row = 0
        self.skipped_this_iteration = 0

    def skipped(self, what: str) -> None:
        self.in_a_row += 1
        self.skipped_this_iteration += 1
        if self.in_a_row >= self.limit:
            raise FloatingPointError(
                f"non-finite {what} on {self.in_a_row} optimizer steps in a row (max_nonfinite_steps={self.limit}); "
                "the weights were left untouched. Lower the learning rate, check the rewards and reward weights, or "
                "raise max_nonfinite_steps to tolerate more."
            )

    def stepped(self) -> None:
        self.in_a_row = 0

    def take_iteration_count(self) -> int:
        n, self.skipped_this_iteration = self.skipped_this_iteration, 0
        return n
