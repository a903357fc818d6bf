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
import inspect
import json
import os
import sys
from dataclasses import dataclass, field

TINY = "tiny"
DEBUG_ENV = "TRL_COLLM_DEBUG"
USAGE = "usage: trl-collm {ppo,mc,eval,play,tasks} ... [--debug] (trl-collm <command> --help for its options)"


class UsageError(Exception):
    """A mistake in what the user asked for. `main` prints it as one line and exits with status 2."""


@contextlib.contextmanager
def user_errors(context: str = ""):
    """Inside this block (argument parsing, config validation, building the trainer: before any training step),
    ValueError / OSError (FileNotFoundError, a model path that does not exist, ...) are the user's to fix and
    become UsageError. Training, evaluation and saving run outside it: an error there is a bug and keeps its
    traceback. A missing optional package (ImportError) is the user's to install."""
    try:
        yield
    except UsageError:
        raise
    except (ValueError, OSError, ImportError) as e:  # ImportError: an optional package is missing (vLLM)
        raise UsageError(f"{context}{e}") from e
    except RuntimeError as e:  # the code sandbox missing on this machine: its message already says the fix
        from .sandbox.bwrap import SandboxUnavailable

        if isinstance(e, SandboxUnavailable):
            raise UsageError(f"{context}{e}") from e
        raise


@dataclass
class TaskArguments:
    task: str = field(
        default="coord-penalty",
        metadata={
            "help": "A built-in task name (`trl-collm tasks` lists them) or your own task as MODULE:NAME or "
            "path/to/file.py:NAME, NAME being a trl_collm.tasks.TaskSpec or a no-argument function returning one."
        },
    )
    task_options: str | None = field(
        default=None, metadata={"help": "JSON dict of task options, e.g. '{\"turns\": 4}'."}
    )
    agent_models: list[str] | None = field(
        default=None,
        metadata={
            "help": "One model path or Hub id per agent, in agent order (a mixed team: each agent its own model and "
            "tokenizer); default: model_name_or_path for every agent."
        },
    )
    dataset_source: str | None = field(
        default=None, metadata={"help": "The task's dataset source (a Hub dataset, or e.g. building targets 'I,L')."}
    )
    train_limit: int | None = field(default=None, metadata={"help": "Use at most this many training rows."})
    eval_limit: int | None = field(default=None, metadata={"help": "Use at most this many evaluation rows."})
    plot: bool = field(
        default=True, metadata={"help": "Write learning_curve.png / .json into output_dir after training."}
    )
    threads: int | None = field(
        default=None,
        metadata={
            "help": "torch's intra-op thread count. Default on CPU: OMP_NUM_THREADS when it is set, else 1 (the CPU "
            "configs' tiny models run fastest on one thread, and more threads spin-wait on a shared machine); "
            "default on GPU: torch's own choice."
        },
    )


def _options(task_options) -> dict:
    if not task_options:
        return {}
    if isinstance(task_options, str):
        try:
            opts = json.loads(task_options)
        except json.JSONDecodeError as e:
            raise UsageError(
                f"--task_options {task_options!r} is not valid JSON ({e.msg}); pass a JSON object, "
                "e.g. '{\"turns\": 4}'"
            ) from e
    else:
        opts = dict(task_options)
    if not isinstance(opts, dict):
        raise UsageError(f"--task_options must be a JSON object, e.g. '{{\"turns\": 4}}', got {task_options!r}")
    return opts


def set_cpu_threads(threads: int | None, on_cpu: bool) -> int | None:
    """Choose torch's intra-op thread count: `threads` when given; on CPU, OMP_NUM_THREADS when set (torch read it
    at import), else 1; on GPU, torch's default. torch's own CPU default (one thread per core) made the tiny-model CPU
    configs 10-25x slower on a shared machine: its threads spin-wait for cores other processes hold. Returns the
    count set, or None when torch's choice stands."""
    if threads is not None and threads < 1:
        raise UsageError(f"--threads {threads}: give a thread count >= 1, or leave it unset for the default")
    if threads is None and (not on_cpu or os.environ.get("OMP_NUM_THREADS")):
        return None
    import torch

    torch.set_num_threads(threads or 1)
    return threads or 1


