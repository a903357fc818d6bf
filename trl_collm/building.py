"""Turn the trainer's flexible arguments (one / list / dict / path + count) into an `AgentTeam` and a `TeamCritic`.

Every count mismatch is caught here, where the user's input enters, with a message naming the argument.
"""

from __future__ import annotations

import os

from torch import nn

from .critics import CriticUnit, TeamCritic, value_model_outputs
from .team import AgentTeam, _set_adapter_keep_grads, freeze_copy


def resolve_agent_names(model, args) -> list[str]:
    if isinstance(model, dict):
        names = list(model.keys())
        if args.agent_names is not None and list(args.agent_names) != names:
            raise ValueError(f"`model` is a dict with agents {names} but `agent_names`={args.agent_names}; make them agree.")
        return names
    if isinstance(model, (list, tuple)):
        if args.agent_names is not None:
            if len(args.agent_names) != len(model):
                raise ValueError(
                    f"`model` lists {len(model)} models but `agent_names` has {len(args.agent_names)} names; give one name per model."
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
            raise ValueError(f"`{arg}` has keys {list(value)} but the team is {names}; give exactly one entry per agent.")
        return {a: value[a] for a in names}
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"`{arg}` has {len(value)} entries but the team has {n} agents ({', '.join(names)}); give one per agent.")
        return dict(zip(names, value))
    if not replicate and value is not None and n > 1:
        raise ValueError(f"`{arg}` is a single object but the team has {n} agents; pass a list or a dict with one per agent.")
    return {a: value for a in names}


def load_tokenizer(source, agent: str):
    from transformers import AutoTokenizer

    if source is None:
        raise ValueError(f"No tokenizer for agent {agent!r}: pass `processing_class` (one, a list, or a dict by agent name).")
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


def _load_causal_lm(source, init_kwargs: dict | None = None):
    from transformers import AutoModelForCausalLM

    if isinstance(source, (str, os.PathLike)):
        return AutoModelForCausalLM.from_pretrained(source, **(init_kwargs or {}))
    return source


def _model_path(model) -> str | None:
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    path = getattr(getattr(model, "config", None), "_name_or_path", None)
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
            tokenizer_sources[a] = src if isinstance(src, (str, os.PathLike)) else _model_path(src)
    tokenizers = {a: load_tokenizer(tokenizer_sources[a], a) for a in names}

    shared = single_source and peft_config is not None and not isinstance(peft_config, (list, tuple, dict))
    if shared:
        if isinstance(model, PeftModel):
            raise ValueError("`model` is already a PeftModel; pass the plain base model and `peft_config` to build the team's adapters.")
        base = _load_causal_lm(model, args.model_init_kwargs)
        base.requires_grad_(False)
        peft_model = get_peft_model(base, peft_config, adapter_name=names[0])
        for a in names[1:]:
            peft_model.add_adapter(a, peft_config)
        if ref_model is not None:
            raise ValueError("A shared-base LoRA team uses the base (adapters disabled) as reference; pass `ref_model=None`.")
        return AgentTeam(names, tokenizers, shared_base=peft_model)

    if single_source:
        if n > 1 and not isinstance(model, (str, os.PathLike)):
            raise ValueError(
                f"`model` is one model object but the team has {n} agents. Pass a list or dict of models, a model path "
                "(loaded once per agent), or a `peft_config` to train n LoRA adapters on this one base."
            )
    policies = {a: _load_causal_lm(model_sources[a], args.model_init_kwargs) for a in names}
    peft_configs = per_agent(peft_config, names, "peft_config")
    for a in names:
        if peft_configs[a] is not None and not isinstance(policies[a], PeftModel):
            policies[a] = get_peft_model(policies[a], peft_configs[a])
    refs_in = per_agent(ref_model, names, "ref_model", replicate=False)
    refs = {}
    for a in names:
        ref = refs_in[a]
        if isinstance(ref, (str, os.PathLike)):
            ref = _load_causal_lm(ref, args.model_init_kwargs)
        if ref is None and args.uses_reference() and not isinstance(policies[a], PeftModel):
            ref = freeze_copy(policies[a])  # TRL required it; we make one so a missing ref is not an error
        if ref is not None:
            ref.requires_grad_(False)
            ref.eval()
        refs[a] = ref
    return AgentTeam(names, tokenizers, policies=policies, ref_policies=refs)


def critic_outputs(args, n: int) -> int:
    if args.critic_type == "centralized" and args.centralized_value == "per_agent_heads":
        return n
    return 1


