"""What every floor asks of a transformers model: its base (through PEFT), body, hidden size, score layer and context
length; the id its padding uses; left padding and left truncation of token rows; PEFT's adapter folder flattened.

A leaf: it imports torch and nothing of trl_collm, so the team, the critics, the environments, the sampler and the
saved-team format can all use it without importing one another (tests/test_house_rules.py keeps it a leaf).
"""

from __future__ import annotations

import os
import shutil
import warnings

import torch
from torch import nn


# ------------------------------------------------------------------------------------------ model introspection
def base_model_of(model: nn.Module) -> nn.Module:
    """The transformers model inside a PEFT wrapper (the model itself when it is not wrapped)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def backbone_of(model: nn.Module) -> nn.Module:
    """The transformer body of a CausalLM / SequenceClassification model (through PEFT wrappers)."""
    model = base_model_of(model)
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
    model = base_model_of(model)
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


def max_positions(model: nn.Module) -> int | None:
    """The context length a model was built for (None when its config does not say)."""
    config = getattr(base_model_of(model), "config", None)
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def input_pad_id(tokenizer, model: nn.Module) -> int:
    """The id that fills padded positions of `model`'s inputs. Padding is masked, so any id the model can embed
    will do: the tokenizer's pad id when the embedding table has a row for it, else its eos id (or 0). A script may
    add a pad token without resizing the model (TRL's PPO example always adds "[PAD]"; Llama-shaped models have no
    spare embedding rows), and that id must never reach the embedding."""
    rows = None
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is not None and hasattr(embeddings, "num_embeddings"):
        rows = embeddings.num_embeddings
    for candidate in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None), 0):
        if candidate is not None and (rows is None or 0 <= candidate < rows):
            return int(candidate)
    return 0


# ------------------------------------------------------------------------------------------------- token rows
def truncate_left(ids: list[int], limit: int | None, what: str) -> list[int]:
    """Keep the last `limit` tokens (the end holds the latest turn), with a warning: a cut prompt is worth knowing."""
    if limit is None or len(ids) <= limit:
        return ids
    warnings.warn(
        f"{what} has {len(ids)} tokens; keeping the last {limit} (max_prompt_length / the model's context).",
        stacklevel=2,
    )
    return ids[-limit:]


def left_pad(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of token ids -> (ids, attention mask), both (B, longest row), padded on the left."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = 1
    return ids.to(device), mask.to(device)


def unpad_rows(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """The inverse of `left_pad`: each row's unmasked ids."""
    return [row[m.bool()].tolist() for row, m in zip(ids, mask)]


# ------------------------------------------------------------------------------------------------------- saving
def flatten_adapter_folder(path: str, name: str) -> None:
    """PEFT saves non-default adapters under path/<name>/; move them up so the folder loads with from_pretrained."""
    nested = os.path.join(path, name)
    if os.path.isdir(nested):
        for entry in os.listdir(nested):
            shutil.move(os.path.join(nested, entry), os.path.join(path, entry))
        os.rmdir(nested)