def _call_with_supported(fn, **kwargs):
    from .tasks import call_with_supported

    return call_with_supported(fn, **kwargs)


def _task_turns(task, opts: dict) -> int:
    return int(opts.get("num_turns", opts.get("turns", task.num_turns)))


def looks_local(path: str) -> bool:
    """A path a user means as a local folder (absolute, relative with ./ or ../, ~, or deeper than 'org/name'),
    never a Hub repo id: missing, it is a missing folder, not a malformed repo id."""
    return path.startswith(("/", "./", "../", "~")) or path.count("/") > 1 or path.endswith("/") or "\\" in path


def _resolve_model(path: str | None, flag: str = "--model_name_or_path") -> str:
    if path in (None, TINY):
        from .testing import tiny_model_dir

        return tiny_model_dir("tiny-qwen2")
    from .models import PACKAGED_MODELS, resolve_model_name

    resolved = resolve_model_name(path)  # a packaged model's name (e.g. smollm2-135m-instruct) becomes its folder
    if resolved == path and looks_local(path) and not os.path.isdir(os.path.expanduser(path)):
        raise UsageError(
            f"{flag} {path}: no such folder; give a local model folder (save_pretrained output), a Hub id such as "
            f"Qwen/Qwen2.5-0.5B, a packaged model ({', '.join(sorted(PACKAGED_MODELS))}) or `tiny` for the offline "
            "tiny model"
        )
    return os.path.expanduser(resolved) if isinstance(resolved, str) else resolved


def _parser_error(prog: str):
    def error(message: str):  # argparse prints the whole usage and exits; one line is enough
        raise UsageError(f"{prog}: {message} ({prog} --help lists the options)")

    return error


def _get_task(name: str):
    from .tasks import get_task

    try:
        with user_errors():
            return get_task(name)
    except TypeError as e:  # an import path naming something that is not a task
        raise UsageError(str(e)) from e


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
    (trainers/supported_args.py), and ModelConfig's quantization flags (refused)."""
    from .trainers.supported_args import HONOURED, SUPPORT

    return {name for name, sup in SUPPORT.items() if sup.status != HONOURED} | set(_QUANTIZATION)


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


def _check_config_file(argv: list[str]) -> None:
    """Read --config before the parser is built (building it imports transformers and torch, seconds of CPU): a
    missing or malformed file costs only a YAML parse."""
    path = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"), None)
    path = path or next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if path is None:
        return
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise UsageError(f"--config {path}: {e.strerror or e}; give the path of a YAML config file") from e
    except yaml.YAMLError as e:  # the message holds the line and column
        raise UsageError(f"--config {path}: not valid YAML: {e}; fix that line") from e
    if data is not None and not isinstance(data, dict):
        raise UsageError(
            f"--config {path}: the file must hold `field: value` lines (a YAML mapping), not a {type(data).__name__}"
        )


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


def _check_options(task, opts: dict) -> None:
    """--task_options the task's make_env and load_dataset do not take would be dropped: refuse them."""
    takers = [task.make_env, task.load_dataset]
    if not opts or any(_takes_any_keyword(f) for f in takers):
        return
    known = set().union(*(inspect.signature(f).parameters for f in takers)) - {"split", "source", "limit"}
    unknown = sorted(set(opts) - known)
    if unknown:
        raise UsageError(
            f"--task_options: task {task.name!r} takes no option {', '.join(map(repr, unknown))} "
            f"(its options: {sorted(known) or 'none'}); drop it"
        )


def _takes_any_keyword(fn) -> bool:
    return any(p.kind == p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())


def _check_dataset_args(task, source, limits: dict) -> None:
    for flag, value in limits.items():
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value}: give a number of rows >= 1, or leave it unset for every row")
    takes_source = _takes_any_keyword(task.load_dataset) or "source" in inspect.signature(task.load_dataset).parameters
    if source is not None and not takes_source:
        raise UsageError(f"--dataset_source: task {task.name!r} has no dataset source to choose; drop it")


