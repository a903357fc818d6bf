"""Run a trained team decentralized: no critic, each agent sees only its own observations, agents in parallel.

    from trl_collm.inference import load_team, play
    team = load_team("outputs/quickstart")          # a folder written by save_model()
    episodes = play(team, env, rows, num_turns=1)   # transcripts and rewards
"""

from __future__ import annotations

import json
import os

import torch

from .rollout import run_episodes
from .team import AgentTeam

TEAM_FILE = "team.json"


def read_team_file(folder: str) -> dict:
    path = os.path.join(folder, TEAM_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{folder!r} has no {TEAM_FILE}; pass the output_dir of a trl-collm save_model() / train run.")
    with open(path) as f:
        return json.load(f)


def load_team(folder: str, base_model: str | None = None, device: str | torch.device | None = None, dtype=None) -> AgentTeam:
    """Rebuild the agents of a saved team (a local folder or a Hub repo id; full models or LoRA adapters on their
    base) for decentralized inference.

    `base_model` overrides the base recorded in team.json for LoRA teams (e.g. a local copy of the base).
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not os.path.isdir(folder):  # a Hub repo id: fetch the whole team once (fails clearly when offline)
        from huggingface_hub import snapshot_download

        folder = snapshot_download(folder)
    desc = read_team_file(folder)
    names = desc["agents"]
    folders = {a: os.path.normpath(os.path.join(folder, desc["agent_folders"][a])) for a in names}
    tokenizers = {a: AutoTokenizer.from_pretrained(folders[a]) for a in names}
    if desc["layout"] == "shared_base":
        base_path = base_model or desc.get("base_model")
        if not base_path:
            raise ValueError("team.json records no base model; pass `base_model` (the path or Hub id the adapters were trained on).")
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


@torch.no_grad()
def play(team: AgentTeam, env, rows: list[dict], num_turns: int = 1, max_new_tokens: int = 64, greedy: bool = True,
         temperature: float = 0.7, device=None) -> list[dict]:
    """Episodes run decentralized; returns one transcript per row: per turn each agent's prompt, answer, reward."""
    device = device or next(team.parameters()).device
    tok = team.tokenizers[team.names[0]]
    gen_kwargs = dict(max_new_tokens=max_new_tokens, do_sample=not greedy, pad_token_id=tok.pad_token_id)
    if not greedy:
        gen_kwargs["temperature"] = temperature
    roll = run_episodes(team, env, rows, num_turns, device, gen_kwargs)
    transcripts = []
    for e in range(len(rows)):
        turns = []
        for t, turn in enumerate(roll.turns):
            ids = turn[team.names[0]].episode_ids.tolist()
            if e not in ids:
                continue
            k = ids.index(e)
            turns.append({"turn": t, "reward": roll.rewards[e, t].tolist(),
                          "agents": {a: {"prompt": turn[a].contexts[k], "completion": turn[a].gen.texts[k]} for a in team.names}})
        transcripts.append({"episode": e, "return": roll.rewards[e].sum(0).tolist(), "turns": turns})
    return transcripts
