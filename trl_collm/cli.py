"""`trl-collm` command line: train (ppo / mc), score (eval) and run (play) teams on the built-in tasks.

    trl-collm ppo  --config examples/configs/coord-penalty/cc-cpu.yaml [--learning_rate 1e-2 ...]
    trl-collm mc   --config examples/configs/coord-penalty/mc-cpu.yaml
    trl-collm eval --team_dir outputs/coord-penalty-cc --task coord-penalty [--limit 32]
    trl-collm play --team_dir outputs/coord-penalty-cc --task coord-penalty [--limit 3]
    trl-collm tasks

Training configs follow TRL's convention (TrlParser): a YAML file whose keys are the fields of `TaskArguments`,
the trainer config and TRL's `ModelConfig`; command-line flags override the file. `model_name_or_path: tiny` uses
the offline tiny-model factory (no download).
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from dataclasses import dataclass, field

TINY = "tiny"


@dataclass
class TaskArguments:
    task: str = field(default="coord-penalty", metadata={"help": "Built-in task name (`trl-collm tasks` lists them)."})
    task_options: str | None = field(default=None, metadata={"help": "JSON dict of task options, e.g. '{\"turns\": 4}'."})
    agent_models: list[str] | None = field(
        default=None, metadata={"help": "One model path per agent (a heterogeneous team); default: model_name_or_path for every agent."}
    )
    dataset_source: str | None = field(default=None, metadata={"help": "Hub dataset for tasks that take one (online only)."})
    train_limit: int | None = field(default=None, metadata={"help": "Use at most this many training rows."})
    eval_limit: int | None = field(default=None, metadata={"help": "Use at most this many evaluation rows."})
    plot: bool = field(default=True, metadata={"help": "Write learning_curve.png / .json into output_dir after training."})


def _options(task_args) -> dict:
    if not task_args.task_options:
        return {}
    opts = json.loads(task_args.task_options) if isinstance(task_args.task_options, str) else dict(task_args.task_options)
    if not isinstance(opts, dict):
        raise ValueError("`task_options` must be a JSON object, e.g. '{\"turns\": 4}'.")
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
    return path


def train(kind: str, argv: list[str]) -> str:
    from trl import ModelConfig, TrlParser, get_peft_config

    from .configs import MultiAgentMCConfig, MultiAgentPPOConfig
    from .tasks import get_task
    from .trainers import MultiAgentMCTrainer, MultiAgentPPOTrainer

    config_cls, trainer_cls = (MultiAgentPPOConfig, MultiAgentPPOTrainer) if kind == "ppo" else (MultiAgentMCConfig, MultiAgentMCTrainer)
    parser = TrlParser((TaskArguments, config_cls, ModelConfig), prog=f"trl-collm {kind}")
    task_args, args, model_args = parser.parse_args_and_config(argv)
    task = get_task(task_args.task)
    opts = _options(task_args)
    num_agents = opts.get("num_agents", len(task.agent_names))
    if args.agent_names is None:
        args.agent_names = list(task.agent_names) if num_agents == len(task.agent_names) else [f"agent_{i + 1}" for i in range(num_agents)]
    # The episode length is the task's (or its `turns` / `num_turns` option); num_turns=1, the default, means "the task's".
    task_turns = _task_turns(task, opts)
    if args.num_turns == 1:
        args.num_turns = task_turns
    elif args.num_turns != task_turns:
        raise ValueError(f"`num_turns`={args.num_turns} but task {task.name!r} runs {task_turns} turn(s); set its length with "
                         "--task_options (e.g. '{\"num_turns\": 2}') instead.")
    init_kwargs = {k: v for k, v in (("dtype", model_args.dtype), ("attn_implementation", model_args.attn_implementation),
                                     ("revision", model_args.model_revision)) if v not in (None, "main")}
    if init_kwargs:
        args.model_init_kwargs = {**init_kwargs, **(args.model_init_kwargs or {})}
    data_kwargs = dict(source=task_args.dataset_source, **opts)
    train_ds = _call_with_supported(task.load_dataset, split="train", limit=task_args.train_limit, **data_kwargs)
    eval_ds = _call_with_supported(task.load_dataset, split="eval", limit=task_args.eval_limit, **data_kwargs)
    env = _call_with_supported(task.make_env, **opts)
    model = [_resolve_model(p) for p in task_args.agent_models] if task_args.agent_models else _resolve_model(model_args.model_name_or_path)
    peft_config = get_peft_config(model_args)
    trainer = trainer_cls(args=args, model=model, train_dataset=train_ds, eval_dataset=eval_ds, env=env, peft_config=peft_config)
    trainer.train()
    trainer.save_model(args.output_dir)
    if task_args.plot and trainer.is_world_process_zero():
        write_curve(trainer._metrics_history, args.output_dir, f"{task.name} ({kind})")
    print(f"saved the team to {args.output_dir}")
    return args.output_dir


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

    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--team_dir", required=True, help="output_dir of a saved team")
    p.add_argument("--task", required=True, help="built-in task name")
    p.add_argument("--task_options", default=None, help="JSON dict of task options")
    p.add_argument("--split", default="eval")
    p.add_argument("--limit", type=int, default=None if not play else 3, help="rows to use")
    p.add_argument("--max_new_tokens", type=int, default=64)
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--base_model", default=None, help="base model of a LoRA team (overrides team.json)")
    p.add_argument("--device", default=None)
    p.add_argument("--use_transformers_continuous_batching", action="store_true", help="generate with transformers' generate_batch")
    p.add_argument("--transformers_continuous_batching_config", default=None, help="JSON dict for ContinuousBatchingConfig")
    return p


def evaluate_team(argv: list[str], play_mode: bool = False):
    from .generation import make_backend
    from .inference import load_team, play, read_team_file
    from .tasks import get_task

    opts_ns = _eval_parser(f"trl-collm {'play' if play_mode else 'eval'}", play_mode).parse_args(argv)
    task = get_task(opts_ns.task)
    opts = json.loads(opts_ns.task_options) if opts_ns.task_options else {}
    desc = read_team_file(opts_ns.team_dir)
    num_turns = _task_turns(task, opts) if opts else (desc.get("num_turns") or task.num_turns)
    rows_ds = _call_with_supported(task.load_dataset, split=opts_ns.split, limit=opts_ns.limit, **opts)
    rows = [rows_ds[i] for i in range(len(rows_ds))]
    team = load_team(opts_ns.team_dir, base_model=opts_ns.base_model, device=opts_ns.device)
    team.generation_backend = make_backend(opts_ns)  # generate() or continuous batching (trl_collm/generation.py)
    env = _call_with_supported(task.make_env, **opts)
    transcripts = play(team, env, rows, num_turns=num_turns, max_new_tokens=opts_ns.max_new_tokens, greedy=not opts_ns.sample)
    returns = [sum(t["return"]) / len(t["return"]) for t in transcripts]
    mean = sum(returns) / len(returns)
    if play_mode:
        for tr in transcripts:
            print(f"=== episode {tr['episode']}  return per agent {tr['return']}")
            for turn in tr["turns"]:
                for a, io in turn["agents"].items():
                    print(f"--- turn {turn['turn'] + 1} [{a}] prompt:\n{io['prompt']}\n--- [{a}] answer:\n{io['completion']}")
                print(f"--- turn {turn['turn'] + 1} reward {turn['reward']}")
    summary = {"task": task.name, "episodes": len(rows), "mean_return": mean}
    if task.max_reward:
        summary["percent_of_max"] = 100.0 * mean / task.max_reward
    print(json.dumps(summary))
    return summary, transcripts


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    usage = "usage: trl-collm {ppo,mc,eval,play,tasks} ... (trl-collm <command> --help for its options)"
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\n" + usage)
        return 0
    command, rest = argv[0], argv[1:]
    if command in ("ppo", "mc"):
        train(command, rest)
    elif command == "eval":
        evaluate_team(rest)
    elif command == "play":
        evaluate_team(rest, play_mode=True)
    elif command == "tasks":
        from .tasks import get_task, list_tasks

        for name in list_tasks():
            spec = get_task(name)
            print(f"{name:18s} {len(spec.agent_names)} agents, {spec.num_turns} turn(s)  {spec.description}")
    else:
        print(f"unknown command {command!r}\n{usage}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
