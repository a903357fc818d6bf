"""The team model card (README.md in the output folder): what a Hub visitor needs to know about a trained team and
how to run it. Replaces TRL's single-model card, whose quick start (`pipeline(model=...)`) cannot load a team."""

from __future__ import annotations

import os
import re

from ..chat import agent_prompt
from .modeling import base_model_of

PAPER = "Liu, Chen, Amiri, Amato: CoLLM, multi-agent actor-critic for decentralized LLM collaboration (ICML 2026)"
PAPER_URL = "https://arxiv.org/abs/2601.21972"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
_CRITIC_FREE = "Monte-Carlo, critic-free (MAGRPO-style): group-mean baselines over sampled answers"


def _short(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_hub_id(name: str | None) -> bool:
    """'org/model' that is not a local folder: something huggingface.co can link to."""
    return bool(name) and not os.path.exists(name) and bool(_HUB_ID.match(name))


def portable_name(name: str | None) -> str | None:
    """A model or task reference as a reader on another machine can use it: a Hub id as is, a local folder or file
    by its last component (an absolute path names only the trainer's disk). `file.py:NAME` keeps its NAME."""
    if not name or is_hub_id(name):
        return name
    path, colon, attr = name.rpartition(":") if ".py:" in name else (name, "", "")
    if "/" in path or os.sep in path or os.path.exists(path):
        path = os.path.basename(os.path.normpath(path))
    return f"{path}{colon}{attr}"


def _model_link(name: str | None) -> str:
    if not name:
        return "(unknown)"
    return f"[{name}](https://huggingface.co/{name})" if is_hub_id(name) else f"`{portable_name(name)}` (local)"


def base_models(trainer) -> dict[str, str | None]:
    """Each agent's base model, as it was loaded (`config._name_or_path`: a Hub id or a local path)."""
    team = trainer.team
    out = {}
    for a in team.names:
        model = team.shared_base if team.layout == "shared_base" else team.model_of(a)
        out[a] = getattr(getattr(base_model_of(model), "config", None), "_name_or_path", None) or None
    return out


def task_facts(trainer) -> dict:
    """The card's task section: the env, its reward functions and an episode's first prompts."""
    facts = {"env": type(trainer.env).__name__, "rewards": list(getattr(trainer.env, "reward_func_names", []) or [])}
    try:  # the prompts an episode starts with, from the first training row, on a copy of the env
        observations = trainer.env.clone().reset(trainer.train_dataset[0])
        team = trainer.team
        facts["example_prompts"] = {
            a: team.decode_observation(a, agent_prompt(team.tokenizers[a], o)) for a, o in zip(team.names, observations)
        }
    except Exception:  # noqa: BLE001 - a card must not fail on an env that cannot reset outside a batch
        pass
    return facts


# The config fields the card lists (those the trainer's config has).
CARD_FIELDS = (
    "advantage_level",
    "policy_loss_type",
    "num_ppo_epochs",
    "kl_coef",
    "num_generations",
    "joint_mode",
    "expansion",
    "baseline",
    "loss_type",
    "gamma",
    "learning_rate",
)


def algorithm_facts(trainer) -> dict:
    """The card's algorithm section: the critic layout first (when there is one), then the `CARD_FIELDS`."""
    facts = {}
    if trainer.critic is not None:
        facts.update(trainer.critic.card_facts())
    facts.update({k: getattr(trainer.args, k) for k in CARD_FIELDS if hasattr(trainer.args, k)})
    return facts


def card_facts(
    trainer, model_name: str | None = None, dataset_name: str | None = None, tags=None, task: str | None = None
) -> dict:
    """Everything the card says, gathered from a trainer (also what tests check)."""
    args = trainer.args
    desc = trainer.team_description()
    name = (
        model_name
        or (args.hub_model_id or "").rstrip("/").split("/")[-1]
        or os.path.basename(os.path.normpath(args.output_dir))
    )
    tags = [tags] if isinstance(tags, str) else list(tags or [])
    # The critic layout describes itself (a user-registered critic type too); a team without one is the MC baseline.
    critic = getattr(trainer, "critic", None)
    summary = critic.describe_layout()[1] if critic is not None else _CRITIC_FREE
    return dict(
        desc,
        model_name=name,
        repo=getattr(trainer, "hub_model_id", None),  # None: the snippet loads the card's own folder
        dataset_name=dataset_name,
        tags=list(dict.fromkeys(["trl", "trl-collm", "multi-agent", *tags])),
        task_name=portable_name(task),
        task_options=(getattr(trainer, "task_record", None) or {}).get("options") or {},
        task=task_facts(trainer),
        algorithm=algorithm_facts(trainer),
        algorithm_summary=summary,
        base_models=base_models(trainer),
        metrics=trainer.metrics_history[-1] if trainer.metrics_history else {},
        last_step=trainer.state.global_step,
        **_evaluation(trainer),
    )


def _evaluation(trainer) -> dict:
    """The evaluation the card reports, and the step the saved weights come from: with load_best_model_at_end the
    best checkpoint's step (weights and evaluation from there), else the last step and the last evaluation."""
    state = trainer.state
    best = bool(trainer.args.load_best_model_at_end and state.best_model_checkpoint and state.best_global_step)
    weights_step = state.best_global_step if best else state.global_step
    evals = [h for h in state.log_history if any(str(k).startswith("eval_") for k in h)]
    at_weights = [h for h in evals if h.get("step") == weights_step]
    chosen = at_weights[-1] if at_weights else (evals[-1] if evals else None)
    out = {"weights_step": weights_step, "weights_from_best": best}
    if chosen is not None:
        out["evaluation"] = {k: v for k, v in chosen.items() if str(k).startswith("eval_")}
        out["evaluation_step"] = chosen.get("step")
    return out


def _front_matter(facts: dict) -> str:
    import yaml

    hub_bases = sorted({b for b in facts["base_models"].values() if is_hub_id(b)})
    meta = {"library_name": "transformers", "tags": facts["tags"]}
    if hub_bases:
        meta["base_model"] = hub_bases if len(hub_bases) > 1 else hub_bases[0]
    if facts.get("dataset_name"):
        meta["datasets"] = [facts["dataset_name"]]
    meta["model_name"] = facts["model_name"]
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


def _metric_rows(metrics: dict) -> list[str]:
    keys = [k for k in metrics if k == "episode" or k.endswith("objective/scores") or k.startswith("eval_")]
    rows = []
    for k in sorted(keys):
        v = metrics[k]
        if isinstance(v, (int, float)):
            rows.append(f"| `{k}` | {v:.4g} |")
    return rows


def _options_line(options: dict | None) -> list[str]:
    return [f"options = {options!r}  # the task options the team was trained with (team.json)"] if options else []


_LOAD_COMMENT = "this card's folder (run from inside it), or its path or Hub repo id"


def _results(facts: dict) -> list[str]:
    """The evaluation the run measured (at the step of the saved weights when it has one) and the last training
    iteration, each with its step."""
    lines = []
    evaluation = facts.get("evaluation")
    if evaluation:
        if facts.get("weights_from_best"):
            where = (
                f"at step {facts['evaluation_step']}, the best checkpoint's, whose weights load_best_model_at_end "
                "saved here"
            )
        elif facts.get("evaluation_step") == facts.get("weights_step"):
            where = f"at step {facts['evaluation_step']}, the step of the saved weights"
        else:
            where = f"at step {facts['evaluation_step']} (the saved weights are from step {facts['weights_step']})"
        rows = _metric_rows(evaluation)
        lines += ["", "## Results", "", f"Evaluation on the task's eval split {where}:", "", "| metric | value |"]
        lines += ["|---|---|", *rows]
    rows = _metric_rows({k: v for k, v in (facts.get("metrics") or {}).items() if not k.startswith("eval_")})
    if rows:
        if not evaluation:
            lines += ["", "## Results"]
        step = facts.get("last_step")
        lines += ["", f"Last logged training iteration (step {step}):", "", "| metric | value |", "|---|---|", *rows]
    return lines


def team_card(facts: dict) -> str:
    """The card's markdown from `card_facts`."""
    n = len(facts["agents"])
    task_name, task = facts.get("task_name"), facts.get("task", {})
    what = f"the task `{task_name}`" if task_name else f"the environment `{task.get('env')}`"
    lines = [
        _front_matter(facts),
        f"# {facts['model_name']}",
        "",
        (
            f"A team of {n} language models trained together on {what} with "
            f"[trl-collm](https://pypi.org/project/trl-collm/)'s `{facts['trainer']}`: {facts['algorithm_summary']}. "
            "The agents act decentralized: each reads only its own prompt and writes its own answer; the critic is "
            "needed for training only."
        ),
        "",
        "## Agents",
        "",
        "| agent | base model | folder | example prompt |",
        "|---|---|---|---|",
    ]
    prompts = task.get("example_prompts", {})
    for a in facts["agents"]:
        lines.append(
            f"| {a} | {_model_link(facts['base_models'].get(a))} | `{facts['agent_folders'][a]}` | "
            f"{_short(prompts.get(a, ''), 160).replace('|', '/')} |"
        )
    layout = (
        "LoRA adapters on one shared base model (load each with `PeftModel`)"
        if facts["layout"] == "shared_base"
        else "separate full models (each loads with `AutoModelForCausalLM`)"
    )
    lines += ["", f"Layout: {layout}.", "", "## Training", "", "| | |", "|---|---|"]
    task_row = f"`{task_name}`, " if task_name else ""
    task_row += f"environment `{task.get('env')}`"
    if task.get("rewards"):
        task_row += ", rewards " + ", ".join(f"`{r}`" for r in task["rewards"])
    lines.append(f"| task | {task_row} |")
    preset = f"preset `{facts['preset']}`" if facts.get("preset") else "no preset (every field as configured)"
    lines.append(f"| algorithm | `{facts['trainer']}`, {preset} |")
    if "critic" in facts:
        c = facts["critic"]
        where = ", ".join(sorted({u["placement"] for u in c["units"].values()}))
        lines.append(
            f"| critic | {c['type']}, value mode `{c['value_mode']}`, placement `{where}`, saved under "
            "`critic/` (not needed to run the team) |"
        )
    else:
        lines.append("| critic | none (Monte-Carlo baselines) |")
    lines.append(f"| turns per episode | {facts['num_turns']} |")
    algo = {k: v for k, v in facts.get("algorithm", {}).items() if v is not None}
    if algo:
        lines.append("| update rule | " + ", ".join(f"{k}={v}" for k, v in algo.items()) + " |")
    gen = facts.get("generation", {})
    shown = {k: v for k, v in gen.items() if v is not None and k != "max_prompt_length"}
    if shown:
        lines.append(
            "| generation | "
            + ", ".join(f"{k}={v}" for k, v in shown.items())
            + " (recorded in `team.json`; `trl-collm eval` / `play` use them by default) |"
        )
    lines += _results(facts)
    repo = facts["repo"] or "."
    lines += ["", "## Run the team", "", "```python", "from trl_collm.inference import load_team, play, saved_settings"]
    if task_name:
        opts = ", **options" if facts.get("task_options") else ""
        lines += [
            "from trl_collm.tasks import get_task",
            "",
            f"team = load_team({repo!r})  # {_LOAD_COMMENT}",
            f"settings = saved_settings({repo!r})  # as trained, decoding greedily (greedy=False samples)",
            f"task = get_task({task_name!r})",
            *_options_line(facts.get("task_options")),
            f'rows = list(task.dataset("eval", limit=4{opts}))',
            (
                f"transcripts = play(team, task.env({opts.lstrip(', ')}), rows, num_turns={facts['num_turns']}, "
                "settings=settings)"
            ),
            "```",
            "",
            "or from the command line: `trl-collm eval --team_dir <this folder>` (team.json names the task and "
            "its options).",
        ]
    else:
        lines += [
            "",
            f"team = load_team({repo!r})  # {_LOAD_COMMENT}",
            f"settings = saved_settings({repo!r})  # as trained, decoding greedily (greedy=False samples)",
            "# env: the trl_collm.MultiAgentEnv the team was trained with; rows: its dataset rows",
            f"transcripts = play(team, env, rows, num_turns={facts['num_turns']}, settings=settings)",
            "```",
        ]
    lines += ["", "`team.json` describes the whole team (agents, folders, layout, critic, generation settings)."]
    lines += [
        "",
        "## Framework versions",
        "",
        *_versions(),
        "",
        "## Citation",
        "",
        f"The method: {PAPER}, [arXiv 2601.21972]({PAPER_URL}).",
    ]
    return "\n".join(lines) + "\n"


def _versions() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for pkg in ("trl-collm", "trl", "transformers", "peft", "torch", "datasets"):
        try:
            out.append(f"- {pkg}: {version(pkg)}")
        except PackageNotFoundError:
            continue
    return out


def write_team_card(
    trainer,
    model_name: str | None = None,
    dataset_name: str | None = None,
    tags=None,
    task: str | None = None,
    output_dir: str | None = None,
) -> str:
    """Write README.md (the team card) into `output_dir` (default: the trainer's); returns its path."""
    output_dir = output_dir or trainer.args.output_dir
    path = os.path.join(output_dir, "README.md")
    os.makedirs(output_dir, exist_ok=True)
    with open(path, "w") as f:
        f.write(team_card(card_facts(trainer, model_name, dataset_name, tags, task)))
    return path
