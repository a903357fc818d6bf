"""`trl-collm ppo` / `trl-collm mc`: training a team from the command line (`train`): the arguments parsed and checked
before any model loads (the model flags, report_to, push_to_hub, the task, the team's shape, the datasets, the
checkpoints in output_dir), the trainer built and run, the team saved with its card, the learning curve written
(`write_curve`), the push; a full disk or a broken env said in one line (`_disk_errors`).
"""

from __future__ import annotations

import contextlib
import json
import os

from ..tasks import call_with_supported
from . import options
from .common import (
    UsageError,
    _check_dataset_args,
    _check_options,
    _check_team_shape,
    _get_task,
    _options,
    _resolve_model,
    _task_turns,
    set_cpu_threads,
    user_errors,
)
from .options import _check_config_keys, _config_cls, _help_file, _keep_both, _parse_training, _print_help
from .precheck import precheck


def _check_push(args) -> bool:
    """`--push_to_hub true`: fail before any model is loaded when the Hub cannot be used, and push only after the
    team is trained and saved (transformers' Trainer would create the repo in __init__, failing there offline)."""
    if not args.push_to_hub:
        return False
    from huggingface_hub import constants, get_token

    if constants.HF_HUB_OFFLINE:
        raise UsageError(
            "--push_to_hub needs the Hugging Face Hub, but HF_HUB_OFFLINE is set; unset it, or drop "
            "--push_to_hub and push the saved team later with trainer.push_to_hub()"
        )
    if not (args.hub_token or get_token()):
        raise UsageError("--push_to_hub needs a Hub token: run `hf auth login`, set HF_TOKEN, or pass --hub_token")
    args.push_to_hub = False
    return True


# report_to integration -> the packages that provide it (any one will do) and what to install
_REPORTERS = {
    "tensorboard": (("tensorboard", "tensorboardX"), "pip install 'trl-collm[tensorboard]'"),
    "wandb": (("wandb",), "pip install wandb"),
    "trackio": (("trackio",), "pip install trackio"),
    "mlflow": (("mlflow",), "pip install mlflow"),
    "comet_ml": (("comet_ml",), "pip install comet_ml"),
    "neptune": (("neptune",), "pip install neptune"),
    "clearml": (("clearml",), "pip install clearml"),
    "dvclive": (("dvclive",), "pip install dvclive"),
    "swanlab": (("swanlab",), "pip install swanlab"),
    "codecarbon": (("codecarbon",), "pip install codecarbon"),
    "azure_ml": (("azureml",), "pip install azureml-core"),
    "dagshub": (("dagshub",), "pip install dagshub"),
    "flyte": (("flytekit",), "pip install flytekit"),
    "kubeflow": (("kubeflow",), "pip install kubeflow"),
}


def _check_report_to(args) -> None:
    """transformers would fail in the trainer's __init__, after loading the models; say it before, in one line."""
    import importlib.util

    for name in args.report_to or []:
        modules, install = _REPORTERS.get(name, ((), ""))
        if modules and not any(importlib.util.find_spec(m) for m in modules):
            raise UsageError(f"--report_to {name} needs the {modules[0]} package: {install} (or pass --report_to none)")


def _check_model_args(model_args) -> None:
    on = [f for f in ("load_in_8bit", "load_in_4bit") if getattr(model_args, f, False)]
    if on:
        raise UsageError(
            f"--{on[0]} is not supported by the team trainers (models load unquantized); drop it, and use "
            "--use_peft true for a lighter training"
        )


