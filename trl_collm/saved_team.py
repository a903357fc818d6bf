"""The saved-team format, written and read in one place.

A saved team is a folder holding `team.json` (this format's description: agents, layout, folders, critic), one
folder per agent (a full model or a LoRA adapter, loadable with `from_pretrained`; the folder itself for a single
agent, like TRL's PPO) and, when the trainer has one, the critic under `critic/`.

    from trl_collm.saved_team import load_team
    team = load_team("outputs/quickstart")   # the agents, for decentralized inference (see inference.py)
"""

from __future__ import annotations

import json
import os

import torch

from .team import AgentTeam

TEAM_FILE = "team.json"
FORMAT = "trl-collm-team/1"


def agent_folder(name: str, num_agents: int) -> str:
    """An agent's folder relative to the team folder ("." for a single agent, as TRL's PPO saves its policy)."""
    return "." if num_agents == 1 else name


def describe_team(
    team: AgentTeam, trainer: str, num_turns: int, preset: str | None, critic=None, generation: dict | None = None
) -> dict:
    """The contents of team.json (`generation`: the sampling settings the team was trained with)."""
    desc = {
        "format": FORMAT,
        "agents": team.names,
        "layout": team.layout,
        "trainer": trainer,
        "num_turns": num_turns,
        "preset": preset,
        "agent_folders": {a: agent_folder(a, len(team.names)) for a in team.names},
    }
    if generation is not None:
        desc["generation"] = generation
    if team.layout == "shared_base":
        desc["base_model"] = getattr(team.shared_base.get_base_model().config, "_name_or_path", None)
    if critic is not None:
        desc["critic"] = critic.describe()
    return desc


def write_team(output_dir: str, team: AgentTeam, critic, description: dict, full_state: dict | None) -> None:
    """Every agent's folder, the critic's folders and team.json. `full_state`: the gathered state dict of the
    TeamModel when parameters are partitioned (ZeRO-3), else None (the live modules are saved)."""
    from .trainers import distributed

    def part(prefix):
        return distributed.sub_state_dict(full_state, prefix)  # None: use the live modules

    os.makedirs(output_dir, exist_ok=True)
    for a in team.names:
        folder = os.path.normpath(os.path.join(output_dir, agent_folder(a, len(team.names))))
        if full_state is not None and team.layout == "shared_base":
            distributed.save_shared_adapter(team.shared_base, a, folder, part("team.shared_base."))
            team.tokenizers[a].save_pretrained(folder)
        else:
            team.save_agent(a, folder, state_dict=part(f"team.policies.{a}."))
    if critic is not None:
        critic.save(output_dir, part)
    with open(os.path.join(output_dir, TEAM_FILE), "w") as f:
        json.dump(description, f, indent=2)


def read_team_file(folder: str) -> dict:
    path = os.path.join(folder, TEAM_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{folder!r} has no {TEAM_FILE}; pass the output_dir of a trl-collm save_model() / train run."
        )
    try:
        with open(path) as f:
            desc = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(
            f"{path!r} is not valid JSON ({e}); re-save the team with save_model() or restore the file."
        ) from None
    _check_description(desc, path)
    return desc


def _check_description(desc, path: str) -> None:
    """The keys every reader relies on, each with a message naming the file and the key."""
    fix = "re-save the team with save_model() or restore the file"
    if not isinstance(desc, dict):
        raise ValueError(f"{path!r} holds {type(desc).__name__}, not a team description (a JSON object); {fix}.")
    for key in ("agents", "layout", "agent_folders"):
        if key not in desc:
            raise ValueError(f"{path!r} lacks the key {key!r}; {fix}.")
    names = desc["agents"]
    if not isinstance(names, list) or not names or not all(isinstance(a, str) and a for a in names):
        raise ValueError(f"{path!r}: 'agents' must be a non-empty list of agent names, got {names!r}; {fix}.")
    if desc["layout"] not in ("separate", "shared_base"):
        raise ValueError(f"{path!r}: 'layout' must be 'separate' or 'shared_base', got {desc['layout']!r}; {fix}.")
    folders = desc["agent_folders"]
    missing = [a for a in names if not isinstance(folders, dict) or not isinstance(folders.get(a), str)]
    if missing:
        raise ValueError(f"{path!r}: 'agent_folders' has no folder for agents {missing}; {fix}.")


def load_team(
    folder: str, base_model: str | None = None, device: str | torch.device | None = None, dtype=None
) -> AgentTeam:
    """Rebuild the agents of a saved team (a local folder or a Hub repo id; full models or LoRA adapters on their
    base) for decentralized inference.

    `base_model` overrides the base recorded in team.json for LoRA teams (e.g. a local copy of the base).
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not os.path.isdir(folder):  # a Hub repo id: fetch the whole team once (fails clearly when offline)
        from .cards import is_hub_id

        if not is_hub_id(folder):  # a local path, not a malformed repo id
            raise FileNotFoundError(
                f"{folder!r}: no such folder; pass the output_dir of save_model() or a Hub repo id (org/name)"
            )
        from huggingface_hub import snapshot_download

        folder = snapshot_download(folder)
    desc = read_team_file(folder)
    names = desc["agents"]
    folders = {a: os.path.normpath(os.path.join(folder, desc["agent_folders"][a])) for a in names}
    for a, path in folders.items():
        if not os.path.isdir(path) or not os.listdir(path):
            raise ValueError(
                f"agent {a!r}'s folder {path!r} (listed in {os.path.join(folder, TEAM_FILE)!r}) is missing or empty; "
                "copy the whole team folder written by save_model()."
            )
    tokenizers = {a: AutoTokenizer.from_pretrained(folders[a]) for a in names}
    if desc["layout"] == "shared_base":
        base_path = base_model or desc.get("base_model")
        if not base_path:
            raise ValueError(
                "team.json records no base model; pass `base_model` (the path or Hub id the adapters were trained on)."
            )
        base = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype)
        model = PeftModel.from_pretrained(base, folders[names[0]], adapter_name=names[0])
        for a in names[1:]:
            model.load_adapter(folders[a], adapter_name=a)
        team = AgentTeam(names, tokenizers, shared_base=model)
    else:
        policies = {a: AutoModelForCausalLM.from_pretrained(folders[a], dtype=dtype) for a in names}
        team = AgentTeam(names, tokenizers, policies=policies)
    team.requires_grad_(False)
    team.eval()
    if device is not None:
        team.to(device)
    return team