def _count_agents(task, env, row: dict, names: list[str]) -> int:
    """How many agents the task's environment actually seats (one observation each), from one episode's start."""
    from .envs.protocol import _validate_observations

    with user_errors(f"task {task.name!r} could not start an episode to check the team: "):
        probe = env.clone()
        try:
            observations = probe.reset(row)
        except ValueError:  # an env that seats any team size (RewardFunctionEnv without names): start it with ours
            observations = probe.reset_batch([row], len(names), names)[0]
        where = f"{type(env).__name__}.reset"  # the prompts as the rollout will check them (e.g. none empty)
        n = len(observations) if isinstance(observations, (list, tuple)) else 0  # anything else: refused below
        return len(_validate_observations(observations, where, 0, n, None))


def _check_team_shape(task, env, row: dict, names: list[str], opts: dict) -> None:
    """The team the flags describe must fit the environment, said before any model loads."""
    declared = getattr(env, "agent_names", None)
    if declared is not None and list(declared) != list(names):
        raise UsageError(
            f"--agent_names {' '.join(names)}: task {task.name!r} is played by {list(declared)}; drop --agent_names"
        )
    seats = _count_agents(task, env, row, names)
    if seats != len(names):
        via = "--task_options num_agents" if "num_agents" in opts else "--agent_names"
        raise UsageError(
            f"{via} asks for {len(names)} agents {names} but task {task.name!r} (with these --task_options) "
            f"seats {seats}; give {seats} agent names, or a task option that changes its team size"
        )


def _help_cache_file(kind: str) -> str:
    """Where `trl-collm KIND --help` is kept, keyed by the package versions and the files that define the options:
    building the parser imports transformers and torch (seconds), reading the kept text does not."""
    import hashlib
    from importlib.metadata import PackageNotFoundError, version

    here = os.path.dirname(os.path.abspath(__file__))
    key = [kind]
    for pkg in ("trl", "transformers"):
        try:
            key.append(version(pkg))
        except PackageNotFoundError:
            key.append("-")
    for rel in ("cli.py", "trainers/team_config.py", f"trainers/{kind}_config.py", "trainers/supported_args.py"):
        st = os.stat(os.path.join(here, rel))
        key.append(f"{rel}:{st.st_size}:{st.st_mtime_ns}")
    digest = hashlib.sha256("|".join(key).encode()).hexdigest()[:16]
    root = os.environ.get("TRL_COLLM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trl_collm")
    return os.path.join(root, "help", f"{kind}-{digest}.txt")


def _print_help(kind: str, config_cls_of) -> None:
    path = _help_cache_file(kind)
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        text = _train_parser(kind, config_cls_of()).format_help()
        with contextlib.suppress(OSError):  # a read-only home only costs the next --help its seconds
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + f".{os.getpid()}", "w") as f:
                f.write(text)
            os.replace(path + f".{os.getpid()}", path)
    print(text, end="")


def _config_cls(kind: str):
    if kind == "ppo":
        from .trainers.ppo_config import MultiAgentPPOConfig

        return MultiAgentPPOConfig
    from .trainers.mc_config import MultiAgentMCConfig

    return MultiAgentMCConfig


