"""Value heads and how to find a model's body, hidden size and score layer."""

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


def backbone_of(model: nn.Module) -> nn.Module:
    """The transformer body of a CausalLM / SequenceClassification model (through PEFT wrappers)."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    prefix = getattr(model, "base_model_prefix", "model")
    body = getattr(model, prefix, None)
    if body is None:
        raise ValueError(f"Cannot find the backbone (`{prefix}`) of {type(model).__name__} to put a value head on.")
    return body


def hidden_size_of(model: nn.Module) -> int:
    config = model.config
    for key in ("hidden_size", "n_embd", "d_model"):
        if hasattr(config, key):
            return int(getattr(config, key))
    raise ValueError(f"Cannot read the hidden size of {type(model).__name__}.")


def score_layer(model: nn.Module) -> nn.Module:
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    for attr in ("score", "classifier", "v_head", "value_head"):
        layer = getattr(model, attr, None)
        if isinstance(layer, nn.Module):
            return layer
    raise ValueError(
        f"Value model {type(model).__name__} has no `score`/`classifier` layer; pass an "
        "AutoModelForSequenceClassification or AutoModelForTokenClassification with num_labels=1."
    )


def value_model_outputs(model: nn.Module) -> int:
    layer = score_layer(model)
    return int(getattr(layer, "out_features", getattr(model.config, "num_labels", 1)))
