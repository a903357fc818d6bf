"""Assemble a team from the trainer's flexible arguments (one / list / dict / path + count): agent names,
tokenizers, policies or LoRA adapters on one base, reference policies; and `TeamModel`, the one module tree that
holds everything trainable. The critic is assembled by its own package (`trl_collm.critics.build_critic`).

Every count mismatch is caught here, where the user's input enters, with a message naming the argument.
"""

from __future__ import annotations

import os

from torch import nn

from .agents import AgentTeam, freeze_copy
from .modeling import base_model_of
from .names import check_agent_names
from .pretrained import resolve_model_name


def resolve_agent_names(model, args) -> list[str]:
    if isinstance(model, dict):
        names = check_agent_names(model.keys(), "`model` (a dict name -> model)")
        if args.agent_names is not None and list(args.agent_names) != names:
            raise ValueError(
                f"`model` is a dict with agents {names} but `agent_names`={args.agent_names}; make them agree."
            )
        return names
    if isinstance(model, (list, tuple)):
        if args.agent_names is not None:
            if len(args.agent_names) != len(model):
                raise ValueError(
                    f"`model` lists {len(model)} models but `agent_names` has {len(args.agent_names)} names; give "
                    "one name per model."
                )
            return list(args.agent_names)
        if args.num_agents is not None and args.num_agents != len(model):
            raise ValueError(f"`model` lists {len(model)} models but `num_agents`={args.num_agents}; make them agree.")
        return [f"agent_{i}" for i in range(len(model))]
    if args.agent_names is not None:
        return list(args.agent_names)
    if args.num_agents is not None and args.num_agents > 1:
        return [f"agent_{i}" for i in range(args.num_agents)]
    return ["policy"]  # single agent: behaves like TRL's PPO


def per_agent(value, names: list[str], arg: str, replicate: bool = True) -> dict:
    """Normalize one / list / dict forms to {agent: value}."""
    n = len(names)
    if isinstance(value, dict):
        missing = [a for a in names if a not in value]
        extra = [k for k in value if k not in names]
        if missing or extra:
            raise ValueError(
                f"`{arg}` has keys {list(value)} but the team is {names}; give exactly one entry per agent."
            )
        return {a: value[a] for a in names}
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(
                f"`{arg}` has {len(value)} entries but the team has {n} agents ({', '.join(names)}); give one per "
                "agent."
            )
        return dict(zip(names, value))
    if not replicate and value is not None and n > 1:
        raise ValueError(
            f"`{arg}` is a single object but the team has {n} agents; pass a list or a dict with one per agent."
        )
    return {a: value for a in names}


def load_tokenizer(source, agent: str):
    from transformers import AutoTokenizer

    if source is None:
        raise ValueError(
            f"No tokenizer for agent {agent!r}: pass `processing_class` (one, a list, or a dict by agent name)."
        )
    source = resolve_model_name(source)
    tok = AutoTokenizer.from_pretrained(source) if isinstance(source, (str, os.PathLike)) else source
    check_tokenizer(tok, agent)
    return tok


def check_tokenizer(tok, agent: str):
    if getattr(tok, "pad_token_id", None) is None:
        raise ValueError(
            f"`processing_class` for agent {agent!r} has no pad token. Set one before training, e.g. "
            "`tokenizer.pad_token = tokenizer.eos_token` or `tokenizer.add_special_tokens({'pad_token': '[PAD]'})`."
        )
    if getattr(tok, "eos_token_id", None) is None:
        raise ValueError(f"`processing_class` for agent {agent!r} has no eos token; set `tokenizer.eos_token`.")


def load_causal_lm(source, init_kwargs: dict | None = None):
    from transformers import AutoModelForCausalLM

    if isinstance(source, (str, os.PathLike)):
        return AutoModelForCausalLM.from_pretrained(resolve_model_name(source), **(init_kwargs or {}))
    return source


def model_path(model) -> str | None:
    path = getattr(getattr(base_model_of(model), "config", None), "_name_or_path", None)
    return path or None


def build_team(model, processing_class, ref_model, peft_config, args, names: list[str]) -> AgentTeam:
    from peft import PeftModel, get_peft_model

    n = len(names)
    single_source = not isinstance(model, (list, tuple, dict))
    tokenizer_sources = per_agent(processing_class, names, "processing_class")
    model_sources = {a: model for a in names} if single_source else per_agent(model, names, "model")
    for a in names:
        if tokenizer_sources[a] is None:
            src = model_sources[a]
            tokenizer_sources[a] = src if isinstance(src, (str, os.PathLike)) else model_path(src)
    tokenizers = {a: load_tokenizer(tokenizer_sources[a], a) for a in names}

    shared = single_source and peft_config is not None and not isinstance(peft_config, (list, tuple, dict))
    if shared:
        if isinstance(model, PeftModel):
            raise ValueError(
                "`model` is already a PeftModel; pass the plain base model and `peft_config` to build the team's "
                "adapters."
            )
        base = load_causal_lm(model, args.model_init_kwargs)
        base.requires_grad_(False)
        peft_model = get_peft_model(base, peft_config, adapter_name=names[0])
        for a in names[1:]:
            peft_model.add_adapter(a, peft_config)
        if ref_model is not None:
            raise ValueError(
                "A shared-base LoRA team uses the base (adapters disabled) as reference; pass `ref_model=None`."
            )
        return AgentTeam(names, tokenizers, shared_base=peft_model, share_prefix=args.share_prompt_prefix)

    if single_source:
        if n > 1 and not isinstance(model, (str, os.PathLike)):
            raise ValueError(
                f"`model` is one model object but the team has {n} agents. Pass a list or dict of models, a model path "
                "(loaded once per agent), or a `peft_config` to train n LoRA adapters on this one base."
            )
    policies = {a: load_causal_lm(model_sources[a], args.model_init_kwargs) for a in names}
    peft_configs = per_agent(peft_config, names, "peft_config")
    for a in names:
        if peft_configs[a] is not None and not isinstance(policies[a], PeftModel):
            policies[a] = get_peft_model(policies[a], peft_configs[a])
    refs_in = per_agent(ref_model, names, "ref_model", replicate=False)
    refs = {}
    for a in names:
        ref = refs_in[a]
        if isinstance(ref, (str, os.PathLike)):
            ref = load_causal_lm(ref, args.model_init_kwargs)
        if ref is None and args.uses_reference() and not isinstance(policies[a], PeftModel):
            ref = freeze_copy(policies[a])  # TRL required it; we make one so a missing ref is not an error
        if ref is not None:
            ref.requires_grad_(False)
            ref.eval()
        refs[a] = ref
    return AgentTeam(names, tokenizers, policies=policies, ref_policies=refs, share_prefix=args.share_prompt_prefix)


class TeamModel(nn.Module):
    """Everything trainable in one module tree, so accelerate / DeepSpeed see one model and one optimizer."""

    def __init__(self, team: AgentTeam, critic: nn.Module | None):
        super().__init__()
        self.team = team
        self.critic = critic
        first = team.model_of(team.names[0])
        # transformers.Trainer reads `config` in a few places (model card, logging); the first agent's is
        # representative.
        self.config = base_model_of(first).config

    def forward(self, *args, **kwargs):  # pragma: no cover - the trainers call the team / critic directly
        raise RuntimeError("TeamModel is a container; call its team or critic.")