def train(kind: str, argv: list[str]) -> str | None:
    if "-h" in argv or "--help" in argv:
        _print_help(kind, lambda: _config_cls(kind))
        return None
    _check_config_file(argv)
    config_cls = _config_cls(kind)
    task_args, args, model_args = _parse_training(_train_parser(kind, config_cls), argv)
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
        train_ds = _call_with_supported(task.load_dataset, split="train", limit=task_args.train_limit, **data_kwargs)
        eval_ds = _call_with_supported(task.load_dataset, split="eval", limit=task_args.eval_limit, **data_kwargs)
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
        env = _call_with_supported(task.make_env, **opts)
        _check_team_shape(task, env, train_ds[0], args.agent_names, opts)
        if task_args.agent_models:
            model = [_resolve_model(p, "--agent_models") for p in task_args.agent_models]
        else:
            model = _resolve_model(model_args.model_name_or_path)
        from trl import get_peft_config

        peft_config = get_peft_config(model_args)
        # --resume_from_checkpoint DIR, or true for the newest complete checkpoint in output_dir
        from .trainers.checkpoints import refuse_to_clobber, resolve

        resume = resolve(args.resume_from_checkpoint, args.output_dir)
        if resume is None:  # an earlier run's checkpoints: said here in one line, not as a traceback from train()
            refuse_to_clobber(args.output_dir, args.overwrite_output_dir)
        from .trainers import MultiAgentMCTrainer, MultiAgentPPOTrainer

        trainer_cls = MultiAgentPPOTrainer if kind == "ppo" else MultiAgentMCTrainer
        trainer = trainer_cls(
            args=args, model=model, train_dataset=train_ds, eval_dataset=eval_ds, env=env, peft_config=peft_config
        )
        trainer.task_record = task_record(task, task_args.task, opts, task_args.dataset_source)
    with _disk_errors(args.output_dir):
        trainer.train(resume_from_checkpoint=resume)
        trainer.save_model(args.output_dir)
    model_name = os.path.basename(os.path.normpath(args.output_dir))
    # the card's loader snippet calls get_task() with this: the built-in name, or the import path as given
    trainer.create_model_card(model_name=model_name, task=task_args.task)
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
    """A full disk while training or saving is the machine's state, not a bug: one line saying where and what."""
    import errno

    from .trainers.checkpoints import CheckpointWriteError

    try:
        yield
    except CheckpointWriteError as e:
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


def _eval_parser(prog: str, play: bool):
    import argparse

    p = argparse.ArgumentParser(
        prog=prog,
        description="Generation settings default to those the team was trained "
        "with (team.json); the flags override them.",
    )
    p.add_argument("--team_dir", required=True, help="output_dir of a saved team (a local folder)")
    p.add_argument(
        "--task",
        default=None,
        help="built-in task name, or your own as MODULE:NAME / FILE.py:NAME; default: the task the team was trained "
        "on (team.json), and another one is refused",
    )
    p.add_argument(
        "--task_options", default=None, help="JSON dict of task options; default: the training's (team.json)"
    )
    p.add_argument("--split", default="eval", choices=("train", "eval"))
    p.add_argument(
        "--dataset_source",
        default=None,
        help="the task's dataset source (e.g. building targets 'I,L'); default: the training's (team.json)",
    )
    p.add_argument("--limit", type=int, default=None if not play else 3, help="rows to use")
    p.add_argument("--max_new_tokens", type=int, default=None, help="default: the team's response_length, else 64")
    p.add_argument("--temperature", type=float, default=None, help="with --sample; default: the team's, else 1.0")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--base_model", default=None, help="base model of a LoRA team (overrides team.json)")
    p.add_argument("--device", default=None)
    p.add_argument(
        "--use_transformers_continuous_batching",
        action="store_true",
        help="generate with transformers' continuous batching (generate_batch) instead of generate()",
    )
    p.add_argument(
        "--transformers_continuous_batching_config",
        default=None,
        help="JSON dict for transformers' ContinuousBatchingConfig",
    )
    p.add_argument(
        "--use_vllm",
        action="store_true",
        help="generate with vLLM (docs/generation.md; one engine per agent model, LoRA adapters as vLLM LoRA)",
    )
    p.add_argument("--vllm_max_model_length", type=int, default=None, help="vLLM context window (default: model's)")
    p.add_argument("--vllm_gpu_memory_utilization", type=float, default=0.3, help="GPU memory share of the engine")
    p.add_argument("--vllm_model_impl", default="vllm", choices=["vllm", "transformers"])
    if play:
        p.add_argument(
            "--render",
            default=None,
            metavar="DIR",
            help="building game: write a PNG of the world after every turn into DIR",
        )
    p.error = _parser_error(prog)
    return p