def build_critic(team: AgentTeam, value_model, args, peft_config, critic_processing_class=None) -> TeamCritic:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    names = team.names
    n = len(names)
    # A given value model decides the placement (TRL's PPO script passes one even with PEFT); else a LoRA team's
    # critic is one more adapter on the shared base.
    placement = args.critic_placement or ("shared_base_adapter" if team.layout == "shared_base" and value_model is None else "separate")
    if placement == "shared_base_adapter" and team.layout != "shared_base":
        raise ValueError("`critic_placement='shared_base_adapter'` needs a shared-base LoRA team (one model + `peft_config`).")
    k = critic_outputs(args, n)
    keys = ["central"] if args.critic_type == "centralized" else list(names)
    backbone_agent = {key: (args.critic_backbone_agent or names[0]) if key == "central" else key for key in keys}
    if args.critic_backbone_agent is not None and args.critic_backbone_agent not in names:
        raise ValueError(f"`critic_backbone_agent`={args.critic_backbone_agent!r} is not one of the agents {names}.")

    if value_model is not None and placement != "separate":
        raise ValueError(f"`value_model` was given but `critic_placement`={placement!r}; set critic_placement='separate' or drop value_model.")
    if args.critic_type == "centralized":
        if isinstance(value_model, (list, tuple)) and len(value_model) != 1:
            raise ValueError(f"A centralized critic is one model but `value_model` lists {len(value_model)}; pass one value model.")
        if isinstance(value_model, dict):
            raise ValueError("A centralized critic is one model; pass one `value_model`, not a dict.")
        value_models = {"central": value_model[0] if isinstance(value_model, (list, tuple)) else value_model}
    else:
        value_models = per_agent(value_model, names, "value_model", replicate=False)
    tok_sources = (
        {"central": critic_processing_class}
        if args.critic_type == "centralized"
        else per_agent(critic_processing_class, names, "critic_processing_class")
    )

    units = {}
    for key in keys:
        owner = backbone_agent[key]
        if placement == "separate":
            vm = value_models[key]
            if vm is None:
                path = _model_path(team.model_of(owner))
                if not path or not os.path.isdir(path):
                    raise ValueError(
                        f"No `value_model` for critic {key!r} and agent {owner!r}'s model has no local folder to build one from; "
                        "pass `value_model` (e.g. AutoModelForSequenceClassification, num_labels=1) or use critic_placement='actor_head'."
                    )
                vm = path
            if isinstance(vm, (str, os.PathLike)):
                vm = AutoModelForSequenceClassification.from_pretrained(vm, num_labels=k, **(args.model_init_kwargs or {}))
            if vm.config.pad_token_id is None:
                vm.config.pad_token_id = team.tokenizers[owner].pad_token_id
            if value_model_outputs(vm) != k:
                raise ValueError(
                    f"`value_model` for critic {key!r} has {value_model_outputs(vm)} outputs; this critic "
                    f"(critic_type={args.critic_type!r}, centralized_value={args.centralized_value!r}) needs {k}. Rebuild it with num_labels={k}."
                )
            tok = tok_sources[key]
            if tok is None:
                vm_path = _model_path(vm)
                tok = AutoTokenizer.from_pretrained(vm_path) if vm_path and os.path.isdir(vm_path) else team.tokenizers[owner]
            elif isinstance(tok, (str, os.PathLike)):
                tok = AutoTokenizer.from_pretrained(tok)
            check_tokenizer(tok, f"critic {key}")
            units[key] = CriticUnit("separate", tok, k, value_model=vm, team=team)
        elif placement == "actor_head":
            units[key] = CriticUnit("actor_head", team.tokenizers[owner], k, team=team, agent=owner)
        else:
            adapter = "critic" if key == "central" else f"critic_{key}"
            team.shared_base.add_adapter(adapter, peft_config)
            team.extra_adapters.append(adapter)
            # add_adapter creates the critic adapter frozen; make it (and keep the agents') trainable.
            _set_adapter_keep_grads(team.shared_base, team.shared_base.active_adapter, team.trainable_adapters())
            units[key] = CriticUnit("shared_base_adapter", team.tokenizers[owner], k, team=team, adapter=adapter)
    return TeamCritic(args.critic_type, units, args.centralized_value, names)


class TeamModel(nn.Module):
    """Everything trainable in one module tree, so accelerate / DeepSpeed see one model and one optimizer."""

    def __init__(self, team: AgentTeam, critic: TeamCritic | None):
        super().__init__()
        self.team = team
        self.critic = critic
        first = team.model_of(team.names[0])
        # transformers.Trainer reads `config` in a few places (model card, logging); the first agent's is representative.
        self.config = first.get_base_model().config if hasattr(first, "get_base_model") else first.config

    def forward(self, *args, **kwargs):  # pragma: no cover - the trainers call the team / critic directly
        raise RuntimeError("TeamModel is a container; call its team or critic.")
