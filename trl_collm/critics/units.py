"""Where a critic's parameters live: one class per placement, each owning its body, its trainable parameters, how
it is built and how it is saved.

- `ValueModelUnit` ("separate"): a value model (e.g. `AutoModelForSequenceClassification`); its backbone and `score`
  layer give the values;
- `ActorHeadUnit` ("actor_head"): a linear head on an actor's backbone (the actor's parameters are shared, not copied);
- `SharedBaseAdapterUnit` ("shared_base_adapter"): a LoRA adapter on the team's shared base plus a linear head.

A unit reads its view through its own tokenizer, so agents with different tokenizers can share one centralized critic.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
from torch import nn

from ..team.agents import AgentTeam, adapter_parameters
from ..team.assembly import check_tokenizer, model_path
from ..team.modeling import (
    backbone_of,
    hidden_size_of,
    input_pad_id,
    left_pad,
    score_layer,
    truncate_left,
    value_model_outputs,
)
from ..team.prefix import forward_last
from ..team.pretrained import resolve_model_name
from ..team.saved import save_shared_adapter
from .heads import ValueHead


@dataclass
class UnitSpec:
    """What building one unit needs (filled by the critic layout, see `layouts.build_critic`)."""

    team: AgentTeam
    key: str  # the unit's key in the critic
    owner: str  # the agent whose tokenizer (and, for an actor head, backbone) the unit uses
    num_outputs: int
    value_model: nn.Module | str | None = None  # given by the user (separate placement)
    tokenizer: object | None = None  # given by the user (`critic_processing_class`)
    adapter: str | None = None  # the adapter's name (shared-base placement)
    peft_config: object | None = None
    model_init_kwargs: dict | None = None
    settings: str = ""  # the critic's options, for error messages


class CriticUnit(nn.Module):
    """One critic: text view -> its tokenizer -> hidden states of its body -> head -> values (B, L, k)."""

    placement = ""  # the registry key (`critic_placement`) and the name written to team.json
    shares_actor_weights = False  # True when the body is an actor's: a critic step then moves that actor

    def __init__(self, tokenizer, num_outputs: int, team: AgentTeam):
        super().__init__()
        self.tokenizer = tokenizer
        self.num_outputs = num_outputs
        # Borrowed modules live in the team; keep a plain reference so their parameters are registered once.
        self._team = [team]
        self.max_tokens: int | None = None  # longest view in tokens (set from the body's context length)

    @property
    def team(self) -> AgentTeam:
        return self._team[0]

    # ------------------------------------------------------------------ what each placement says
    @contextlib.contextmanager
    def body(self):
        """Yields the transformer body that reads the view."""
        raise NotImplementedError

    def head_module(self) -> nn.Module:
        raise NotImplementedError

    def context_model(self) -> nn.Module:
        """The model whose context length bounds the views."""
        raise NotImplementedError

    def own_parameters(self) -> list[nn.Parameter]:
        """The parameters this critic trains (for a shared backbone: only the head; the actor owns the body)."""
        raise NotImplementedError

    def save(self, folder: str, part) -> None:
        """Write the unit's weights to `folder`. `part(prefix)` is the gathered state dict under `prefix` (relative to
        this unit) when parameters are partitioned (ZeRO-3), else None (use the live modules)."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {"placement": self.placement, "agent": None, "adapter": None, "num_outputs": self.num_outputs}

    # ------------------------------------------------------------------ shared
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: int) -> torch.Tensor:
        """Values (B, keep, k) of the last `keep` positions of a left-padded batch."""
        with self.body() as body:
            # The team's switch (share_prompt_prefix) covers its critics too.
            hidden = forward_last(
                body, input_ids, attention_mask, keep, causal_lm=False, enabled=self.team.share_prefix
            )
        return self.head_module()(hidden).float()

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each view, cut from the left to the critic's context."""
        ids = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        return [truncate_left(row, self.max_tokens, "critic view") for row in ids]

    def pad(self, rows: list[list[int]], device, suffix_ids: list[list[int]] | None = None):
        """Left-padded critic input; `suffix_ids` (token-level values) are appended after each view."""
        if suffix_ids is not None:
            rows = [ids + suffix for ids, suffix in zip(rows, suffix_ids)]
        return left_pad(rows, input_pad_id(self.tokenizer, self.context_model()), device)


def _save_head(head: nn.Module, folder: str, state: dict | None) -> None:
    from safetensors.torch import save_file

    state = state or head.state_dict()
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    save_file(tensors, os.path.join(folder, "value_head.safetensors"))