def _check_team_folder(team_dir: str, desc: dict) -> None:
    """Every agent folder team.json names exists and holds a model or an adapter."""
    for a in desc.get("agents", []):
        rel = desc.get("agent_folders", {}).get(a)
        folder = os.path.normpath(os.path.join(team_dir, rel)) if rel is not None else None
        if folder is None or not os.path.isdir(folder):
            raise UsageError(
                f"--team_dir {team_dir}: team.json names agent {a!r} in folder {rel!r}, which is missing; "
                "pass the complete output_dir of a save_model() / training run"
            )
        if not any(os.path.isfile(os.path.join(folder, f)) for f in ("config.json", "adapter_config.json")):
            raise UsageError(
                f"--team_dir {team_dir}: agent {a!r}'s folder {folder} has no config.json or "
                "adapter_config.json; pass the complete output_dir of a save_model() / training run"
            )
        _check_weights(team_dir, folder)


def _check_weights(team_dir: str, folder: str) -> None:
    """A truncated or corrupt weights file (an interrupted copy), named in one line before any model loads: reading
    a safetensors header is cheap, and safetensors' own error names no file."""
    from safetensors import SafetensorError, safe_open

    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            path = os.path.join(folder, name)
            try:
                with safe_open(path, "pt"):
                    pass
            except SafetensorError as e:
                raise UsageError(
                    f"--team_dir {team_dir}: {path} cannot be read ({e}); it is truncated or corrupt: copy the team "
                    "folder again or re-save it"
                ) from e


def check_team_fits_task(task, env, row: dict, desc: dict, team_dir: str, explicit_options: bool) -> None:
    """Refuse to score a team on a task it cannot play: other agent names (when the task fixes them), another
    number of agents, or another episode length than the team was trained for (unless the options say so)."""
    team_agents = list(desc["agents"])
    declared = getattr(env, "agent_names", None)
    if declared is not None and list(declared) != team_agents:
        raise UsageError(
            f"the team in {team_dir} has agents {team_agents} but task {task.name!r} is played by "
            f"{list(declared)}; score a team trained on this task"
        )
    seats = _count_agents(task, env, row, team_agents)
    if seats != len(team_agents):
        raise UsageError(
            f"task {task.name!r} has {seats} agents but the team in {team_dir} has "
            f"{len(team_agents)} ({', '.join(team_agents)}); score a team trained on this task"
        )
    trained_turns = desc.get("num_turns")
    if not explicit_options and trained_turns and trained_turns != task.num_turns:
        length = [k for k in ("num_turns", "turns") if k in (task.options or {})]
        hint = f"pass --task_options '{{\"{length[0]}\": {trained_turns}}}' to play it that long, or " if length else ""
        raise UsageError(
            f"the team in {team_dir} was trained for {trained_turns} turn(s) but task {task.name!r} "
            f"runs {task.num_turns}; {hint}score a team trained on this task"
        )


def _task_for_eval(ns, desc: dict, asked):
    """The task, options and dataset source to score a saved team on: the flags, else what team.json records. A
    team that records its task is refused on another task or other options (another reward)."""
    recorded = desc.get("task") if isinstance(desc.get("task"), dict) else None
    if ns.task is None and recorded is None:
        raise UsageError(
            f"--task: {os.path.join(ns.team_dir, 'team.json')} records no task (saved by an older trl-collm or by "
            "Python code); pass --task with the task the team was trained on"
        )
    task = asked if asked is not None else _get_task(recorded["ref"])
    opts = _options(ns.task_options)
    if recorded is None:
        return task, opts, ns.dataset_source
    if task.name != recorded["name"]:
        raise UsageError(
            f"--task {ns.task}: the team in {ns.team_dir} was trained on task {recorded['name']!r}; drop --task to "
            "score it on that task"
        )
    trained = recorded.get("options") or {}
    if ns.task_options is not None and opts != trained:
        raise UsageError(
            f"--task_options {json.dumps(opts)}: the team in {ns.team_dir} was trained with {json.dumps(trained)} "
            "(other options change the reward or the game); drop --task_options to use the training's"
        )
    source = ns.dataset_source if ns.dataset_source is not None else recorded.get("dataset_source")
    return task, trained, source


