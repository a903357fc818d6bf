"""Critics: value heads and the two critic layouts.

CC vs DC is a choice of *view* (which text the critic reads, see `views.py`) and of *parameters* (one critic or one per
agent), not a different trainer. A critic reads its view through its own tokenizer, so agents with different
tokenizers can share one centralized critic.

Where a critic's parameters live (`placement`):
- "separate": a value model (e.g. `AutoModelForSequenceClassification`); its backbone and `score` layer give values;
- "actor_head": a linear head on an actor's backbone (the actor's parameters are shared, not copied);
- "shared_base_adapter": a LoRA adapter on the team's shared base plus a linear head.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from .prefix import forward_last
from .team import AgentTeam, _left_pad, truncate_left


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


def _score_layer(model: nn.Module) -> nn.Module:
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
    layer = _score_layer(model)
    return int(getattr(layer, "out_features", getattr(model.config, "num_labels", 1)))


class CriticUnit(nn.Module):
    """One critic: text view -> hidden states -> values (B, L, k)."""

    def __init__(self, placement: str, tokenizer, num_outputs: int, *, team: AgentTeam, value_model=None,
                 agent: str | None = None, adapter: str | None = None):
        super().__init__()
        self.placement = placement
        self.tokenizer = tokenizer
        self.num_outputs = num_outputs
        # Borrowed modules live in the team; keep plain references so their parameters are registered once.
        self._team = [team]
        self.agent = agent
        self.adapter = adapter
        self.max_tokens: int | None = None  # longest view in tokens (set by the trainer from the model's context)
        if placement == "separate":
            self.value_model = value_model
            if value_model_outputs(value_model) != num_outputs:
                raise ValueError(
                    f"value model has {value_model_outputs(value_model)} outputs but this critic needs {num_outputs}; "
                    f"build it with num_labels={num_outputs}."
                )
        elif placement == "actor_head":
            self.head = ValueHead(hidden_size_of(team.model_of(agent)), num_outputs)
        elif placement == "shared_base_adapter":
            self.head = ValueHead(hidden_size_of(team.shared_base), num_outputs)
        else:  # pragma: no cover - validated by the config
            raise ValueError(placement)

    @contextlib.contextmanager
    def _body(self):
        team = self._team[0]
        if self.placement == "separate":
            yield backbone_of(self.value_model)
        elif self.placement == "actor_head":
            with team.active(self.agent) as model:
                yield backbone_of(model)
        else:
            with team.active(self.adapter) as model:
                yield backbone_of(model)

    def head_module(self) -> nn.Module:
        return _score_layer(self.value_model) if self.placement == "separate" else self.head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: int) -> torch.Tensor:
        """Values (B, keep, k) of the last `keep` positions of a left-padded batch."""
        with self._body() as body:
            # The team's switch (share_prompt_prefix) covers its critics too.
            hidden = forward_last(body, input_ids, attention_mask, keep, causal_lm=False, enabled=self._team[0].share_prefix)
        return self.head_module()(hidden).float()

    def own_parameters(self) -> list[nn.Parameter]:
        """The parameters this critic trains (for a shared backbone: only the head; the actor owns the body)."""
        if self.placement == "separate":
            return [p for p in self.value_model.parameters() if p.requires_grad]
        params = list(self.head.parameters())
        if self.placement == "shared_base_adapter":
            base = self._team[0].shared_base
            params += [p for n, p in base.named_parameters() if "lora_" in n and f".{self.adapter}." in n]
        return params

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each view, cut from the left to the critic's context."""
        ids = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        return [truncate_left(row, self.max_tokens, "critic view") for row in ids]

    def pad(self, rows: list[list[int]], device, suffix_ids: list[list[int]] | None = None):
        """Left-padded critic input; `suffix_ids` (token-level values) are appended after each view."""
        if suffix_ids is not None:
            rows = [ids + suffix for ids, suffix in zip(rows, suffix_ids)]
        return _left_pad(rows, self.tokenizer.pad_token_id, device)


class TeamCritic(nn.Module):
    """All critics of a run, keyed by critic id: "central" for CC, the agent names for DC."""

    def __init__(self, critic_type: str, units: dict[str, CriticUnit], value_mode: str, agent_names: list[str]):
        super().__init__()
        self.critic_type = critic_type
        self.value_mode = value_mode
        self.agent_names = list(agent_names)
        self.units = nn.ModuleDict(units)

    def key_for(self, agent: str) -> str:
        return "central" if self.critic_type == "centralized" else agent

    def output_index(self, agent: str) -> int:
        """Which output of the critic's head values `agent`."""
        if self.critic_type == "centralized" and self.value_mode == "per_agent_heads":
            return self.agent_names.index(agent)
        return 0

    def unit_parameters(self) -> dict[str, list[nn.Parameter]]:
        return {k: u.own_parameters() for k, u in self.units.items()}