class ValueModelUnit(CriticUnit):
    """A separate value model: its body and its score layer."""

    placement = "separate"

    def __init__(self, tokenizer, num_outputs: int, team: AgentTeam, value_model: nn.Module):
        super().__init__(tokenizer, num_outputs, team)
        self.value_model = value_model
        if value_model_outputs(value_model) != num_outputs:
            raise ValueError(
                f"value model has {value_model_outputs(value_model)} outputs but this critic needs {num_outputs}; "
                f"build it with num_labels={num_outputs}."
            )

    @classmethod
    def build(cls, spec: UnitSpec) -> ValueModelUnit:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        team, key, owner, k = spec.team, spec.key, spec.owner, spec.num_outputs
        vm = spec.value_model
        if vm is None:
            path = model_path(team.model_of(owner))
            if not path or not os.path.isdir(path):
                raise ValueError(
                    f"No `value_model` for critic {key!r} and agent {owner!r}'s model has no local folder to build one "
                    "from; pass `value_model` (e.g. AutoModelForSequenceClassification, num_labels=1) or use "
                    "critic_placement='actor_head'."
                )
            vm = path
        if isinstance(vm, (str, os.PathLike)):
            vm = AutoModelForSequenceClassification.from_pretrained(
                resolve_model_name(vm), num_labels=k, **(spec.model_init_kwargs or {})
            )
        if vm.config.pad_token_id is None:
            vm.config.pad_token_id = team.tokenizers[owner].pad_token_id
        if value_model_outputs(vm) != k:
            raise ValueError(
                f"`value_model` for critic {key!r} has {value_model_outputs(vm)} outputs; this critic "
                f"({spec.settings}) needs {k}. Rebuild it with num_labels={k}."
            )
        tok = spec.tokenizer
        if tok is None:
            vm_path = model_path(vm)
            own = AutoTokenizer.from_pretrained(vm_path) if vm_path and os.path.isdir(vm_path) else None
            # TRL's PPO read the value model through `processing_class`: keep the agent's tokenizer whenever it
            # extends the value model's own (e.g. a script added a pad token to it), else use the model's own.
            tok = team.tokenizers[owner] if own is None or extends(team.tokenizers[owner], own) else own
        elif isinstance(tok, (str, os.PathLike)):
            tok = AutoTokenizer.from_pretrained(resolve_model_name(tok))
        check_tokenizer(tok, f"critic {key}")
        return cls(tok, k, team, vm)

    @contextlib.contextmanager
    def body(self):
        yield backbone_of(self.value_model)

    def head_module(self) -> nn.Module:
        return score_layer(self.value_model)

    def context_model(self) -> nn.Module:
        return self.value_model

    def own_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.value_model.parameters() if p.requires_grad]

    def save(self, folder: str, part) -> None:
        self.value_model.save_pretrained(folder, state_dict=part("value_model."))


class _TeamBodyUnit(CriticUnit):
    """A value head on a body the team holds, selected by `team.active(name)` (an agent, or an adapter)."""

    def __init__(self, tokenizer, num_outputs: int, team: AgentTeam, body_name: str, hidden_size: int):
        super().__init__(tokenizer, num_outputs, team)
        self._body_name = body_name
        self.head = ValueHead(hidden_size, num_outputs)

    @contextlib.contextmanager
    def body(self):
        with self.team.active(self._body_name) as model:
            yield backbone_of(model)

    def head_module(self) -> nn.Module:
        return self.head

    def own_parameters(self) -> list[nn.Parameter]:
        return list(self.head.parameters())

    def save(self, folder: str, part) -> None:
        _save_head(self.head, folder, part("head."))


class ActorHeadUnit(_TeamBodyUnit):
    """A value head on an actor's backbone; the actor trains the backbone, the critic only its head."""

    placement = "actor_head"
    shares_actor_weights = True

    def __init__(self, tokenizer, num_outputs: int, team: AgentTeam, agent: str):
        super().__init__(tokenizer, num_outputs, team, agent, hidden_size_of(team.model_of(agent)))
        self.agent = agent

    @classmethod
    def build(cls, spec: UnitSpec) -> ActorHeadUnit:
        return cls(spec.team.tokenizers[spec.owner], spec.num_outputs, spec.team, spec.owner)

    def context_model(self) -> nn.Module:
        return self.team.model_of(self.agent)

    def describe(self) -> dict:
        return dict(super().describe(), agent=self.agent)


class SharedBaseAdapterUnit(_TeamBodyUnit):
    """One more LoRA adapter on the team's shared base, plus a value head: the critic trains both."""

    placement = "shared_base_adapter"

    def __init__(self, tokenizer, num_outputs: int, team: AgentTeam, adapter: str):
        super().__init__(tokenizer, num_outputs, team, adapter, hidden_size_of(team.shared_base))
        self.adapter = adapter

    @classmethod
    def build(cls, spec: UnitSpec) -> SharedBaseAdapterUnit:
        if spec.team.layout != "shared_base":
            raise ValueError(
                "`critic_placement='shared_base_adapter'` needs a shared-base LoRA team (one model + `peft_config`)."
            )
        spec.team.add_adapter(spec.adapter, spec.peft_config)
        return cls(spec.team.tokenizers[spec.owner], spec.num_outputs, spec.team, spec.adapter)

    def context_model(self) -> nn.Module:
        return self.team.shared_base

    def own_parameters(self) -> list[nn.Parameter]:
        return super().own_parameters() + adapter_parameters(self.team.shared_base, self.adapter)

    def save(self, folder: str, part) -> None:
        super().save(folder, part)
        save_shared_adapter(self.team.shared_base, self.adapter, folder, part("team.shared_base.", absolute=True))

    def describe(self) -> dict:
        return dict(super().describe(), adapter=self.adapter)


# critic_placement -> unit class. A new placement is one CriticUnit subclass with `build` plus a line here.
PLACEMENTS: dict[str, type[CriticUnit]] = {
    cls.placement: cls for cls in (ValueModelUnit, ActorHeadUnit, SharedBaseAdapterUnit)
}


def extends(tokenizer, base) -> bool:
    """Whether `tokenizer` gives every token of `base` the same id (it is `base` plus added tokens)."""
    vocab = tokenizer.get_vocab()
    return all(vocab.get(token) == i for token, i in base.get_vocab().items())