def evaluate_team(argv: list[str], play_mode: bool = False):
    prog = f"trl-collm {'play' if play_mode else 'eval'}"
    opts_ns = _eval_parser(prog, play_mode).parse_args(argv)
    if opts_ns.use_vllm:  # before any team or task is loaded
        with user_errors():
            from .vllm_backend import check_vllm_fields

            check_vllm_fields(opts_ns)
    asked = _get_task(opts_ns.task) if opts_ns.task is not None else None  # a wrong name is said first
    if not os.path.isfile(os.path.join(opts_ns.team_dir, "team.json")):
        raise UsageError(
            f"--team_dir {opts_ns.team_dir} has no team.json; pass the output_dir of a `trl-collm ppo` / "
            "`mc` run or of save_model()"
        )
    with user_errors():
        from .inference import read_team_file

        desc = read_team_file(opts_ns.team_dir)
    _check_team_folder(opts_ns.team_dir, desc)
    task, opts, source = _task_for_eval(opts_ns, desc, asked)
    _check_options(task, opts)
    _check_dataset_args(task, source, {"--limit": opts_ns.limit})
    if play_mode and opts_ns.render is not None:
        _check_renderable(task, opts)
    num_turns = _task_turns(task, opts) if opts else (desc.get("num_turns") or task.num_turns)
    with user_errors():
        rows_ds = _call_with_supported(
            task.load_dataset, split=opts_ns.split, limit=opts_ns.limit, source=source, **opts
        )
        rows = [rows_ds[i] for i in range(len(rows_ds))]
        if not rows:
            raise UsageError(f"task {task.name!r} has no rows in split {opts_ns.split!r}; check --split / --limit")
        env = _call_with_supported(task.make_env, **opts)
    check_team_fits_task(task, env, rows[0], desc, opts_ns.team_dir, explicit_options=bool(opts))

    from .inference import load_team, play
    from .sampling import SamplingSettings, make_backend

    gen = desc.get("generation", {})
    with user_errors():
        # The training's sampling settings (team.json), greedy unless --sample; the flags given replace them.
        settings = SamplingSettings.from_team_json(
            gen, greedy=not opts_ns.sample, max_new_tokens=opts_ns.max_new_tokens, temperature=opts_ns.temperature
        )
        team = load_team(opts_ns.team_dir, base_model=opts_ns.base_model, device=opts_ns.device)
        backend = make_backend(opts_ns)  # generate(), continuous batching or vLLM (trl_collm/sampling.py)
    for a, limit in (gen.get("max_prompt_length") or {}).items():
        if a in team.names:
            team.prompt_limits[a] = limit
    transcripts = play(team, env, rows, num_turns=num_turns, settings=settings, backend=backend)
    returns = [sum(t["return"]) / len(t["return"]) for t in transcripts]
    mean = sum(returns) / len(returns)
    if play_mode:
        for tr in transcripts:
            print(f"=== episode {tr['episode']}  return per agent {tr['return']}")
            for turn in tr["turns"]:
                for a, io in turn["agents"].items():
                    print(
                        f"--- turn {turn['turn'] + 1} [{a}] prompt:\n{io['prompt']}\n"
                        f"--- [{a}] answer:\n{io['completion']}"
                    )
                print(f"--- turn {turn['turn'] + 1} reward {turn['reward']}")
        if opts_ns.render is not None:
            from .rendering import render_transcripts

            paths = render_transcripts(task, opts, rows, transcripts, team.names, opts_ns.render)
            print(f"rendered {len(paths)} PNG(s) into {opts_ns.render}")
    summary = {"task": task.name, "episodes": len(rows), "mean_return": mean}
    if task.max_reward:
        summary["percent_of_max"] = 100.0 * mean / task.max_reward
    print(json.dumps(summary))
    return summary, transcripts


def _check_renderable(task, opts: dict) -> None:
    with user_errors():
        env = _call_with_supported(task.make_env, **opts)
    if not callable(getattr(env, "render_png", None)):
        raise UsageError(
            f"--render draws the building game; task {task.name!r} ({type(env).__name__}) has no render_png(path)"
        )
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--render needs matplotlib: pip install 'trl-collm[plot]'")


def list_tasks_text() -> str:
    """The `trl-collm tasks` listing: the built-ins from the catalogue (no task module is imported), then how to
    use your own."""
    from .tasks import BUILTIN_TASKS, IMPORT_PATH_HELP

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


if __name__ == "__main__":
    sys.exit(main())