def train(kind: str, argv: list[str]) -> str | None:
    if "-h" in argv or "--help" in argv:
        _print_help(kind)
        return None
    precheck(kind, argv, _help_file)  # before the parser: building it imports transformers and torch
    parser = options._train_parser(kind, _config_cls(kind))  # looked up on its module: one place to patch it
    _keep_both(kind, parser)
    _check_config_keys(kind, argv, parser)
    task_args, args, model_args = _parse_training(parser, argv)
    import torch

    set_cpu_threads(task_args.threads, on_cpu=args.use_cpu or not torch.cuda.is_available())
    _check_model_args(model_args)
    _check_report_to(args)
    task = _get_task(task_args.task)
    opts = _options(task_args.task_options)
    _check_options(task, opts)
    _check_dataset_args(
        task, task_args.dataset_source, {"--train_limit": task_args.train_limit, "--eval_limit": task_args.eval_limit}
    )
    push = _check_push(args)
    with user_errors():
        num_agents = opts.get("num_agents", len(task.agent_names))
        names_given = args.agent_names is not None or "num_agents" in opts
        if args.agent_names is None:
            same = num_agents == len(task.agent_names)
            args.agent_names = list(task.agent_names) if same else [f"agent_{i + 1}" for i in range(num_agents)]
        if task_args.agent_models and len(task_args.agent_models) != len(args.agent_names):
            raise UsageError(
                f"--agent_models lists {len(task_args.agent_models)} model(s) for {len(args.agent_names)} "
                f"agents {args.agent_names}; give one model per agent, in that order"
            )
        # The episode length is the task's (or its `turns` / `num_turns` option); num_turns=1, the default, means
        # "the task's".
        task_turns = _task_turns(task, opts)
        if args.num_turns == 1:
            args.num_turns = task_turns
        elif args.num_turns != task_turns:
            raise UsageError(
                f"--num_turns {args.num_turns} but task {task.name!r} runs {task_turns} turn(s); set its "
                "length with --task_options (e.g. '{\"num_turns\": 2}') instead"
            )
        init_kwargs = {
            k: v
            for k, v in (
                ("dtype", model_args.dtype),
                ("attn_implementation", model_args.attn_implementation),
                ("revision", model_args.model_revision),
            )
            if v not in (None, "main")
        }
        if init_kwargs:
            args.model_init_kwargs = {**init_kwargs, **(args.model_init_kwargs or {})}
        data_kwargs = dict(source=task_args.dataset_source, **opts)
        train_ds = call_with_supported(task.load_dataset, split="train", limit=task_args.train_limit, **data_kwargs)
        eval_ds = call_with_supported(task.load_dataset, split="eval", limit=task_args.eval_limit, **data_kwargs)
        # the trainer checks this only when train() starts; a user's mistake, said before any model loads
        local_batch = (
            args.per_device_train_batch_size * args.gradient_accumulation_steps * getattr(args, "num_mini_batches", 1)
        )
        if len(train_ds) < local_batch:
            raise UsageError(
                f"the training set has {len(train_ds)} rows (--train_limit {task_args.train_limit}) "
                f"but one rollout batch takes {local_batch} (--per_device_train_batch_size x "
                "--gradient_accumulation_steps x --num_mini_batches); lower the batch or raise "
                "--train_limit"
            )
        env = call_with_supported(task.make_env, **opts)
        _check_team_shape(task, env, train_ds[0], args.agent_names, opts, names_given)
        if task_args.agent_models:
            model = [_resolve_model(p, "--agent_models") for p in task_args.agent_models]
        else:
            model = _resolve_model(model_args.model_name_or_path)
        from trl import get_peft_config

        peft_config = get_peft_config(model_args)
        # --resume_from_checkpoint DIR, or true for the newest complete checkpoint in output_dir
        from ..trainers.checkpoints import refuse_to_clobber, resolve

        resume = resolve(args.resume_from_checkpoint, args.output_dir)
        if resume is None:  # an earlier run's checkpoints: said here in one line, not as a traceback from train()
            refuse_to_clobber(args.output_dir, args.overwrite_output_dir)
        from ..trainers import MultiAgentMCTrainer, MultiAgentPPOTrainer

        trainer_cls = MultiAgentPPOTrainer if kind == "ppo" else MultiAgentMCTrainer
        trainer = trainer_cls(
            args=args, model=model, train_dataset=train_ds, eval_dataset=eval_ds, env=env, peft_config=peft_config
        )
        trainer.task_record = task_record(task, task_args.task, opts, task_args.dataset_source)
    with _disk_errors(args.output_dir):
        trainer.train(resume_from_checkpoint=resume)
        trainer.save_model(args.output_dir)  # the team and its card (the card's task: task_record's ref, as given)
    if task_args.plot and trainer.is_world_process_zero():
        from .plotting import curve_title

        critic = (
            trainer.critic.describe_layout()[0] if trainer.critic is not None else None
        )  # as the layout names itself
        write_curve(trainer.metrics_history, args.output_dir, curve_title(task.name, kind, critic))
    if trainer.is_world_process_zero():
        print(f"saved the team and its card (README.md) to {args.output_dir}")
    if push:
        _push(trainer, args, task_args.task)
    return args.output_dir


@contextlib.contextmanager
def _disk_errors(output_dir: str):
    """A full disk while training or saving is the machine's state, not a bug: one line saying where and what. So is
    a task's env breaking the protocol (envs/protocol.py's EnvError names its class and method)."""
    import errno

    from ..envs.protocol import EnvError
    from ..trainers.checkpoints import CheckpointWriteError
    from ..trainers.output_dir import LockWriteError

    try:
        yield
    except (CheckpointWriteError, LockWriteError, EnvError) as e:  # their messages name the file / the env and the fix
        raise UsageError(str(e)) from e
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise UsageError(f"{e.filename or output_dir}: {e.strerror}; free space there and run again") from e


def task_record(task, ref: str, opts: dict, source: str | None) -> dict:
    """team.json's "task": what `eval` / `play` default to and check a team against. `ref` is the --task as given (a
    registry name, or an import path the user's machine resolves)."""
    return {"name": task.name, "ref": ref, "options": dict(opts), "dataset_source": source}


def _push(trainer, args, task_name: str) -> None:
    try:
        trainer.push_to_hub(model_name=os.path.basename(os.path.normpath(args.output_dir)), task=task_name)
    except Exception as e:  # noqa: BLE001 - the team is saved; any Hub failure (HTTP, DNS, httpx, token) is one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise UsageError(
            f"the team is saved in {args.output_dir}, but pushing it to the Hub failed ({type(e).__name__}: {first}); "
            "push it later with trainer.push_to_hub() or `hf upload`"
        ) from e


def write_curve(history: list[dict], output_dir: str, title: str) -> None:
    points = [{"episode": m["episode"], "score": m["objective/scores"]} for m in history if "objective/scores" in m]
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "learning_curve.json"), "w") as f:
        json.dump(points, f, indent=1)
    try:
        from .plotting import plot_learning_curve

        plot_learning_curve(points, os.path.join(output_dir, "learning_curve.png"), title=title)
    except ImportError:
        print("matplotlib is not installed: wrote learning_curve.json only (pip install 'trl-collm[plot]').")
