"""Warm starts: small offline models that already speak a task's language, made with TRL's own `SFTTrainer`.

Random-init tiny models cannot write a valid `/setblock` line, so RL from them never sees a positive reward on the
building game. The paper starts from instruction-tuned models; this module makes the offline stand-in:

1. a noisy expert plays the task's own environment and records every agent's (prompt, completion) per turn. For
   `building-str` the expert is the oracle plan (`oracle_world`) degraded on purpose - it skips cells, picks the
   wrong one of its two colours, adds out-of-bounds and outside-the-target lines - so the warm start is imperfect
   and RL has room to improve;
2. a small random-init model from `trl_collm.testing` (with room for the centralized critic's joint view, which is
   about twice an agent's prompt) is fine-tuned on those transcripts with `trl.SFTTrainer` (completion-only loss);
3. the result is an ordinary `save_pretrained` folder (model + tokenizer), usable as `model=` of every trainer and
   as `model_name_or_path` of the CLI. A fingerprint of every setting is stored beside it: a folder with a
   matching fingerprint is reused, not rebuilt.

    python -m trl_collm.warmstart --task building-str --out outputs/warm-building-str

`evaluate_building(path, rows)` plays the team (one copy of the model per builder) and reports return, IoU, Adj and
the valid-command rate.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = [
    "BuildingNoise",
    "TagNoise",
    "WarmStartConfig",
    "building_transcripts",
    "evaluate_building",
    "evaluate_tags",
    "make_warm_start",
    "replay_building",
    "rollout_team",
    "tag_answer_rates",
    "tag_transcripts",
    "transcripts",
]

WARMSTART_VERSION = 1  # bump when the transcript generator or the recipe changes: it is part of the fingerprint
STAMP_FILE = "warmstart_stamp.json"
SUPPORTED_TASKS = ("building-str", "writing-tags")

# qwen2, 64 wide, 2 layers (~0.16M parameters): learns the command format in a few minutes on one CPU core.
# 4,096 positions: a builder's prompt is up to ~1,150 tokens and CC's joint view holds both builders' prompts.
DEFAULT_DIMS = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=192,
    max_position_embeddings=4096,
)


@dataclass
class BuildingNoise:
    """How the expert of the building transcripts errs. Each turn a builder takes its share of the oracle cells
    still missing (ceil(left / turns left)), in the order the feedback lists missing cells."""

    skip: float = 0.35  # each planned cell is left out with this probability (partial coverage)
    wrong_colour: float = 0.2  # a placed cell gets the builder's other colour (same-colour neighbours)
    out_of_bounds: float = 0.25  # per turn: one extra line outside the world (rejected by the env)
    outside_target: float = 0.2  # per turn: one extra block inside the world but outside the target


@dataclass
class TagNoise:
    """How the expert of the writing-tags transcripts errs: it answers its own tag, the teammate's tag, or a tag
    drawn uniformly from the train split's tags, with these probabilities (normalised).

    Own and teammate's tag equally often, so the warm start learns to copy one of the two tags of its prompt but
    not which one is its own: RL has an input-dependent thing to learn. Little random noise: at 0.3 it taught the
    model tag-like fragments (`legaladv`) instead of the copy rule (docs/warm_start.md)."""

    own: float = 0.45
    other: float = 0.45
    random: float = 0.1


NOISES = {"building-str": BuildingNoise, "writing-tags": TagNoise}
# Per-task recipe defaults (WarmStartConfig.for_task, the command line, benchmarks/research/warm_findings.py).
# writing-tags: 2,000 episodes x 3 epochs, enough for the 64-wide model to learn to copy a tag
# from its prompt (800 x 2 was not).
RECIPES = {"building-str": dict(episodes=160, epochs=2.0), "writing-tags": dict(episodes=2000, epochs=3.0)}


@dataclass
class WarmStartConfig:
    task: str = "building-str"
    episodes: int = 160  # expert episodes; each gives agents x turns (prompt, completion) pairs
    letters: str = "ICML"  # transcript targets: random strings of 1..max_letters of these letters
    max_letters: int = 4
    noise: dict = field(default_factory=dict)  # overrides of the task's noise dataclass (BuildingNoise, TagNoise)
    task_options: dict = field(default_factory=dict)  # make_env options (e.g. max_listed); also for RL/eval
    dims: dict = field(default_factory=lambda: dict(DEFAULT_DIMS))
    epochs: float = 2.0
    batch_size: int = 8
    learning_rate: float = 3e-3
    seed: int = 0

    @classmethod
    def for_task(cls, task: str, **overrides) -> WarmStartConfig:
        """The task's recipe (RECIPES) with `overrides` on top."""
        if task not in RECIPES:
            raise ValueError(f"warm start: task {task!r} has no recipe; choose one of {SUPPORTED_TASKS}")
        return cls(task=task, **dict(RECIPES[task], **overrides))

    def resolved_noise(self):
        if self.task not in NOISES:
            raise ValueError(
                f"warm start: task {self.task!r} has no transcript generator; choose one of {SUPPORTED_TASKS}"
            )
        return NOISES[self.task](**self.noise)

    def fingerprint(self) -> str:
        # the resolved noise, so that {} and the spelled-out defaults are the same warm start
        blob = json.dumps(
            dict(asdict(self), noise=asdict(self.resolved_noise()), version=WARMSTART_VERSION), sort_keys=True
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------- transcripts


def _cell_order(c):
    return (c[0], -c[1], c[2])  # the order of the env's "Missing (...)" feedback list: left to right, top to bottom


def _expert_turn(rng: random.Random, env, agent: str, plan: dict, turns_left: int, noise: BuildingNoise) -> str:
    """One noisy expert completion: `plan` is cell -> block of this agent's share of the oracle build."""
    world, target = env.world, env.target
    palette = env.active_palettes[agent]
    todo = sorted((c for c, b in plan.items() if world.block(c) != b), key=_cell_order)
    take = todo[: math.ceil(len(todo) / max(1, turns_left))]
    lines = []
    for c in take:
        if rng.random() < noise.skip:
            continue
        block = plan[c]
        if rng.random() < noise.wrong_colour:
            block = rng.choice([b for b in palette if b != block] or [block])
        lines.append(f"/setblock {c[0]} {c[1]} {c[2]} {block}")
    w, h, _ = world.size
    if rng.random() < noise.outside_target:
        free = [(x, y, 0) for x in range(w) for y in range(h) if (x, y, 0) not in target.cells]
        if free:
            c = rng.choice(free)
            lines.insert(rng.randrange(len(lines) + 1), f"/setblock {c[0]} {c[1]} {c[2]} {rng.choice(palette)}")
    if rng.random() < noise.out_of_bounds:
        x, y = (
            (w + rng.randrange(4), rng.randrange(h)) if rng.random() < 0.5 else (rng.randrange(w), h + rng.randrange(3))
        )
        lines.insert(rng.randrange(len(lines) + 1), f"/setblock {x} {y} 0 {rng.choice(palette)}")
    budget = env.active_budget
    return "\n".join(lines[:budget] if budget is not None else lines)


def transcripts(cfg: WarmStartConfig) -> list[dict]:
    """(prompt, completion) pairs of a noisy expert team playing `cfg.task`, `cfg.episodes` episodes (seeded)."""
    noise = cfg.resolved_noise()
    return building_transcripts(cfg, noise) if cfg.task == "building-str" else tag_transcripts(cfg, noise)


def tag_transcripts(cfg: WarmStartConfig, noise: TagNoise) -> list[dict]:
    """writing-tags: each agent answers one tag for a post of the train split (own / teammate's / random)."""
    from .tasks import get_task
    from .tasks.tags import AGENT_NAMES, tag_prompt, tags_of

    rows = list(get_task("writing-tags").load_dataset("train"))
    every = sorted({t for r in rows for t in tags_of(r).values()})
    rng = random.Random(cfg.seed)
    weights = [noise.own, noise.other, noise.random]
    pairs = []
    for _ in range(cfg.episodes):
        row = rng.choice(rows)
        tags = tags_of(row)
        for i, agent in enumerate(AGENT_NAMES):
            pick = rng.choices(("own", "other", "random"), weights)[0]
            tag = tags[agent] if pick == "own" else tags[AGENT_NAMES[1 - i]] if pick == "other" else rng.choice(every)
            pairs.append(
                {
                    "prompt": tag_prompt(row, agent),
                    "completion": f" {tag}",
                    "agent": agent,
                    "turn": 0,
                    "target": row["id"],
                }
            )
    return pairs


def building_transcripts(cfg: WarmStartConfig, noise: BuildingNoise | None = None) -> list[dict]:
    """building-str: a noisy expert team plays random strings of `cfg.letters`."""
    from .tasks import get_task
    from .tasks.building.oracle import oracle_world

    noise = noise or cfg.resolved_noise()
    bad = sorted(set(cfg.letters.upper()) - set("ICMLAEHNOTUX"))
    if not cfg.letters or bad:
        raise ValueError(f"warm start: letters={cfg.letters!r} must be letters of the building font (bad: {bad})")
    task = get_task(cfg.task)
    env = task.make_env(**cfg.task_options)
    rng = random.Random(cfg.seed)
    pairs = []
    for _ in range(cfg.episodes):
        text = "".join(rng.choice(cfg.letters.upper()) for _ in range(rng.randint(1, cfg.max_letters)))
        row = {"target": text, "kind": "str"}
        observations = env.reset(row)
        oracle = oracle_world(row, env.active_palettes)
        plans = {a: {c: b for c, (b, owner) in oracle.cells.items() if owner == a} for a in env.agent_names}
        for t in range(env.num_turns):
            texts = [_expert_turn(rng, env, a, plans[a], env.num_turns - t, noise) for a in env.agent_names]
            pairs += [
                {"prompt": o, "completion": c, "agent": a, "turn": t, "target": text}
                for a, o, c in zip(env.agent_names, observations, texts)
            ]
            step = env.step(texts)
            if step.done:
                break
            observations = step.observations
    return pairs


# ---------------------------------------------------------------------------------------------- SFT


def _stamp_matches(folder: Path, stamp: dict) -> bool:
    try:
        with open(folder / STAMP_FILE) as f:
            return json.load(f)["fingerprint"] == stamp["fingerprint"] and (folder / "config.json").is_file()
    except (OSError, ValueError, KeyError):
        return False


def make_warm_start(
    out: str | os.PathLike, cfg: WarmStartConfig | None = None, *, progress: bool = True, force: bool = False
) -> str:
    """Build (or reuse) the warm-start model folder `out`; returns its path.

    Reused untouched when `out` holds a folder whose fingerprint matches `cfg`; otherwise the transcripts are made,
    the model is fine-tuned with `trl.SFTTrainer`, and model + tokenizer are saved with `save_pretrained`.
    """
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from .testing import build_causal_lm, build_tokenizer

    cfg = cfg or WarmStartConfig()
    out = Path(out).expanduser()
    stamp = dict(fingerprint=cfg.fingerprint(), config=asdict(cfg), version=WARMSTART_VERSION)
    if not force and _stamp_matches(out, stamp):
        return str(out)
    pairs = transcripts(cfg)
    tokenizer = build_tokenizer()
    dims = dict(cfg.dims)
    model = build_causal_lm(tokenizer, arch="qwen2", size="tiny", seed=cfg.seed, **dims)
    longest = max(len(tokenizer(p["prompt"] + p["completion"], add_special_tokens=False)["input_ids"]) for p in pairs)
    if longest + 1 > dims["max_position_embeddings"]:
        raise ValueError(
            f"warm start: a transcript has {longest} tokens, more than the model's "
            f"{dims['max_position_embeddings']} positions; raise dims['max_position_embeddings']"
        )
    data = Dataset.from_list([{"prompt": p["prompt"], "completion": p["completion"]} for p in pairs])
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        args = SFTConfig(
            output_dir=str(work / "trainer"),
            max_length=longest + 1,
            completion_only_loss=True,
            per_device_train_batch_size=cfg.batch_size,
            num_train_epochs=cfg.epochs,
            learning_rate=cfg.learning_rate,
            lr_scheduler_type="cosine",
            warmup_steps=10,
            weight_decay=0.0,
            seed=cfg.seed,
            data_seed=cfg.seed,
            use_cpu=True,
            bf16=False,
            report_to=[],
            save_strategy="no",
            logging_steps=10**6,
            disable_tqdm=not progress,
            dataloader_num_workers=0,
        )
        trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
        result = trainer.train()
        model = trainer.model.eval()
        model.generation_config.do_sample = True
        final = work / "model"
        model.save_pretrained(final)
        tokenizer.save_pretrained(final)
        stamp["train_loss"] = float(result.training_loss)
        stamp["pairs"] = len(pairs)
        stamp["torch_threads"] = torch.get_num_threads()
        with open(final / STAMP_FILE, "w") as f:  # written last: its presence certifies a complete folder
            json.dump(stamp, f, indent=2, sort_keys=True)
        if out.exists():
            shutil.rmtree(out)
        os.replace(final, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return str(out)


# ---------------------------------------------------------------------------------------------- evaluation


def rollout_team(
    model_paths: dict | str,
    rows: list[dict],
    *,
    task: str = "building-str",
    task_options=None,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    seed: int = 0,
    team=None,
):
    """Play `rows` once each, decentralized (one model per agent); returns (the env, the Rollout).

    `model_paths`: one folder for every agent, or agent -> folder; or pass a ready `team` (an AgentTeam)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .generation.backends import make_backend
    from .generation.sampler import Sampler, SamplingSettings
    from .rollout import run_episodes
    from .tasks import get_task
    from .team.agents import AgentTeam

    if task == "writing-tags":
        from .tasks import tags  # noqa: F401  (registers the task)
    spec = get_task(task)
    env = spec.make_env(**(task_options or {}))
    if team is None:
        paths = model_paths if isinstance(model_paths, dict) else {a: model_paths for a in spec.agent_names}
        policies = {a: AutoModelForCausalLM.from_pretrained(paths[a]).eval() for a in spec.agent_names}
        tokenizers = {a: AutoTokenizer.from_pretrained(paths[a]) for a in spec.agent_names}
        team = AgentTeam(spec.agent_names, tokenizers, policies=policies)
    # temperature 0: greedy decoding; otherwise pure sampling at that temperature (no top-k / top-p filter)
    settings = SamplingSettings(max_new_tokens, temperature=temperature or 1.0, greedy=temperature <= 0)
    sampler = Sampler(team, make_backend(), settings, next(team.parameters()).device)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        roll = run_episodes(sampler, env, list(rows), spec.num_turns)
    return env, roll


def replay_building(rows: list[dict], roll, *, task: str = "building-str", task_options=None) -> list:
    """Fresh envs that replay each episode's completions (the env is deterministic): the final state per row, for
    pictures and component scores."""
    from .tasks import get_task

    spec = get_task(task)
    envs = []
    for e, row in enumerate(rows):
        env = spec.make_env(**(task_options or {}))
        env.reset(row)
        for turn in roll.turns:
            ids = turn[roll.agent_names[0]].episode_ids.tolist()
            if e not in ids:
                break
            k = ids.index(e)
            env.step([turn[a].gen.texts[k] for a in roll.agent_names])
        envs.append(env)
    return envs


def evaluate_building(model_paths: dict | str, rows: list[dict], *, repeats: int = 1, **kwargs) -> dict:
    """Mean return, final IoU % and Adj %, and command statistics of the team over `rows` x `repeats` episodes."""
    rows = [dict(r) for r in rows for _ in range(repeats)]
    _, roll = rollout_team(model_paths, rows, **kwargs)
    returns = roll.rewards.sum(1).mean(-1)  # joint reward: every agent holds the same value
    last = [None] * len(rows)
    applied = rejected = turns = 0
    for turn_infos, turn in zip(roll.infos, roll.turns):
        ids = turn[roll.agent_names[0]].episode_ids.tolist()
        for e, info in zip(ids, turn_infos):
            last[e] = info
            applied += sum(info["applied"].values())
            rejected += sum(info["rejected"].values())
            turns += len(info["applied"])
    n = len(rows)
    return dict(
        episodes=n,
        return_mean=float(returns.mean()),
        iou_pct=sum(i["iou_pct"] for i in last) / n,
        adj_pct=sum(i["adj_pct"] for i in last) / n,
        coverage=sum(i["coverage"] for i in last) / n,
        applied_per_agent_turn=applied / max(1, turns),
        valid_rate=applied / max(1, applied + rejected),
        per_target={
            t: float(returns[[k for k, r in enumerate(rows) if r["target"] == t]].mean())
            for t in dict.fromkeys(r["target"] for r in rows)
        },
    )


def tag_answer_rates(rows: list[dict], texts: list[tuple[str, ...]]) -> dict:
    """writing-tags: per tagger, the share of its answers that hold its own tag and its teammate's (an answer may
    hold both). `texts[k][i]` is tagger AGENT_NAMES[i]'s answer to rows[k]."""
    from .tasks.tags import AGENT_NAMES, tags_of, word_set

    def rate(i, whose):
        return sum(tags_of(r)[AGENT_NAMES[whose]] in word_set(t[i]) for r, t in zip(rows, texts)) / len(rows)

    return dict(
        own_tag_rate={a: rate(i, i) for i, a in enumerate(AGENT_NAMES)},
        teammate_tag_rate={a: rate(i, 1 - i) for i, a in enumerate(AGENT_NAMES)},
    )


def evaluate_tags(model_paths: dict | str, rows: list[dict], *, repeats: int = 1, **kwargs) -> dict:
    """writing-tags: mean return, how often each tagger wrote its own tag and its teammate's, both right."""
    rows = [dict(r) for r in rows for _ in range(repeats)]
    kwargs.setdefault("task", "writing-tags")
    kwargs.setdefault("max_new_tokens", 16)  # the longest tags (careerguidance, legaladvice, ...) are 11 tokens
    _, roll = rollout_team(model_paths, rows, **kwargs)
    texts = list(zip(*(roll.turns[0][a].gen.texts for a in roll.agent_names)))  # texts[k][i]: agent i, episode k
    return dict(
        episodes=len(rows),
        return_mean=float(roll.rewards.sum(1).mean()),
        **tag_answer_rates(rows, texts),
        perfect_rate=float((roll.rewards.sum(1)[:, 0] >= 2.0 - 1e-9).float().mean()),
    )


# ---------------------------------------------------------------------------------------------- command line


def main(argv=None):
    p = argparse.ArgumentParser(description="Make a warm-start model folder for a task with trl.SFTTrainer.")
    p.add_argument("--task", default="building-str", choices=SUPPORTED_TASKS)
    p.add_argument("--out", required=True, help="the model folder to write (reused when its fingerprint matches)")
    p.add_argument("--episodes", type=int, default=None, help="noisy-expert episodes (default: the task's RECIPES)")
    p.add_argument("--epochs", type=float, default=None, help="SFT epochs (default: the task's RECIPES)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="rebuild even when the fingerprint matches")
    p.add_argument("--no-eval", action="store_true", help="skip the starting-score report")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch's intra-op threads (default on CPU: OMP_NUM_THREADS when set, else 1; as `trl-collm ppo`)",
    )
    a = p.parse_args(argv)
    import torch

    from .cli import UsageError, set_cpu_threads

    try:
        set_cpu_threads(a.threads, on_cpu=True)  # the warm start trains on CPU (use_cpu=True in its SFTConfig)
    except UsageError as e:
        p.error(str(e))
    torch.manual_seed(a.seed)
    given = {k: v for k, v in dict(episodes=a.episodes, epochs=a.epochs).items() if v is not None}
    cfg = WarmStartConfig.for_task(a.task, seed=a.seed, **given)
    path = make_warm_start(a.out, cfg, force=a.force)
    print(f"warm start: {path} (fingerprint {cfg.fingerprint()})")
    if not a.no_eval:
        from .tasks import get_task

        if a.task == "writing-tags":
            from .tasks import tags  # noqa: F401  (registers the task)
        rows = list(get_task(a.task).load_dataset("eval"))
        evaluate = evaluate_building if a.task == "building-str" else evaluate_tags
        print(json.dumps(evaluate(path, rows, repeats=2, seed=a.seed, task=a.task), indent=2))


if __name__ == "__main__":
    main()
