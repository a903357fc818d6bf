"""`trl-collm` command line: train (ppo / mc), score (eval) and run (play) teams on the built-in tasks or your own.

    trl-collm ppo  --config examples/configs/coord-penalty/cc-cpu.yaml [--learning_rate 1e-2 ...]
    trl-collm mc   --config examples/configs/coord-penalty/mc-cpu.yaml
    trl-collm eval --team_dir outputs/coord-penalty-cc --task coord-penalty [--limit 32]
    trl-collm play --team_dir outputs/coord-penalty-cc --task coord-penalty [--limit 3] [--render DIR]
    trl-collm tasks

Training configs follow TRL's convention (TrlParser): a YAML file whose keys are the fields of `TaskArguments`,
the trainer config and TRL's `ModelConfig`; command-line flags override the file. `model_name_or_path: tiny` uses
the offline tiny-model factory (no download). `--task` takes a built-in name or your own task as MODULE:NAME /
path/to/file.py:NAME (`trl-collm tasks` says what NAME must be); `--agent_models A B` gives each agent its own model.

A mistake in the arguments prints one line `trl-collm: error: ...` and exits with status 2; `--debug` (or the
environment variable TRL_COLLM_DEBUG=1) shows the full traceback instead. See docs/cli.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

from ..tasks import call_with_supported
from .common import (
    DEBUG_ENV,
    USAGE,
    TaskArguments,
    UsageError,
    _check_dataset_args,
    _check_options,
    _check_team_shape,
    _get_task,
    _options,
    _parser_error,
    _resolve_model,
    _task_turns,
    set_cpu_threads,
    user_errors,
)
from .evaluate import evaluate_team
from .precheck import (
    check_config_keys,
    keep_option_names,
    kept_help_text,
    kept_names,
    kept_options,
    precheck,
    read_config,
)


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


# ModelConfig's bitsandbytes fields: the team trainers load models without quantization
_QUANTIZATION = (
    "load_in_8bit",
    "load_in_4bit",
    "bnb_4bit_quant_type",
    "use_bnb_nested_quant",
    "bnb_4bit_quant_storage",
)


def _hidden_fields(config_cls) -> set[str]:
    """Fields `--help` leaves out: TrainingArguments fields that are refused unless default or do not apply here
    (trainers/supported_args.py), GRPOConfig's fields that MC parses only to refuse (trainers/grpo_fields.py; TRL's
    script passes them, docs/from-grpo.md lists them) and ModelConfig's quantization flags (refused)."""
    from ..trainers.grpo_fields import GRPORefusedFields
    from ..trainers.supported_args import HONOURED, SUPPORT

    hidden = {name for name, sup in SUPPORT.items() if sup.status != HONOURED} | set(_QUANTIZATION)
    if issubclass(config_cls, GRPORefusedFields):
        hidden |= set(GRPORefusedFields.__dataclass_fields__)
    return hidden


def _group_help(parser, config_cls) -> None:
    """Group `--help` as TRL's scripts read (task, model, the trainer's own fields, inherited training arguments)
    and hide the fields a user cannot use here (they are still parsed, and refused in one line when set)."""
    import argparse
    import dataclasses

    from transformers import TrainingArguments
    from trl import ModelConfig

    hidden = _hidden_fields(config_cls)
    inherited = {f.name for f in dataclasses.fields(TrainingArguments)}
    own = {f.name for f in dataclasses.fields(config_cls)} - inherited
    groups = [
        (
            "task",
            "what to train on (trl-collm tasks lists the built-ins)",
            {f.name for f in dataclasses.fields(TaskArguments)},
        ),
        ("model", "TRL's ModelConfig: the agents' model and LoRA", {f.name for f in dataclasses.fields(ModelConfig)}),
        (config_cls.__name__, "the multi-agent trainer's own fields (docs/algorithm.md)", own),
        (
            "training",
            "transformers' TrainingArguments honoured by the team trainers; the refused ones are hidden "
            "(docs/trl-ppo-differences.md lists every field)",
            inherited,
        ),
    ]
    general = parser._action_groups[1]  # argparse's "options" group, where HfArgumentParser put every field
    moved = []
    for title, description, names in groups:
        group = parser.add_argument_group(title, description)
        for action in general._group_actions:
            if action.dest in names and action not in moved:
                group._group_actions.append(action)
                moved.append(action)
    general._group_actions[:] = [a for a in general._group_actions if a not in moved]
    for action in parser._actions:
        if action.dest in hidden:
            action.help = argparse.SUPPRESS


