"""`TeamConfig`: the fields both team trainers share (the team, generation, rewards, episodes).

It derives from TRL's `_BaseConfig` (itself a `transformers.TrainingArguments`), so every config is also a command line
through `HfArgumentParser` / `TrlParser`. Each trainer's config sits beside it (`ppo_config.py`, `mc_config.py`).
TRL's `world_size` field is deliberately *not* re-declared: it shadowed `TrainingArguments.world_size` and broke
DeepSpeed.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Annotated

from transformers.trainer_utils import SchedulerType
from trl.trainer.base_config import _BaseConfig

from ..generation.sampler import BackendOptions
from ..team.names import check_agent_names
from .backend_fields import GenerationBackendFields
from .presets import PresetDefault, fill_preset_defaults
from .ranges import ABOVE_0, ANY, AT_LEAST_0, AT_LEAST_1, UNIT, UNIT_OPEN_BOTTOM, check_numeric_fields
from .supported_args import check_training_arguments, warn_if_bf16_is_emulated

# The choices of the shared fields (each trainer's config adds its own).
TEAM_CHOICES = {
    "reward_type": ("auto", "joint", "per_agent"),
    "grad_clip_scope": ("global", "per_module"),
    "agent_context": ("observation", "history"),
    "vllm_model_impl": ("vllm", "transformers"),
    "vllm_importance_sampling_mode": ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
}


@dataclass
class TeamConfig(GenerationBackendFields, _BaseConfig):
    r"""Fields shared by the team trainers: the team, generation, rewards and episodes.

    Every field is also a command-line flag (`TrlParser`); the `transformers.TrainingArguments` fields (output_dir,
    seed, per_device_train_batch_size, bf16, report_to, ...) apply as documented there, or are refused when set:
    `trainers/supported_args.py` says which, field by field. The generation backend's fields (continuous batching,
    vLLM) are `GenerationBackendFields`' (`trainers/backend_fields.py`), which this class derives from.

    Parameters:
        > Parameters that define the team

        agent_names (`list[str]`, *optional*, defaults to `None`):
            Names of the agents (used in logs, folders, cards). Defaults to agent_0..agent_{n-1}.
        num_agents (`int`, *optional*, defaults to `None`):
            Number of agents when `model` is one path or model to replicate.
        num_turns (`int`, *optional*, defaults to `1`):
            Maximum number of turns per episode.
        agent_context (`str`, *optional*, defaults to `'observation'`):
            What an agent is prompted with at turn t: 'observation' (the env's text, which may embed history) or
            'history' (its own previous observations and completions followed by the new observation).
        model_init_kwargs (`dict | str`, *optional*, defaults to `None`):
            Keyword arguments for from_pretrained when models are given as paths (e.g. {"dtype": "bfloat16"}).

        > Parameters that control generation

        response_length (`int`, *optional*, defaults to `53`):
            Length of the response (max new tokens).
        temperature (`float`, *optional*, defaults to `0.7`):
            Sampling temperature.
        top_p (`float`, *optional*, defaults to `1.0`):
            Nucleus sampling for generation.
        top_k (`int`, *optional*, defaults to `None`):
            Top-k sampling for generation (None or 0: off, as in TRL and transformers).
        stop_token (`str`, *optional*, defaults to `None`):
            Specifies the stop token to use for text generation. Only 'eos' is supported.
        stop_token_id (`int`, *optional*, defaults to `None`):
            Specifies the ID of the stop token to use for text generation.
        max_prompt_length (`int`, *optional*, defaults to `None`):
            Longest agent prompt in tokens; longer prompts keep their last tokens (with a warning). Default: the model's
            context length minus response_length. Critic views are cut to the critic's context (a joint view: each
            agent's context from its left, sharing the room).
        scale_logits_by_temperature (`bool`, *optional*, defaults to `True`):
            Compute log-probs from logits / temperature (TRL PPO) or from raw logits (reference code).
        local_rollout_forward_batch_size (`int`, *optional*, defaults to `64`):
            Per rank no grad forward pass in the rollout phase.
        ds3_gather_for_generation (`bool`, *optional*, defaults to `True`):
            Gather ZeRO-3 weights for generation (faster; set False for models that do not fit on one device).
        ds3_gather_for_training (`bool`, *optional*, defaults to `True`):
            ZeRO-3: in scoring and in the update, gather each model's weights once per pass (kept through the loss's
            backward) instead of module by module through DeepSpeed's hooks. Needs one model's full weights in memory
            at a time, as `ds3_gather_for_generation` does; False: DeepSpeed's per-module fetches (least memory).
        share_prompt_prefix (`bool`, *optional*, defaults to `True`):
            Compute the leading tokens that all rows of a training forward share (a task's instructions, the G samples
            of one prompt) once instead of once per row. Same numbers up to float rounding; falls back to the plain
            forward where it cannot apply (see trl_collm/team/prefix.py).
        reuse_rollout_prefill (`bool`, *optional*, defaults to `True`):
            Run the rollout's prompt prefill with gradients and reuse it in the update, which then forwards only the
            responses, when that gives the same numbers (one epoch, one minibatch, every row in one micro-batch; when
            it applies: trl_collm/trainers/plan.py). Saves the update's prompt forward; holds every agent's prompt
            activations from sampling to the update. False: the update forwards prompt and response (less memory).

        > Parameters that control rewards and episodes

        reward_weights (`list[float]`, *optional*, defaults to `None`):
            Weights of the reward functions (default 1.0 each).
        reward_type (`str`, *optional*, defaults to `'auto'`):
            'joint' (one reward per episode shared by all agents), 'per_agent' (a vector of n), or 'auto' (accept both).
        missing_eos_penalty (`float`, *optional*, defaults to `None`):
            Penalty subtracted from the score of responses that do not end with the stop/EOS token.
        early_termination_threshold (`float`, *optional*, defaults to `None`):
            End an episode early once the mean reward of a turn exceeds this value.
        gamma (`float`, *optional*, defaults to `1.0`):
            Discount factor.
        total_episodes (`int`, *optional*, defaults to `None`):
            Total number of episodes in the dataset. Defaults to num_train_epochs * len(train_dataset).

        > Parameters that control the update

        preset (`str`, *optional*, defaults to `None`):
            One word that sets the update rule (see docs/algorithm.md).
        learning_rate (`float`, *optional*, defaults to `3e-06`):
            Learning rate (actors; critics too unless `critic_learning_rate`).
        num_mini_batches (`int`, *optional*, defaults to `1`):
            Number of minibatches to split a batch into.
        optim (`str`, *optional*, defaults to `'adamw_torch'`):
            The optimizer, built by transformers' optimizer factory: 'adamw_torch', 'adamw_torch_fused', 'sgd',
            'adafactor', 'adagrad' or 'rmsprop'. The default keeps torch's plain AdamW, which these trainers always
            used (transformers 5 defaults to 'adamw_torch_fused', whose rounding differs).
        max_grad_norm (`float`, *optional*, defaults to `1.0`):
            Maximum gradient norm for gradient clipping (0 or None: off).
        weight_decay (`float`, *optional*, defaults to `0.0`):
            The optimizer's weight decay.
        lr_scheduler_type (`str`, *optional*, defaults to `'linear'`):
            The learning-rate schedule (transformers' `SchedulerType`).
        warmup_steps (`float`, *optional*, defaults to `0`):
            Linear warmup from 0 to `learning_rate`: steps, or a float in [0, 1) (a ratio).
        grad_clip_scope (`str`, *optional*, defaults to `'global'`):
            'global': one grad-norm clip over everything; 'per_module': each agent and critic clipped on its own.
        gradient_checkpointing (`bool`, *optional*, defaults to `None`):
            Deprecated alias of activation_checkpointing.

        > Parameters that keep a run safe

        max_nonfinite_steps (`int`, *optional*, defaults to `3`):
            An optimizer step whose loss or gradients are NaN/inf is skipped and counted in
            `train/nonfinite_steps_skipped`; this many in a row stop the run with an error.
        overwrite_output_dir (`bool`, *optional*, defaults to `False`):
            Train into an output_dir holding checkpoint-* folders without resuming (the old checkpoints are deleted
            once every check at the start of train() has passed). Without it, and without `resume_from_checkpoint`,
            such a run is refused.

        > Parameters that control logging

        exp_name (`str`, *optional*, defaults to the script's name):
            Name of this experiment.
        run_name (`str`, *optional*, defaults to `None`):
            Name of the run.
        num_sample_generations (`int`, *optional*, defaults to `10`):
            Number of debugging samples generations (i.e., `generate_completions` calls) throughout training.
        dataset_num_proc (`int`, *optional*, defaults to `None`):
            Number of processes to use for processing the dataset.
        push_to_hub (`bool`, *optional*, defaults to `False`):
            Whether to push the model to the Hub after training.

        > Batch sizes computed by the trainer (TRL's PPO semantics; leave unset)

        num_total_batches (`int`, *optional*, defaults to `None`):
            Number of total PPO batches (computed at runtime).
        micro_batch_size (`int`, *optional*, defaults to `None`):
            Micro batch size across devices (computed at runtime).
        local_batch_size (`int`, *optional*, defaults to `None`):
            Batch size per GPU (computed at runtime).
        batch_size (`int`, *optional*, defaults to `None`):
            Batch size across devices (computed at runtime).
        local_mini_batch_size (`int`, *optional*, defaults to `None`):
            Mini batch size per GPU (computed at runtime).
        mini_batch_size (`int`, *optional*, defaults to `None`):
            Mini batch size across GPUs (computed at runtime).
    """

    presets = {}  # class attribute (not a field): name -> {field: value}

    exp_name: str = field(
        default=os.path.basename(sys.argv[0])[: -len(".py")]
        if sys.argv and sys.argv[0].endswith(".py")
        else "trl_collm",
        metadata={"help": "Name of this experiment."},
    )
    learning_rate: Annotated[float, AT_LEAST_0] = field(
        default=PresetDefault(3e-6),
        metadata={"help": "Learning rate (actors; critics too unless `critic_learning_rate`)."},
    )
    run_name: str | None = field(default=None, metadata={"help": "Name of the run."})
    dataset_num_proc: Annotated[int | None, AT_LEAST_1] = field(
        default=None, metadata={"help": "Number of processes to use for processing the dataset."}
    )
    num_mini_batches: Annotated[int, AT_LEAST_1] = field(
        default=1, metadata={"help": "Number of minibatches to split a batch into."}
    )
    total_episodes: Annotated[int | None, AT_LEAST_1] = field(
        default=None,
        metadata={
            "help": "Total number of episodes in the dataset. Defaults to num_train_epochs * len(train_dataset)."
        },
    )
    local_rollout_forward_batch_size: Annotated[int, AT_LEAST_1] = field(
        default=BackendOptions.local_rollout_forward_batch_size,
        metadata={"help": "Per rank no grad forward pass in the rollout phase."},
    )
    num_sample_generations: Annotated[int, AT_LEAST_0] = field(
        default=10,
        metadata={
            "help": "Number of debugging samples generations (i.e., `generate_completions` calls) throughout training."
        },
    )
    response_length: Annotated[int, AT_LEAST_1] = field(
        default=53, metadata={"help": "Length of the response (max new tokens)."}
    )
    stop_token: str | None = field(
        default=None, metadata={"help": "Specifies the stop token to use for text generation. Only 'eos' is supported."}
    )
    stop_token_id: Annotated[int | None, AT_LEAST_0] = field(
        default=None, metadata={"help": "Specifies the ID of the stop token to use for text generation."}
    )
    temperature: Annotated[float, ABOVE_0] = field(
        default=PresetDefault(0.7), metadata={"help": "Sampling temperature."}
    )
    missing_eos_penalty: Annotated[float | None, ANY] = field(
        default=PresetDefault(None),
        metadata={"help": "Penalty subtracted from the score of responses that do not end with the stop/EOS token."},
    )
    num_total_batches: Annotated[int | None, AT_LEAST_1] = field(
        default=None, metadata={"help": "Number of total PPO batches (computed at runtime)."}
    )
    micro_batch_size: Annotated[int | None, AT_LEAST_1] = field(
        default=None, metadata={"help": "Micro batch size across devices (computed at runtime)."}
    )
    local_batch_size: Annotated[int | None, AT_LEAST_1] = field(
        default=None, metadata={"help": "Batch size per GPU (computed at runtime)."}
    )
    batch_size: Annotated[int | None, AT_LEAST_1] = field(
        default=None, metadata={"help": "Batch size across devices (computed at runtime)."}
    )
    local_mini_batch_size: Annotated[int | None, AT_LEAST_1] = field(
        default=None, metadata={"help": "Mini batch size per GPU (computed at runtime)."}
    )
    mini_batch_size: Annotated[int | None, AT_LEAST_1] = field(
        default=None, metadata={"help": "Mini batch size across GPUs (computed at runtime)."}
    )
    push_to_hub: bool = field(default=False, metadata={"help": "Whether to push the model to the Hub after training."})
    gamma: Annotated[float, UNIT] = field(default=PresetDefault(1.0), metadata={"help": "Discount factor."})
    ds3_gather_for_generation: bool = field(
        default=True,
        metadata={
            "help": "Gather ZeRO-3 weights for generation (faster; set False for models that do not fit on one device)."
        },
    )
    ds3_gather_for_training: bool = field(
        default=True,
        metadata={
            "help": (
                "ZeRO-3: in scoring and in the update, gather each model's weights once per pass instead of module by "
                "module through DeepSpeed's hooks (one model's full weights in memory at a time; False: per-module "
                "fetches, least memory)."
            )
        },
    )
    share_prompt_prefix: bool = field(
        default=True,
        metadata={
            "help": (
                "Compute the leading tokens that all rows of a training forward share (a task's instructions, "
                "the G "
                "samples of one prompt) once instead of once per row. Same numbers up to float rounding; falls back to "
                "the plain forward where it cannot apply (see trl_collm/team/prefix.py)."
            )
        },
    )
    reuse_rollout_prefill: bool = field(
        default=True,
        metadata={
            "help": (
                "Run the rollout's prompt prefill with gradients and reuse it in the update, which then forwards "
                "only the responses, when that gives the same numbers (one epoch, one minibatch, every row in one "
                "micro-batch; when it applies: trl_collm/trainers/plan.py). Saves the update's prompt forward; "
                "holds every agent's prompt activations from sampling to the update. False: the update forwards "
                "prompt and response (less memory)."
            )
        },
    )

    max_prompt_length: Annotated[int | None, AT_LEAST_1] = field(
        default=None,
        metadata={
            "help": (
                "Longest agent prompt in tokens; longer prompts keep their last tokens (with a warning). "
                "Default: the model's context length minus response_length. Critic views are cut to the critic's "
                "context."
            )
        },
    )
    model_init_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": 'Keyword arguments for from_pretrained when models are given as paths (e.g. {"dtype": "bfloat16"}).'
        },
    )
    # TRL's base turns activation checkpointing on; RL alternates generation and training forwards, so we leave it
    # off unless asked (`--activation_checkpointing`). None keeps transformers from warning about the old name.
    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated alias of activation_checkpointing."}
    )

    # ------------------------------------------------------------------ the team
    agent_names: list[str] | None = field(
        default=None,
        metadata={"help": "Names of the agents (used in logs, folders, cards). Defaults to agent_0..agent_{n-1}."},
    )
    num_agents: Annotated[int | None, AT_LEAST_1] = field(
        default=None, metadata={"help": "Number of agents when `model` is one path or model to replicate."}
    )
    num_turns: Annotated[int, AT_LEAST_1] = field(default=1, metadata={"help": "Maximum number of turns per episode."})
    agent_context: str = field(
        default="observation",
        metadata={
            "help": (
                "What an agent is prompted with at turn t: 'observation' (the env's text, which may embed history) "
                "or 'history' (its own previous observations and completions followed by the new observation)."
            )
        },
    )
    top_p: Annotated[float, UNIT_OPEN_BOTTOM] = field(
        default=PresetDefault(1.0), metadata={"help": "Nucleus sampling for generation."}
    )
    top_k: Annotated[int | None, AT_LEAST_1] = field(
        default=PresetDefault(None), metadata={"help": "Top-k sampling for generation (None or 0: off)."}
    )
    scale_logits_by_temperature: bool = field(
        default=PresetDefault(True),
        metadata={"help": "Compute log-probs from logits / temperature (TRL PPO) or from raw logits (reference code)."},
    )
    reward_weights: list[float] | None = field(
        default=None, metadata={"help": "Weights of the reward functions (default 1.0 each)."}
    )
    reward_type: str = field(
        default="auto",
        metadata={
            "help": (
                "'joint' (one reward per episode shared by all agents), 'per_agent' (a vector of n), or 'auto' "
                "(accept both)."
            )
        },
    )
    early_termination_threshold: Annotated[float | None, ANY] = field(
        default=None, metadata={"help": "End an episode early once the mean reward of a turn exceeds this value."}
    )

    optim: str = field(
        default="adamw_torch",
        metadata={
            "help": (
                "The optimizer, built by transformers' optimizer factory: 'adamw_torch', "
                "'adamw_torch_fused', 'sgd', 'adafactor', 'adagrad' or 'rmsprop'. The default keeps torch's plain "
                "AdamW, which these trainers always used (transformers 5 defaults to 'adamw_torch_fused', whose "
                "rounding differs)."
            )
        },
    )
    # TrainingArguments' fields a preset sets, re-declared only so that their defaults are PresetDefaults.
    max_grad_norm: float = field(
        default=PresetDefault(1.0), metadata={"help": "Maximum gradient norm for gradient clipping (0 or None: off)."}
    )
    weight_decay: float = field(default=PresetDefault(0.0), metadata={"help": "The optimizer's weight decay."})
    lr_scheduler_type: SchedulerType | str = field(
        default=PresetDefault("linear"), metadata={"help": "The learning-rate schedule (transformers' SchedulerType)."}
    )
    warmup_steps: float = field(
        default=PresetDefault(0),
        metadata={"help": "Linear warmup from 0 to `learning_rate`: steps, or a float in [0, 1) (a ratio)."},
    )
    grad_clip_scope: str = field(
        default=PresetDefault("global"),
        metadata={
            "help": (
                "'global': one grad-norm clip over everything; 'per_module': each agent and critic clipped on its own."
            )
        },
    )
    preset: str | None = field(
        default=None, metadata={"help": "One word that sets the update rule (see docs/algorithm.md)."}
    )

    # ------------------------------------------------------------------ safety
    max_nonfinite_steps: Annotated[int, AT_LEAST_1] = field(
        default=3,
        metadata={
            "help": (
                "An optimizer step whose loss or gradients are NaN/inf is skipped (and counted in "
                "`train/nonfinite_steps_skipped`); this many skipped steps in a row stop the run with an error."
            )
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": (
                "Train into an output_dir that already holds checkpoint-* folders without resuming: their old "
                "checkpoints are deleted once every check at the start of train() has passed. Without it (and without "
                "resume_from_checkpoint) such a run is refused."
            )
        },
    )

    def __post_init__(self):
        if isinstance(self.model_init_kwargs, str):
            self.model_init_kwargs = json.loads(self.model_init_kwargs)
        if self.preset is not None and self.preset not in self.presets:
            raise ValueError(
                f"`preset`={self.preset!r} is unknown; choose one of {sorted(self.presets)} or leave it unset."
            )
        # First of all: a field the caller did not set still holds its PresetDefault (trainers/presets.py), which
        # the preset's value or the plain default replaces; anything set explicitly wins, even to its default.
        fill_preset_defaults(self, self.preset_fields() if self.preset is not None else {})
        # bf16 left unset (TRL would turn it on): on only where a bf16 GPU can run it, so the same script also runs
        # on a CPU-only machine (transformers refuses bf16 there unless use_cpu=True, and CPU training stays fp32).
        if self.bf16 is None and not self.fp16:
            from transformers.utils import is_torch_bf16_gpu_available

            self.bf16 = not self.use_cpu and is_torch_bf16_gpu_available()
        warn_if_bf16_is_emulated(self)
        if self.top_k == 0:  # TRL's configs and transformers' generate() switch top-k off with 0: same meaning here
            self.top_k = None
        # Before TrainingArguments' own checks, so every bad number gets a message naming its field.
        check_numeric_fields(self)
        # Every TrainingArguments field either works or is refused here (trainers/supported_args.py).
        check_training_arguments(self)
        super().__post_init__()
        self._validate()

    def preset_fields(self) -> dict:
        """The values `preset` gives the fields the caller left at their defaults (read before they are filled)."""
        return dict(self.presets[self.preset])

    def resolve_for_team(self, num_agents: int) -> None:
        """Fill the team-dependent defaults (called by the trainer once it knows the team)."""

    def uses_reference(self) -> bool:
        """Whether a reference policy is needed (a KL term)."""
        return False

    def _check_choices(self, choices: dict, optional: tuple = ()) -> None:
        for name, allowed in choices.items():
            value = getattr(self, name)
            if value is None and name in optional:
                continue  # None: decided by the trainer from the team
            if value not in allowed:
                raise ValueError(f"`{name}`={value!r} is not valid; choose one of {list(allowed)}.")

    def _validate(self):
        # Numeric ranges were checked before this (ranges.check_numeric_fields); what is left relates fields.
        self._check_choices(TEAM_CHOICES)
        if self.agent_names is not None:
            check_agent_names(self.agent_names)
            if self.num_agents is not None and self.num_agents != len(self.agent_names):
                raise ValueError(
                    f"`num_agents`={self.num_agents} but `agent_names` has {len(self.agent_names)} names; drop one "
                    "of them or make them agree."
                )
        if self.stop_token is not None and self.stop_token != "eos":
            raise ValueError(f"`stop_token`={self.stop_token!r}: only 'eos' is supported (or set `stop_token_id`).")
        if self.use_vllm:
            from ..generation.vllm_backend import check_vllm_fields

            check_vllm_fields(self)
        if self.reward_weights is not None and any(not math.isfinite(w) for w in self.reward_weights):
            raise ValueError(f"`reward_weights` must be finite numbers, got {self.reward_weights}.")
