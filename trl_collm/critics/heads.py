"""The value head a critic puts on a body (finding the body and its size is `trl_collm.team.modeling`'s)."""

from __future__ import annotations

import torch
from torch import nn


class ValueHead(nn.Module):
    """hidden (…, H) -> values (…, k). Zero-initialised so a fresh critic predicts 0 and does not inject noise."""

    def __init__(self, hidden_size: int, num_outputs: int = 1):
        super().__init__()
        self.summary = nn.Linear(hidden_size, num_outputs)
        nn.init.zeros_(self.summary.weight)
        nn.init.zeros_(self.summary.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.summary(hidden.to(self.summary.weight.dtype))
