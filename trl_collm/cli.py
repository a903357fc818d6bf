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
    traceback."""
    try:
        yield
    except UsageError:
        raise
    except (ValueError, OSError) as e:
        raise UsageError(f"{context}{e}") from e


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


def _call_with_supported(fn, **kwargs):
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return fn(**kwargs)
    return fn(**{k: v for k, v in kwargs.items() if k in params})


def _task_turns(task, opts: dict) -> int:
    return int(opts.get("num_turns", opts.get("turns", task.num_turns)))


def _resolve_model(path: str | None) -> str:
    if path in (None, TINY):
        from .testing import tiny_model_dir

        return tiny_model_dir("tiny-qwen2")
    from .models import resolve_model_name

    return resolve_model_name(path)


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


def _check_report_to(args) -> None:
    """transformers would fail in the trainer's __init__, after loading the models; say it before, in one line."""
    import importlib.util

    if "tensorboard" in (args.report_to or []) and not any(
        importlib.util.find_spec(m) for m in ("tensorboard", "tensorboardX")
    ):
        raise UsageError(
            "--report_to tensorboard needs the tensorboard package: pip install 'trl-collm[tensorboard]' "
            "(or pass --report_to none)"
        )


def train(kind: str, argv: list[str]) -> str:
    from trl import ModelConfig, TrlParser, get_peft_config

    from .configs import MultiAgentMCConfig, MultiAgentPPOConfig
    from .trainers import MultiAgentMCTrainer, MultiAgentPPOTrainer

    config_cls, trainer_cls = (
        (MultiAgentPPOConfig, MultiAgentPPOTrainer) if kind == "ppo" else (MultiAgentMCConfig, MultiAgentMCTrainer)
    )
    prog = f"trl-collm {kind}"
    parser = TrlParser((TaskArguments, config_cls, ModelConfig), prog=prog)
    parser.error = _parser_error(prog)
    with user_errors():
        task_args, args, model_args = parser.parse_args_and_config(argv)
    _check_report_to(args)
    task = _get_task(task_args.task)
    opts = _options(task_args.task_options)
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
        if task_args.agent_models:
            model = [_resolve_model(p) for p in task_args.agent_models]
        else:
            model = _resolve_model(model_args.model_name_or_path)
        peft_config = get_peft_config(model_args)
        # --resume_from_checkpoint DIR, or true for the newest complete checkpoint in output_dir
        from .trainers.checkpoints import refuse_to_clobber, resolve

        resume = resolve(args.resume_from_checkpoint, args.output_dir)
        if resume is None:  # an earlier run's checkpoints: said here in one line, not as a traceback from train()
            refuse_to_clobber(args.output_dir, args.overwrite_output_dir)
        trainer = trainer_cls(
            args=args, model=model, train_dataset=train_ds, eval_dataset=eval_ds, env=env, peft_config=peft_config
        )
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(args.output_dir)
    model_name = os.path.basename(os.path.normpath(args.output_dir))
    # the card's loader snippet calls get_task() with this: the built-in name, or the import path as given
    trainer.create_model_card(model_name=model_name, task=task_args.task)
    if task_args.plot and trainer.is_world_process_zero():
        from .plotting import curve_title

        critic = trainer.critic.name if trainer.critic is not None else None  # the layout's registry key
        write_curve(trainer.metrics_history, args.output_dir, curve_title(task.name, kind, critic))
    if trainer.is_world_process_zero():
        print(f"saved the team and its card (README.md) to {args.output_dir}")
    if push:
        _push(trainer, args, task_args.task)
    return args.output_dir


def _push(trainer, args, task_name: str) -> None:
    try:
        trainer.push_to_hub(model_name=os.path.basename(os.path.normpath(args.output_dir)), task=task_name)
    except (OSError, ValueError) as e:  # the Hub's errors (HTTP, offline, token) are OSErrors
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"the team is saved in {args.output_dir}, but pushing it to the Hub failed: {first}") from e


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
    p.add_argument("--task", required=True, help="built-in task name, or your own as MODULE:NAME / FILE.py:NAME")
    p.add_argument("--task_options", default=None, help="JSON dict of task options")
    p.add_argument("--split", default="eval")
    p.add_argument("--dataset_source", default=None, help="the task's dataset source (e.g. building targets 'I,L')")
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
    with user_errors(f"task {task.name!r} could not start an episode to check the team: "):
        observations = env.clone().reset(row)
    if len(observations) != len(team_agents):
        raise UsageError(
            f"task {task.name!r} has {len(observations)} agents but the team in {team_dir} has "
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


def evaluate_team(argv: list[str], play_mode: bool = False):
    prog = f"trl-collm {'play' if play_mode else 'eval'}"
    opts_ns = _eval_parser(prog, play_mode).parse_args(argv)
    task = _get_task(opts_ns.task)
    opts = _options(opts_ns.task_options)
    if not os.path.isfile(os.path.join(opts_ns.team_dir, "team.json")):
        raise UsageError(
            f"--team_dir {opts_ns.team_dir} has no team.json; pass the output_dir of a `trl-collm ppo` / "
            "`mc` run or of save_model()"
        )
    with user_errors():
        from .inference import read_team_file

        desc = read_team_file(opts_ns.team_dir)
    _check_team_folder(opts_ns.team_dir, desc)
    if play_mode and opts_ns.render is not None:
        _check_renderable(task, opts)
    num_turns = _task_turns(task, opts) if opts else (desc.get("num_turns") or task.num_turns)
    with user_errors():
        rows_ds = _call_with_supported(
            task.load_dataset, split=opts_ns.split, limit=opts_ns.limit, source=opts_ns.dataset_source, **opts
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
        backend = make_backend(opts_ns)  # generate() or continuous batching (trl_collm/generation.py)
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
