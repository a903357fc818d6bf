"""TRL's `GRPOConfig`, field by field, on `MultiAgentMCConfig` (docs/from-grpo.md carries `markdown_table()`).

Each of GRPOConfig's own fields (beyond `TrainingArguments`) is one of:
- SAME: a field of ours with GRPO's name and meaning (for a team: per agent);
- RENAMED: our field of another name; both names are accepted and must agree;
- TEAM: GRPO's name, with the meaning it takes for a team (the note says how);
- REFUSED: a GRPO feature this trainer does not have. `GRPORefusedFields` declares it (with GRPOConfig's own type and
  default, read from the installed TRL) so that TRL's `grpo.py` parses it, and `check_grpo_fields` refuses any other
  value in one line naming the equivalent, instead of the flag being dropped as an unknown argument.
"""

from __future__ import annotations

import dataclasses
import typing

SAME = "same"
RENAMED = "renamed"
TEAM = "team meaning"
REFUSED = "refused unless default"

_SERVER = (
    "vLLM runs colocated here (vllm_mode='colocate': an engine per agent model or one LoRA engine); leave it unset"
)
_ENTROPY = "no entropy bonus: the loss is the policy loss (plus beta x KL); leave it at its default"
_SYNC = "the reference policy stays the initial one (beta's KL is to it); leave it at its default"

