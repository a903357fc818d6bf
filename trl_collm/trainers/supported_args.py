"""What the team trainers do with every `transformers.TrainingArguments` field (and the fields kept from TRL's last
`PPOConfig`): each is honoured as transformers / TRL do, rejected unless left at its default (a `ValueError` naming
the field and what to use instead, raised where the config is made), or not applicable (transformers' `Trainer`
does not read it either, or no value can change what the trainer does; the reason is given).

`check_training_arguments(config)` is called by `TeamConfig.__post_init__`; `markdown_table()` prints the table that
docs/trl-ppo-differences.md carries (`tests/test_supported_args.py` checks both against every config field).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

from .presets import plain

HONOURED = "honoured"
REJECTED = "rejected unless default"
NOT_APPLICABLE = "not applicable"


@dataclass(frozen=True)
class Support:
    status: str
    note: str  # honoured: how; rejected: what to use instead; not applicable: why
    allowed: tuple | None = None  # honoured fields that take only some values: the others are rejected
    example: object = None  # a non-default value the field walk in the tests sets (when not derivable from the type)


def _h(note: str, allowed: tuple | None = None, example=None) -> Support:
    return Support(HONOURED, note, allowed, example)


def _r(note: str, example=None) -> Support:
    return Support(REJECTED, note, example=example)


def _na(note: str) -> Support:
    return Support(NOT_APPLICABLE, note)


OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "sgd", "adafactor", "adagrad", "rmsprop")
HUB_STRATEGIES = ("every_save", "end")

_NO_DDP = (
    "the team is not wrapped in DistributedDataParallel: the trainer averages gradients across processes "
    "itself (trainers/distributed.py); leave it unset"
)
_NO_PREDICTION_LOOP = (
    "`evaluate()` plays episodes and reports their returns (eval_return, eval_<agent>/return, "
    "eval_turns); there is no prediction loop to configure; leave it unset"
)
_NO_WORKERS = "the rollout loader hands rows (Python dicts) to the environment in the main process; leave it unset"
_DERIVED = (
    "computed by the trainer at train() (TRL PPO's batch math); set per_device_train_batch_size, "
    "gradient_accumulation_steps, num_mini_batches and total_episodes / max_steps instead"
)

SUPPORT: dict[str, Support] = {
    # ------------------------------------------------------------------ run, batch sizes, length
    "output_dir": _h("the team, checkpoints and logs go there"),
    "per_device_train_batch_size": _h(
        "rows per device in a micro-batch; a rollout batch is per_device_train_batch_size"
        " x gradient_accumulation_steps x num_mini_batches rows (TRL PPO)"
    ),
    "gradient_accumulation_steps": _h(
        "micro-batches per optimizer step: one minibatch is "
        "per_device_train_batch_size x gradient_accumulation_steps rows, its gradient "
        "the mean over them (TRL PPO)"
    ),
    "num_train_epochs": _h(
        "passes over train_dataset: total_episodes defaults to num_train_epochs x len(train_dataset)"
    ),
    "max_steps": _h(
        "the number of iterations (one rollout batch + its update each); overrides num_train_epochs and total_episodes"
    ),
    "resume_from_checkpoint": _h(
        "train() resumes from it when called without the argument; a folder, or true for the "
        "newest complete checkpoint in output_dir (the CLI passes it)",
        example="true",
    ),
    "ignore_data_skip": _h("on resume, start from the first batch instead of fast-forwarding the data"),
    "seed": _h("seeds the run before the team is built"),
    "data_seed": _h("seeds the shuffling of train_dataset (default: seed)"),
    "full_determinism": _h("transformers' enable_full_determinism at Trainer init"),
    "use_cpu": _h("as transformers"),
    "accelerator_config": _h("passed to accelerate by transformers' Trainer"),
    # ------------------------------------------------------------------ optimizer and schedule
    "learning_rate": _h("actors (and critics unless critic_learning_rate)"),
    "optim": _h(
        "transformers' optimizer factory over one parameter group per agent and critic (default here: "
        "adamw_torch, the plain AdamW these trainers always used)",
        allowed=OPTIMIZERS,
        example="sgd",
    ),
    "optim_args": _h("passed to the optimizer as transformers' factory does", example="momentum=0.5"),
    "weight_decay": _h("applied to every trained parameter (transformers spares biases and norms)"),
    "adam_beta1": _h("AdamW's betas"),
    "adam_beta2": _h("AdamW's betas"),
    "adam_epsilon": _h("AdamW's eps"),
    "lr_scheduler_type": _h("transformers' scheduler over every optimizer step"),
    "lr_scheduler_kwargs": _h("transformers' scheduler kwargs"),
    "warmup_steps": _h("in optimizer steps (a float < 1: a fraction of them), as transformers"),
    "max_grad_norm": _h("clipped per step (grad_clip_scope: global or per module)"),
    "optim_target_modules": _r(
        f"GaLore / APOLLO optimizers are not supported; choose optim from {list(OPTIMIZERS)}", example="all-linear"
    ),
    "average_tokens_across_devices": _r(
        "losses are means over each minibatch's rows, averaged across processes; leave it true"
    ),
    "label_smoothing_factor": _r("the losses are RL losses, there are no labels to smooth; leave it 0"),
    # ------------------------------------------------------------------ precision, memory, kernels
    "bf16": _h("mixed precision through accelerate (autocast around each iteration)"),
    "fp16": _h("mixed precision through accelerate"),
    "tf32": _h("transformers sets torch's TF32 flags"),
    "bf16_full_eval": _r("evaluation runs the team as it trains; load the saved team in bf16 for that"),
    "fp16_full_eval": _r("evaluation runs the team as it trains; load the saved team in fp16 for that"),
    "activation_checkpointing": _h("enabled on every agent's model"),
    "activation_checkpointing_kwargs": _h("passed to gradient_checkpointing_enable", example={"use_reentrant": True}),
    "gradient_checkpointing": _h("deprecated alias of activation_checkpointing (as transformers)"),
    "gradient_checkpointing_kwargs": _h(
        "deprecated alias of activation_checkpointing_kwargs (as transformers)", example={"use_reentrant": True}
    ),
    "torch_empty_cache_steps": _h("empties the accelerator's cache every this many iterations"),
    "torch_compile": _r("the team's forwards are not compiled; leave it false"),
    "torch_compile_backend": _r("the team's forwards are not compiled; leave it unset", example="inductor"),
    "torch_compile_mode": _r("the team's forwards are not compiled; leave it unset", example="default"),
    "use_liger_kernel": _r("Liger kernels are not applied to the team; leave it false"),
    "liger_kernel_config": _r("Liger kernels are not applied to the team; leave it unset", example={"rope": True}),
    "use_cache": _r("generation always uses the KV cache and training forwards never do; leave it false"),
    "neftune_noise_alpha": _r("NEFTune noise is an SFT technique; leave it unset", example=5.0),
    "auto_find_batch_size": _r("set per_device_train_batch_size (and gradient_accumulation_steps) yourself"),
    "parallelism_config": _r("use DeepSpeed ZeRO-2/3 (docs/deepspeed.md)", example={"tp_size": 2}),
    "fsdp": _r("FSDP is not supported; use DeepSpeed ZeRO-2/3 (docs/deepspeed.md)", example="full_shard"),
    "fsdp_config": _r("FSDP is not supported; use DeepSpeed ZeRO-2/3 (docs/deepspeed.md)", example={"version": 2}),
    "deepspeed": _h("ZeRO-2/3 with one engine step per optimizer step (docs/deepspeed.md)"),
    "debug": _r(
        "transformers' debug modes hook into its own training loop; leave it unset", example="tpu_metrics_debug"
    ),
    "skip_memory_metrics": _r("memory metrics are not reported; leave it true"),
    # ------------------------------------------------------------------ logging
    "logging_strategy": _h(
        "steps / epoch / no, through transformers' DefaultFlowCallback (the last iteration is logged too unless 'no')",
        example="epoch",
    ),
    "logging_steps": _h("iterations between logs (a float < 1: a fraction of max steps)"),
    "logging_first_step": _h("logs the first iteration"),
    "logging_nan_inf_filter": _r(
        "a step with a non-finite loss is skipped and counted in "
        "train/nonfinite_steps_skipped (max_nonfinite_steps); leave it true"
    ),
    "log_on_each_node": _h("as transformers (log levels per node)"),
    "log_level": _h("as transformers", example="info"),
    "log_level_replica": _h("as transformers", example="info"),
    "disable_tqdm": _h("the console line's progress and ETA (trainers/console.py); true: the metrics only"),
    "include_num_input_tokens_seen": _r(
        "tokens seen are not counted; response lengths are logged per agent", example="all"
    ),
    "report_to": _h(
        "transformers' integrations (tensorboard, wandb, trackio, ...) receive every logged metric",
        example="tensorboard",
    ),
    "run_name": _h("the integrations' run name (default: exp_name__seed__time, as TRL's PPO)", example="my-run"),
    "project": _h("trackio's project", example="my-project"),
    "trackio_space_id": _h("trackio's Space", example="me/space"),
    "trackio_bucket_id": _h("trackio's bucket", example="me/bucket"),
    "trackio_static_space_id": _h("trackio's static Space", example="me/static"),
    # ------------------------------------------------------------------ evaluation
    "eval_strategy": _h(
        "evaluate() on eval_dataset at eval_steps / each epoch (DefaultFlowCallback); its metrics "
        "are logged and passed to on_evaluate",
        example="steps",
    ),
    "eval_steps": _h("iterations between evaluations (default: logging_steps)"),
    "eval_delay": _h("as transformers"),
    "eval_on_start": _h("evaluate() before the first iteration"),
    "per_device_eval_batch_size": _h("episodes per evaluate() rollout batch"),
    "metric_for_best_model": _h(
        "an evaluate() metric (e.g. 'return' = eval_return): best_metric, "
        "best_model_checkpoint, save_strategy='best', EarlyStoppingCallback",
        example="return",
    ),
    "greater_is_better": _h("as transformers (default: true unless the metric ends in 'loss')"),
    "load_best_model_at_end": _h(
        "after training, the best checkpoint's parameters are loaded back into the team "
        "(needs metric_for_best_model and a checkpoint at each evaluation)"
    ),
    "prediction_loss_only": _r(_NO_PREDICTION_LOOP),
    "eval_do_concat_batches": _r(_NO_PREDICTION_LOOP),
    "eval_use_gather_object": _r(_NO_PREDICTION_LOOP),
    "eval_accumulation_steps": _r(_NO_PREDICTION_LOOP),
    "include_for_metrics": _r(_NO_PREDICTION_LOOP, example=["inputs"]),
    "batch_eval_metrics": _r(_NO_PREDICTION_LOOP),
    "label_names": _r("there are no labels; rewards come from the environment", example=["labels"]),
    # ------------------------------------------------------------------ checkpoints and the Hub
    "save_strategy": _h(
        "steps / epoch / best / no, through transformers' DefaultFlowCallback: "
        "output_dir/checkpoint-<iteration>/ (docs/outputs.md)",
        example="epoch",
    ),
    "save_steps": _h("iterations between checkpoints (a float < 1: a fraction of max steps)"),
    "save_total_limit": _h("keeps the newest checkpoints (and the best one)"),
    "save_only_model": _r("a checkpoint always holds what an exact resume needs; `save_model()` writes the team alone"),
    "save_on_each_node": _r("checkpoints are written by the main process only; leave it false"),
    "enable_jit_checkpoint": _r("checkpoints are written at save_strategy's points only; leave it false"),
    "push_to_hub": _h(
        "save_model() pushes the team (and every checkpoint save with hub_strategy='every_save'); the "
        "CLI pushes once after training"
    ),
    "hub_token": _h("the token for push_to_hub", example="hf_xxx"),
    "hub_private_repo": _h("as transformers"),
    "hub_model_id": _h("the repo push_to_hub writes", example="me/team"),
    "hub_strategy": _h(
        "'every_save' (each checkpoint save also pushes the team) or 'end' (save_model only)",
        allowed=HUB_STRATEGIES,
        example="end",
    ),
    "hub_always_push": _na("pushes are blocking: no push is ever skipped, whatever its value"),
    "hub_revision": _h("the branch push_to_hub writes", example="dev"),
    "restore_callback_states_from_checkpoint": _h(
        "on resume, callbacks (e.g. EarlyStoppingCallback) continue from the state saved in trainer_state.json"
    ),
    # ------------------------------------------------------------------ data loading
    "dataloader_drop_last": _na(
        "a rollout batch is always local_batch_size rows; the ragged rest of a pass is "
        "dropped whatever its value (as TRL's PPO)"
    ),
    "dataloader_pin_memory": _na("rows are Python dicts given to the environment: nothing is pinned"),
    "remove_unused_columns": _na("rows reach the environment whole (its reset reads any column), whatever its value"),
    "dataloader_num_workers": _r(_NO_WORKERS),
    "dataloader_persistent_workers": _r(_NO_WORKERS),
    "dataloader_prefetch_factor": _r(_NO_WORKERS, example=2),
    "dataloader_multiprocessing_context": _r(_NO_WORKERS, example="spawn"),
    "dataloader_in_order": _r("the rollout loader is a plain shuffled loader; leave it true"),
    "train_sampling_strategy": _h(
        "rows are shuffled each pass (seeded by data_seed / seed)", allowed=("random",), example="sequential"
    ),
    "length_column_name": _r("no length-grouped sampling; leave it unset", example="len"),
    # ------------------------------------------------------------------ processes
    "ddp_backend": _h("the process group backend (accelerate)", example="gloo"),
    "ddp_timeout": _h("the process group timeout (accelerate)"),
    "ddp_find_unused_parameters": _r(_NO_DDP),
    "ddp_bucket_cap_mb": _r(_NO_DDP),
    "ddp_broadcast_buffers": _r(_NO_DDP),
    "ddp_static_graph": _r(_NO_DDP),
    "local_rank": _na("set by the launcher (torchrun / accelerate launch)"),
    "do_train": _na("read by scripts, not by a Trainer (as in transformers)"),
    "do_eval": _na("read by scripts, not by a Trainer (as in transformers); eval_strategy decides evaluation"),
    "do_predict": _na("read by scripts, not by a Trainer (as in transformers)"),
    # ------------------------------------------------------------------ TRL's last PPOConfig
    "exp_name": _h("the default run_name is exp_name__seed__time, as TRL's PPO"),
    "sft_model_path": _na("a script field: TRL's PPOTrainer did not read it either (examples/ppo.py does)"),
    "reward_model_path": _na("a script field: TRL's PPOTrainer did not read it either (examples/ppo.py does)"),
    "dataset_num_proc": _na(
        "read by scripts that tokenize a dataset (examples/ppo.py); the trainer takes rows as given"
    ),
    "model_adapter_name": _r("each agent's LoRA adapter is named after the agent; leave it unset", example="policy"),
    "ref_adapter_name": _r(
        "the reference policy is the base with the adapters disabled; leave it unset", example="ref"
    ),
    "num_total_batches": _r(_DERIVED),
    "micro_batch_size": _r(_DERIVED),
    "local_batch_size": _r(_DERIVED),
    "batch_size": _r(_DERIVED),
    "local_mini_batch_size": _r(_DERIVED),
    "mini_batch_size": _r(_DERIVED),
}


def _is_default(value, default) -> bool:
    if value == default:
        return True
    # transformers turns some unset values into empty ones ("" -> [] for fsdp / debug); both mean unset.
    empty = (None, "", [], (), {})
    if value in empty and default in empty:
        return True
    # a field typed `str | bool` whose default is "no" comes back from the command-line parser as False
    return default == "no" and value is False


def field_default(config_cls, name: str):
    f = {f.name: f for f in dataclasses.fields(config_cls)}[name]
    if f.default is not dataclasses.MISSING:
        return plain(f.default)  # a field a preset may fill wraps its default (trainers/presets.py)
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def check_training_arguments(config) -> None:
    """Refuse every field the team trainers would otherwise ignore (before transformers normalises the values)."""
    cls = type(config)
    for name, support in SUPPORT.items():
        if not hasattr(config, name):
            continue
        value = getattr(config, name)
        if support.status == REJECTED and not _is_default(value, field_default(cls, name)):
            raise ValueError(f"`{name}`={value!r} is not supported by the team trainers: {support.note}.")
        plain = str(getattr(value, "value", value))  # transformers' enums (OptimizerNames, ...) hold the string
        if support.allowed is not None and value is not None and plain not in support.allowed:
            raise ValueError(
                f"`{name}`={value!r} is not supported by the team trainers; choose one of "
                f"{list(support.allowed)} ({support.note})."
            )
    _check_combinations(config)


def _check_combinations(config) -> None:
    total = getattr(config, "total_episodes", None)
    if total is not None and config.num_train_epochs != field_default(type(config), "num_train_epochs"):
        raise ValueError(
            f"`num_train_epochs`={config.num_train_epochs} and `total_episodes`={total} both set the "
            "run's length (total_episodes would win, as in TRL's PPO); set one of them, or max_steps, "
            "which overrides both."
        )
    if config.load_best_model_at_end and config.metric_for_best_model is None:
        raise ValueError(
            "`load_best_model_at_end=True` needs `metric_for_best_model`: an evaluate() metric such as "
            "'return' (eval_return) or '<agent>/return'."
        )
    if config.save_strategy == "best" and config.metric_for_best_model is None:
        raise ValueError("`save_strategy='best'` needs `metric_for_best_model`: an evaluate() metric such as 'return'.")


def markdown_table() -> str:
    """The table docs/trl-ppo-differences.md carries (regenerate it with
    `python -c "from trl_collm.trainers.supported_args import markdown_table; print(markdown_table())"`)."""
    lines = ["| field | | what the team trainers do |", "|---|---|---|"]
    order = {HONOURED: 0, REJECTED: 1, NOT_APPLICABLE: 2}
    for name, s in sorted(SUPPORT.items(), key=lambda kv: (order[kv[1].status], kv[0])):
        note = s.note + (f" (values: {', '.join(s.allowed)})" if s.allowed else "")
        lines.append(f"| `{name}` | {s.status} | {note.replace('|', '/')} |")
    return "\n".join(lines)


def warn_if_bf16_is_emulated(config) -> None:
    """`bf16=True` on a CPU that only emulates bfloat16: one warning (bf16 stays on, as asked). Measured on a 2-core
    AVX2 machine: 59 s per MC iteration in bf16, 8.9 s in float32 (docs/models.md); a native-bf16 CPU (AVX512-BF16,
    AMX, Arm BF16; trl_collm.hardware) says nothing."""
    import torch

    from ..hardware import cpu_description, cpu_has_native_bf16

    on_cpu = config.use_cpu or not torch.cuda.is_available()
    if config.bf16 and on_cpu and not cpu_has_native_bf16():
        warnings.warn(
            f"bf16=True on a CPU without native bf16 ({cpu_description()}): its bf16 matmuls are emulated, about 6x "
            "slower than float32 (59 s vs 8.9 s per iteration measured in docs/models.md); set bf16=False to train "
            "in float32.",
            UserWarning,
            stacklevel=4,
        )