def _train_parser(kind: str, config_cls):
    from trl import ModelConfig, TrlParser

    prog = f"trl-collm {kind}"
    parser = TrlParser((TaskArguments, config_cls, ModelConfig), prog=prog)
    parser.error = _parser_error(prog)
    _group_help(parser, config_cls)
    return parser


def _check_config_keys(kind: str, argv: list[str], parser) -> None:
    """The YAML keys no option takes, said in one line (naming the other trainer when they are its options)."""
    path, config = read_config(argv)
    names = {a.dest for a in parser._actions}
    if path is None or set(config) <= names | {"env"}:
        return
    twin = "mc" if kind == "ppo" else "ppo"
    other = {a.dest for a in _train_parser(twin, _config_cls(twin))._actions}
    check_config_keys(kind, path, config, names, other)


def _parse_training(parser, argv: list[str]):
    with user_errors():
        return parser.parse_args_and_config(argv)


def _check_model_args(model_args) -> None:
    on = [f for f in ("load_in_8bit", "load_in_4bit") if getattr(model_args, f, False)]
    if on:
        raise UsageError(
            f"--{on[0]} is not supported by the team trainers (models load unquantized); drop it, and use "
            "--use_peft true for a lighter training"
        )


SHIPPED_HELP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "help_texts")


def _help_key(kind: str) -> str:
    """The name of `trl-collm KIND --help`'s kept text: keyed by the trl / transformers versions and the contents of
    the files that define the options, so that a text is only ever read back for the parser it came from."""
    import hashlib
    from importlib.metadata import PackageNotFoundError, version

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # trl_collm/
    key = [kind]
    for pkg in ("trl", "transformers"):
        try:
            key.append(version(pkg))
        except PackageNotFoundError:
            key.append("-")
    options = ("cli/__init__.py", "cli/common.py", "trainers/team_config.py", "trainers/backend_fields.py")
    options += (f"trainers/{kind}_config.py",)
    digest = hashlib.sha256("|".join(key).encode())
    for rel in (*options, "trainers/supported_args.py"):
        with open(os.path.join(here, rel), "rb") as f:
            digest.update(rel.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return f"{kind}-{digest.hexdigest()[:16]}.txt"


def _help_cache_file(kind: str, key: str | None = None) -> str:
    """Where this user's `trl-collm KIND --help` is kept (written by the first parser build; `key`: its
    `_help_key`, when already computed). Building the parser imports transformers and torch (seconds; over a minute
    on a cold, busy machine), reading the text does not."""
    root = os.environ.get("TRL_COLLM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trl_collm")
    return os.path.join(root, "help", key or _help_key(kind))


def _help_file(kind: str) -> str:
    """The kept text to read: this user's, else the one shipped in the package for the same key (written by
    tools/ship_help_texts.py, so a fresh install's first --help and config-key check skip the heavy imports too),
    else the user's path (absent: the parser gets built)."""
    key = _help_key(kind)  # reads and hashes the option files: once per call
    mine = _help_cache_file(kind, key)
    shipped = os.path.join(SHIPPED_HELP_DIR, key)
    if not os.path.isfile(mine) and os.path.isfile(shipped) and not os.environ.get("TRL_COLLM_NO_SHIPPED_HELP"):
        return shipped
    return mine


def _keep_parser(kind: str, parser=None) -> str:
    """Keep `trl-collm KIND --help`'s text and option names (building the parser when not given); returns the
    text. Whoever builds a parser keeps both commands' (the second costs a fraction of a second once transformers
    is imported), so later --help calls and config-key checks of either command skip the heavy imports."""
    path = _help_cache_file(kind)
    parser = parser or _train_parser(kind, _config_cls(kind))
    keep_option_names(path, parser, *field_choices(kind))
    text = parser.format_help()
    with contextlib.suppress(OSError):  # a read-only home only costs the next --help its seconds
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + f".{os.getpid()}", "w") as f:
            f.write(text)
        os.replace(path + f".{os.getpid()}", path)
    return text