GRPO_FIELDS: dict[str, tuple[str, str]] = {
    "model_init_kwargs": (SAME, "from_pretrained's kwargs for every agent given as a path"),
    "trust_remote_code": (SAME, "added to model_init_kwargs (models and tokenizers loaded from paths)"),
    "num_generations": (SAME, "G completions per agent per prompt (per tree node in multi-turn)"),
    "max_completion_length": (RENAMED, "response_length (one value: a clear error when both are set and differ)"),
    "ds3_gather_for_generation": (SAME, "as GRPO"),
    "temperature": (SAME, "as GRPO (default 0.7 here, 1.0 in GRPO)"),
    "top_p": (SAME, "as GRPO"),
    "top_k": (SAME, "as GRPO (0 or None: off)"),
    "min_p": (SAME, "as GRPO (None or 0: off); recorded in team.json, so eval / play sample with it"),
    "repetition_penalty": (
        SAME,
        "as GRPO, in generate() and vLLM; recorded in team.json. The loss's log-probs are the policy's own, never "
        "the penalised sampler's (PPO's old log-probs then come from its scoring forward)",
    ),
    "generation_kwargs": (
        SAME,
        "as GRPO: generate()'s (GenerationConfig's names) or, with use_vllm, SamplingParams' keyword arguments; "
        "recorded in team.json. Keys that are settings here (temperature, top_p, max_new_tokens, num_beams, ...) "
        "are refused naming the setting",
    ),
    "generation_batch_size": (
        TEAM,
        "completions per agent sampled per iteration over all processes: per_device_train_batch_size (prompts here) x "
        "num_generations x processes x num_mini_batches x gradient_accumulation_steps; sets num_mini_batches",
    ),
    "steps_per_generation": (
        TEAM,
        "micro-batches per generation: gradient_accumulation_steps x num_mini_batches; sets num_mini_batches",
    ),
    "use_vllm": (SAME, "one colocated engine per agent model, or one engine with a LoRA adapter per agent"),
    "vllm_mode": (SAME, "'colocate' only ('server' is refused: one server holds one model)"),
    "vllm_model_impl": (SAME, "as GRPO"),
    "vllm_enable_sleep_mode": (SAME, "as GRPO"),
    "vllm_gpu_memory_utilization": (SAME, "as GRPO"),
    "vllm_max_model_length": (SAME, "as GRPO"),
    "vllm_importance_sampling_correction": (SAME, "as GRPO, per agent"),
    "vllm_importance_sampling_mode": (SAME, "as GRPO"),
    "vllm_importance_sampling_clip_max": (SAME, "as GRPO"),
    "vllm_importance_sampling_clip_min": (SAME, "as GRPO"),
    "beta": (SAME, "KL coefficient to each agent's reference policy"),
    "num_iterations": (SAME, "inner passes over each batch (with a ratio loss: clipped or a GRPO loss_type)"),
    "epsilon": (SAME, "lower clip range of the ratio (and the upper one unless epsilon_high)"),
    "epsilon_high": (SAME, "upper clip range of the ratio (default: epsilon)"),
    "delta": (SAME, "two-sided clipping: the ratio is capped at delta (GRPO loss types)"),
    "reward_weights": (SAME, "weights of the reward functions (summed per agent)"),
    "scale_rewards": (
        TEAM,
        "'group' (each agent's G samples of one prompt), 'batch' (the agent's whole batch) or 'none'; true / false "
        "mean group / none; GRPO's std (unbiased, + 1e-4). Unset: scale_advantages decides",
    ),
    "loss_type": (
        TEAM,
        "grpo, dr_grpo, dapo, bnpo as GRPO, each agent's loss normalised on its own tokens and the agents' losses "
        "summed; reinforce / clipped are ours (default reinforce)",
    ),
    "mask_truncated_completions": (SAME, "a completion without its stop token carries no loss (its reward counts)"),
    "use_bias_correction_kl": (SAME, "the KL term times the ratio (GRPO loss types)"),
    "log_completions": (TEAM, "prints each logged iteration's first completions of every agent, reward and advantage"),
    "num_completions_to_print": (SAME, "rows log_completions prints (default 4)"),
    "use_transformers_continuous_batching": (SAME, "as GRPO, one call per LoRA adapter"),
    "transformers_continuous_batching_config": (SAME, "as GRPO"),
    # refused: the GRPO feature is not here; the note names what to use instead
    "router_aux_loss_coef": (REFUSED, "the MoE router's auxiliary loss is not in the team's loss; leave it unset"),
    "disable_dropout": (REFUSED, "dropout is as each model's config sets it; set its dropout to 0 there"),
    "cast_lm_head_to_fp32": (REFUSED, "load the agents in float32 (model_init_kwargs={'dtype': 'float32'})"),
    "num_generations_eval": (
        REFUSED,
        "evaluate() plays each eval row once and reports the mean return; to play each row k times, pass the rows "
        "repeated (datasets.concatenate_datasets([eval_dataset] * k)) with evaluate(greedy=False), the default",
    ),
    "shuffle_dataset": (REFUSED, "rows are shuffled each pass; set data_seed for another order"),
    "pad_to_multiple_of": (REFUSED, "rows are padded to their batch's longest; leave it at 'auto'"),
    "chat_template_kwargs": (REFUSED, "each agent's prompt is built by prompt_formatters / its chat template"),
    "cache_implementation": (REFUSED, "generation uses each model's default KV cache; leave it unset"),
    "vllm_structured_outputs_regex": (REFUSED, "structured outputs are not passed to the engines; leave it unset"),
    "vllm_server_base_url": (REFUSED, _SERVER),
    "vllm_server_host": (REFUSED, _SERVER),
    "vllm_server_port": (REFUSED, _SERVER),
    "vllm_server_timeout": (REFUSED, _SERVER),
    "vllm_group_port": (REFUSED, _SERVER),
    "vllm_tensor_parallel_size": (REFUSED, "each colocated engine runs on its process's device; leave it at 1"),
    "sapo_temperature_neg": (REFUSED, "loss_type 'sapo' is not here; use grpo, dr_grpo, dapo or bnpo"),
    "sapo_temperature_pos": (REFUSED, "loss_type 'sapo' is not here; use grpo, dr_grpo, dapo or bnpo"),
    "vespo_k_pos": (REFUSED, "loss_type 'vespo' is not here; use grpo, dr_grpo, dapo or bnpo"),
    "vespo_lambda_pos": (REFUSED, "loss_type 'vespo' is not here; use grpo, dr_grpo, dapo or bnpo"),
    "vespo_k_neg": (REFUSED, "loss_type 'vespo' is not here; use grpo, dr_grpo, dapo or bnpo"),
    "vespo_lambda_neg": (REFUSED, "loss_type 'vespo' is not here; use grpo, dr_grpo, dapo or bnpo"),
    "importance_sampling_level": (REFUSED, "ratios are per token (GSPO's 'sequence' is not here); leave it 'token'"),
    "multi_objective_aggregation": (
        REFUSED,
        "the reward functions are summed with reward_weights, then the group baseline; leave it 'sum_then_normalize'",
    ),
    "sync_ref_model": (REFUSED, _SYNC),
    "ref_model_mixup_alpha": (REFUSED, _SYNC),
    "ref_model_sync_steps": (REFUSED, _SYNC),
    "top_entropy_quantile": (REFUSED, "every completion token carries the loss; leave it at 1.0"),
    "entropy_coef": (REFUSED, _ENTROPY),
    "use_adaptive_entropy": (REFUSED, _ENTROPY),
    "entropy_coef_min": (REFUSED, _ENTROPY),
    "entropy_coef_max": (REFUSED, _ENTROPY),
    "entropy_coef_delta": (REFUSED, _ENTROPY),
    "entropy_target": (REFUSED, _ENTROPY),
    "max_tool_calling_iterations": (
        REFUSED,
        "tools are an environment here: a MultiAgentEnv whose step runs them, with num_turns (docs/envs.md)",
    ),
    "off_policy_mask_threshold": (REFUSED, "no off-policy sequence mask; leave it unset"),
    "log_multimodal": (REFUSED, "the agents read text only; leave it at its default"),
    "log_unique_prompts": (REFUSED, "log_completions prints the first rows; leave it false"),
    "log_completions_hub_repo": (REFUSED, "completions are printed, not pushed; leave it unset"),
    "use_transformers_paged": (REFUSED, "GRPO's deprecated name: set use_transformers_continuous_batching"),
    "vllm_importance_sampling_cap": (REFUSED, "GRPO's deprecated name: set vllm_importance_sampling_clip_max"),
}

