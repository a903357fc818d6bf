"""The team model card: what a Hub visitor needs to know about a trained team and how to run it."""

from __future__ import annotations


def _short(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def team_card_section(desc: dict, metrics: dict | None = None) -> str:
    """Markdown appended to TRL's model card. `desc` is the trainer's team description (team.json + task facts)."""
    lines = ["", "## The team", ""]
    lines.append(
        f"Trained with [trl-collm](https://pypi.org/project/trl-collm/)'s `{desc['trainer']}`: {len(desc['agents'])} agents "
        f"({desc['layout'].replace('_', ' ')} layout), {desc['num_turns']} turn(s) per episode, preset `{desc['preset']}`."
    )
    algo = desc.get("algorithm", {})
    if algo:
        lines.append("Update rule: " + ", ".join(f"{k}={v}" for k, v in algo.items()) + ".")
    task = desc.get("task", {})
    if task:
        lines += ["", f"Task: environment `{task.get('env')}`" + (f", rewards {', '.join(f'`{r}`' for r in task['rewards'])}" if task.get("rewards") else "") + "."]
    lines += ["", "| agent | folder | example prompt |", "|---|---|---|"]
    prompts = task.get("example_prompts", {}) if task else {}
    for a, folder in desc["agent_folders"].items():
        lines.append(f"| {a} | `{folder}` | {_short(prompts.get(a, ''), 160).replace('|', '/')} |")
    if "critic" in desc:
        c = desc["critic"]
        where = ", ".join(sorted({u["placement"] for u in c["units"].values()}))
        lines += ["", f"Critic (training only, not needed to run the team): {c['type']}, value mode `{c['value_mode']}`, "
                  f"placement `{where}`, saved under `critic/`."]
    if metrics:
        keys = [k for k in metrics if k.endswith("objective/scores") or k.startswith("eval_")]
        if keys:
            lines += ["", "Last logged metrics:", "", "| metric | value |", "|---|---|"]
            lines += [f"| {k} | {metrics[k]:.4g} |" for k in sorted(keys) if isinstance(metrics[k], (int, float))]
    lines += [
        "",
        "Run the team decentralized (each agent sees only its own prompt; no critic):",
        "",
        "```python",
        "from huggingface_hub import snapshot_download",
        "from trl_collm.inference import load_team, play",
        "",
        "team = load_team(snapshot_download(\"<this repo>\"))  # or a local folder",
        "transcripts = play(team, env, rows, num_turns=" + str(desc["num_turns"]) + ")",
        "```",
        "",
        "Each agent folder also loads on its own with `AutoModelForCausalLM` (full models) or `PeftModel` (adapters); "
        "`team.json` describes the whole team.",
    ]
    return "\n".join(lines) + "\n"