def _keep_both(kind: str, parser) -> None:
    _keep_parser(kind, parser)
    twin = "mc" if kind == "ppo" else "ppo"
    twin_file = _help_file(twin)
    if kept_help_text(twin_file, twin) is None or kept_names(twin_file) is None or kept_options(twin_file) is None:
        _keep_parser(twin)


def _print_help(kind: str) -> None:
    text = kept_help_text(_help_file(kind), kind)
    if text is None:  # never kept, or the kept file is damaged: build the parser and keep its text again
        parser = _train_parser(kind, _config_cls(kind))
        _keep_both(kind, parser)
        text = parser.format_help()
    print(text, end="")


def field_choices(kind: str) -> tuple[dict, dict]:
    """The trainer config's own choice fields (TEAM_CHOICES and its module's `*CHOICES` tables, checked in its
    `_validate`) for the flag check before the parser, and the values it refuses with a message of its own (MC's
    GRPO loss types that are not here: it names the nearest)."""
    from ..trainers.team_config import TEAM_CHOICES

    module = sys.modules[_config_cls(kind).__module__]
    choices = dict(TEAM_CHOICES)
    for name, table in vars(module).items():
        if name.endswith("CHOICES") and isinstance(table, dict):
            choices.update(table)
    choices = {k: list(v) for k, v in choices.items() if all(isinstance(c, str) for c in v)}
    explained = {}
    if kind == "mc":
        from ..trainers.grpo_fields import OTHER_GRPO_LOSS_TYPES

        explained["loss_type"] = sorted(OTHER_GRPO_LOSS_TYPES)
    return choices, explained


def _config_cls(kind: str):
    if kind == "ppo":
        from ..trainers.ppo_config import MultiAgentPPOConfig

        return MultiAgentPPOConfig
    from ..trainers.mc_config import MultiAgentMCConfig

    return MultiAgentMCConfig


def train(kind: str, argv: list[str]) -> str | None:
    if "-h" in argv or "--help" in argv:
        _print_help(kind)
        return None
    precheck(kind, argv, _help_file)  # before the parser: building it imports transformers and torch
    parser = _train_parser(kind, _config_cls(kind))
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


def list_tasks_text() -> str:
    """The `trl-collm tasks` listing: the built-ins from the catalogue (no task module is imported), then how to
    use your own."""
    from ..tasks import BUILTIN_TASKS, IMPORT_PATH_HELP

    lines = [
        f"{name:18s} {agents} agents, {turns} turn(s)  {desc}"
        for name, (_, agents, turns, desc) in sorted(BUILTIN_TASKS.items())
    ]
    lines += [
        "",
        f"Or {IMPORT_PATH_HELP}; e.g. trl-collm ppo --task my_tasks.py:TASK --model_name_or_path tiny --use_cpu true.",
        "Mixed team: --agent_models MODEL_1 MODEL_2 (one model per agent, in agent order). See docs/cli.md.",
    ]
    return "\n".join(lines)


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\n" + USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command in ("ppo", "mc"):
        train(command, rest)
    elif command == "eval":
        evaluate_team(rest)
    elif command == "play":
        evaluate_team(rest, play_mode=True)
    elif command == "tasks":
        print(list_tasks_text())
    else:
        raise UsageError(f"unknown command {command!r}; {USAGE.removeprefix('usage: ')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get(DEBUG_ENV, "").lower() in ("1", "true", "yes")
    argv = [a for a in argv if a != "--debug"]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return _dispatch(argv)
    except UsageError as e:
        if debug:
            raise
        message = " ".join(str(e).split())  # one line, whatever the message held
        print(f"trl-collm: error: {message}", file=sys.stderr)
        return 2