# loss types of GRPOConfig that are not here, with the nearest one that is
OTHER_GRPO_LOSS_TYPES = {"cispo": "dapo", "sapo": "grpo", "luspo": "grpo", "vespo": "dapo"}


def _grpo_config():
    from trl import GRPOConfig

    return GRPOConfig


def _refused_mixin():
    """A dataclass holding the refused fields with GRPOConfig's types and defaults (read from the installed TRL; a
    field this TRL lacks is left out)."""
    cls = _grpo_config()
    hints = typing.get_type_hints(cls)
    theirs = {f.name: f for f in dataclasses.fields(cls)}
    fields = []
    for name, (status, note) in GRPO_FIELDS.items():
        if status != REFUSED or name not in theirs:
            continue
        f = theirs[name]
        default = (
            dataclasses.field(default=f.default)
            if f.default is not dataclasses.MISSING
            else dataclasses.field(default_factory=f.default_factory)
        )
        default.metadata = {"help": f"GRPOConfig's; not supported here: {note}."}
        fields.append((name, hints[name], default))
    made = dataclasses.make_dataclass("GRPORefusedFields", fields)
    made.__module__ = __name__
    return made


GRPORefusedFields = _refused_mixin()


def refused_default(name: str):
    f = GRPORefusedFields.__dataclass_fields__[name]
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def check_grpo_fields(config) -> None:
    """Refuse, in one line naming the equivalent, a GRPO field this trainer does not have, set to a non-default."""
    for name in GRPORefusedFields.__dataclass_fields__:
        value, default = getattr(config, name), refused_default(name)
        if value != default and not (value in (None, {}, "") and default in (None, {}, "")):
            raise ValueError(f"`{name}`={value!r} is GRPOConfig's and not supported here: {GRPO_FIELDS[name][1]}.")


def markdown_table() -> str:
    """The table docs/from-grpo.md carries (regenerate it with
    `python -c "from trl_collm.trainers.grpo_fields import markdown_table; print(markdown_table())"`)."""
    order = {SAME: 0, RENAMED: 1, TEAM: 2, REFUSED: 3}
    lines = ["| GRPOConfig field | here | what the team trainer does |", "|---|---|---|"]
    for name, (status, note) in sorted(GRPO_FIELDS.items(), key=lambda kv: (order[kv[1][0]], kv[0])):
        lines.append(f"| `{name}` | {status} | {note.replace('|', '/')} |")
    return "\n".join(lines)
