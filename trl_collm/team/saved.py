"""The saved-team format, written and read in one place.

A saved team is a folder holding `team.json` (this format's description: agents, layout, folders, critic), one
folder per agent (a full model or a LoRA adapter, loadable with `from_pretrained`; the folder itself for a single
agent, like TRL's PPO) and, when the trainer has one, the critic under `critic/`.

    from trl_collm.team.saved import load_team
    team = load_team("outputs/quickstart")   # the agents, for decentralized inference (see inference.py)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid

import torch

from .agents import AgentTeam
from .modeling import base_model_of, flatten_adapter_folder
from .names import check_agent_names
from .weights_files import unreadable_weights

TEAM_FILE = "team.json"
FORMAT = "trl-collm-team/1"
TMP_FOLDER = ".team.tmp"  # a team being written (write_team)
OLD_FOLDER = ".team.old"  # the folders it replaces, until the new team is complete
SAVE_STAMP = ".team_save_id"  # in each agent folder: the `save_id` of the team.json written with it


def agent_folder(name: str, num_agents: int) -> str:
    """An agent's folder relative to the team folder ("." for a single agent, as TRL's PPO saves its policy)."""
    return "." if num_agents == 1 else name


# Elements read from each frozen tensor for its fingerprint: enough to tell two bases of the same shapes apart.
_SAMPLES_PER_TENSOR = 64


def base_identity(team: AgentTeam) -> dict:
    """Per agent, what it was built from: the base model (`config._name_or_path`) and a fingerprint of its frozen
    weights (those no checkpoint stores: a LoRA agent's base), so a resume can refuse another base of the same
    shapes. The fingerprint hashes a few evenly spaced elements of every frozen tensor, rounded to bfloat16 so a
    float32 and a bfloat16 load of one base agree; None when nothing is frozen or the weights are partitioned."""
    out = {}
    for a in team.names:
        model = team.model_of(a)
        inner = base_model_of(model)
        out[a] = {
            "model": getattr(getattr(inner, "config", None), "_name_or_path", None) or None,
            "frozen_fingerprint": _frozen_fingerprint(model),
        }
    return out


def _sample_indices(n: int, k: int) -> torch.Tensor:
    """min(n, k) evenly spaced indices of 0..n-1, first and last included, in integer arithmetic: a float32
    linspace rounds n - 1 up past the end for tensors above 2**24 elements (SmolLM2's 49,152 x 576 embedding)."""
    k = min(n, k)
    return torch.arange(k, dtype=torch.int64) * (n - 1) // max(k - 1, 1)


def _frozen_fingerprint(model: torch.nn.Module, through: torch.dtype | None = None) -> str | None:
    """``through``: round every sample to that dtype first (load_team's second look, for a base recorded in
    float16: see ``check_loaded_base``)."""
    adapters = set(getattr(model, "peft_config", {}) or {})  # adapter weights are trained, not part of the base
    digest = hashlib.sha256()
    count = 0
    for name, p in model.named_parameters():
        if p.requires_grad or adapters.intersection(name.split(".")):
            continue
        if p.is_meta or (p.numel() == 0 and hasattr(p, "ds_numel")):
            return None  # not materialized here (ZeRO-3 partitions at load): cannot fingerprint
        flat = p.detach().reshape(-1)
        idx = _sample_indices(flat.numel(), _SAMPLES_PER_TENSOR).to(flat.device)
        values = flat[idx] if through is None else flat[idx].to(through)
        values = values.to(torch.bfloat16).cpu().view(torch.int16)
        digest.update(f"{name}:{tuple(p.shape)}:".encode())
        digest.update(values.numpy().tobytes())
        count += 1
    return digest.hexdigest()[:32] if count else None


def describe_team(
    team: AgentTeam,
    trainer: str,
    num_turns: int,
    preset: str | None,
    critic=None,
    generation: dict | None = None,
    base: dict | None = None,
    prompts: dict | None = None,
) -> dict:
    """The contents of team.json (`generation`: the sampling settings the team was trained with, `SamplingSettings`'
    form; `prompts`: what shaped its prompts, `PromptSettings`' form; `base`: what each agent was built from,
    `base_identity`)."""
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
    if prompts is not None:
        desc["prompts"] = prompts
    if team.layout == "shared_base":
        desc["base_model"] = getattr(team.shared_base.get_base_model().config, "_name_or_path", None)
    if base is not None:
        desc["base"] = base
    if critic is not None:
        desc["critic"] = critic.describe()
    return desc


def portable_model_ref(path: str | None, folder: str) -> str | None:
    """How team.json names a base model so that the file holds no absolute local path: a packaged model's folder by
    the model's name (resolve_model_name finds it on any machine), another local folder relative to the team folder
    `folder` (load_team resolves it there, so the pair can move together), a Hub id as is."""
    if not isinstance(path, str) or not os.path.isabs(path) or not os.path.isdir(path):
        return path
    from .pretrained import PACKAGED_MODELS

    base = os.path.basename(os.path.normpath(path))
    for name in PACKAGED_MODELS:
        if base.startswith(f"{name}-"):
            return name
    return os.path.relpath(path, os.path.abspath(folder))


def resolve_base_ref(ref: str, folder: str) -> str:
    """team.json's base model back to what from_pretrained takes (the reverse of portable_model_ref)."""
    from .pretrained import resolve_model_name

    beside = os.path.normpath(os.path.join(folder, ref))
    if not os.path.isabs(ref) and os.path.isdir(beside):
        return beside
    return resolve_model_name(ref)


def _portable_description(description: dict, folder: str) -> dict:
    desc = dict(description)
    if "base_model" in desc:
        desc["base_model"] = portable_model_ref(desc["base_model"], folder)
    if isinstance(desc.get("base"), dict):
        desc["base"] = {
            a: {**b, "model": portable_model_ref(b.get("model"), folder)} if isinstance(b, dict) else b
            for a, b in desc["base"].items()
        }
    return desc


def write_team(output_dir: str, team: AgentTeam, critic, description: dict, full_state: dict | None) -> None:
    """Every agent's folder, the critic's folders and team.json. `full_state`: the gathered state dict of the
    TeamModel when parameters are partitioned (ZeRO-3), else None (the live modules are saved).

    Written as checkpoints are: into `output_dir/.team.tmp/` first (a full disk or a kill there leaves the older
    team whole), then moved into place with team.json last. While the entries move, output_dir has no team.json, so
    a kill then leaves a folder `load_team` refuses as incomplete instead of a mix of two teams."""
    os.makedirs(output_dir, exist_ok=True)
    tmp = os.path.join(output_dir, TMP_FOLDER)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    description = _portable_description(description, output_dir)
    _write_team_files(tmp, team, critic, {**description, "save_id": uuid.uuid4().hex}, full_state)
    _move_into_place(tmp, output_dir)


def _write_team_files(output_dir: str, team: AgentTeam, critic, description: dict, full_state: dict | None) -> None:

    def part(prefix):
        return sub_state_dict(full_state, prefix)  # None: use the live modules

    for a in team.names:
        folder = os.path.normpath(os.path.join(output_dir, agent_folder(a, len(team.names))))
        if full_state is not None and team.layout == "shared_base":
            save_shared_adapter(team.shared_base, a, folder, part("team.shared_base."))
            team.tokenizers[a].save_pretrained(folder)
        else:
            team.save_agent(a, folder, state_dict=part(f"team.policies.{a}."))
        with open(os.path.join(folder, SAVE_STAMP), "w") as f:  # which save wrote this folder (see load_team)
            f.write(description["save_id"])
    if critic is not None:
        critic.save(output_dir, part)
    with open(os.path.join(output_dir, TEAM_FILE), "w") as f:
        json.dump(description, f, indent=2)


def sub_state_dict(full: dict | None, prefix: str) -> dict | None:
    """The entries of a gathered TeamModel state dict under `prefix`, with the prefix cut (None stays None)."""
    if full is None:
        return None
    return {k[len(prefix) :]: v for k, v in full.items() if k.startswith(prefix)}


def save_shared_adapter(peft_model, adapter: str, folder: str, state_dict: dict | None) -> None:
    """One adapter of the shared base, flattened into `folder` (PEFT nests non-default adapters)."""
    kwargs = {} if state_dict is None else {"state_dict": state_dict}
    peft_model.save_pretrained(folder, selected_adapters=[adapter], **kwargs)
    flatten_adapter_folder(folder, adapter)


def _move_into_place(tmp: str, output_dir: str) -> None:
    """Replace output_dir's team by the complete one in `tmp`; entries of output_dir the team does not hold
    (checkpoints, logs, the card) stay."""
    team_file = os.path.join(output_dir, TEAM_FILE)
    if os.path.exists(team_file):
        os.remove(team_file)  # from here until the last line the folder is an incomplete team, never a mixed one
    old = os.path.join(output_dir, OLD_FOLDER)
    shutil.rmtree(old, ignore_errors=True)
    os.makedirs(old)
    for entry in sorted(os.listdir(tmp)):
        if entry == TEAM_FILE:
            continue
        src, dst = os.path.join(tmp, entry), os.path.join(output_dir, entry)
        if os.path.isdir(dst) or (os.path.lexists(dst) and os.path.isdir(src)):
            os.replace(dst, os.path.join(old, entry))  # a folder is not replaced by rename: move the old one aside
        os.replace(src, dst)
    os.replace(os.path.join(tmp, TEAM_FILE), team_file)  # the team is complete
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


def read_team_file(folder: str) -> dict:
    path = os.path.join(folder, TEAM_FILE)
    if not os.path.isfile(path) and os.path.isdir(os.path.join(folder, TMP_FOLDER)):
        raise ValueError(
            f"{folder!r} holds an incomplete team: a save into it was interrupted (no {TEAM_FILE}, a "
            f"{TMP_FOLDER} folder). Save the team again, or load it from a checkpoint-* folder of its run."
        )
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
    if not isinstance(names, list) or not names:
        raise ValueError(f"{path!r}: 'agents' must be a non-empty list of agent names, got {names!r}; {fix}.")
    check_agent_names(names, f"{path!r} ('agents')")
    if desc["layout"] not in ("separate", "shared_base"):
        raise ValueError(f"{path!r}: 'layout' must be 'separate' or 'shared_base', got {desc['layout']!r}; {fix}.")
    folders = desc["agent_folders"]
    missing = [a for a in names if not isinstance(folders, dict) or not isinstance(folders.get(a), str)]
    if missing:
        raise ValueError(f"{path!r}: 'agent_folders' has no folder for agents {missing}; {fix}.")
    # an agent's folder is its name (or the team folder itself for one agent): nothing may point elsewhere
    elsewhere = {a: folders[a] for a in names if folders[a] != agent_folder(a, len(names))}
    if elsewhere:
        raise ValueError(f"{path!r}: 'agent_folders' {elsewhere} are not the agents' own folders; {fix}.")
    _check_settings(desc, path, names)


# What generation/prompts.py accepts as `agent_context` (tests/test_team_json_checks.py keeps the two the same: this
# floor cannot import that module).
AGENT_CONTEXTS = ("observation", "history")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _positive_int_or_none(v) -> bool:
    return v is None or (_is_int(v) and v >= 1)


# team.json's settings: (section, key) -> (the check, what is allowed). A missing key keeps its default.
_SETTINGS = {
    ("generation", "response_length"): (_positive_int_or_none, "an integer >= 1 (new tokens per answer) or null"),
    ("generation", "temperature"): (lambda v: _is_number(v) and v > 0, "a number > 0"),
    ("generation", "top_p"): (lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    ("generation", "top_k"): (lambda v: v is None or (_is_int(v) and v >= 0), "null, 0 (off) or an integer >= 1"),
    ("generation", "stop_token_id"): (
        lambda v: v is None or _is_int(v) or (isinstance(v, list) and all(_is_int(t) for t in v)),
        "null, a token id or a list of token ids",
    ),
    ("generation", "min_p"): (lambda v: v is None or (_is_number(v) and 0 <= v <= 1), "a number in [0, 1] (0: off)"),
    ("generation", "repetition_penalty"): (lambda v: _is_number(v) and v > 0, "a number > 0 (1.0: off)"),
    ("generation", "generation_kwargs"): (
        lambda v: v is None or (isinstance(v, dict) and all(isinstance(k, str) for k in v)),
        "an object of generate() / vLLM SamplingParams keyword arguments, or null",
    ),
    ("prompts", "agent_context"): (lambda v: v in AGENT_CONTEXTS, f"one of {list(AGENT_CONTEXTS)}"),
}


def _check_settings(desc: dict, path: str, names: list) -> None:
    """The sampling and prompt settings eval / play run the team with, each checked on load (a hand-edited value
    would otherwise fail later as a raw TypeError naming no file): the file, the field, the value, what is allowed."""

    def bad(field: str, value, allowed: str):
        return ValueError(
            f"{path!r}: {field!r} is {value!r}, but it must be {allowed}; fix that value in the file, or re-save the "
            "team with save_model()."
        )

    if desc.get("num_turns") is not None and not (_is_int(desc["num_turns"]) and desc["num_turns"] >= 1):
        raise bad("num_turns", desc["num_turns"], "an integer >= 1 (the turns of an episode)")
    if desc.get("base_model") is not None and not isinstance(desc["base_model"], str):
        raise bad("base_model", desc["base_model"], "the path or Hub id of the base model (a string)")
    if desc.get("task") is not None and not isinstance(desc["task"], dict):
        raise bad("task", desc["task"], 'an object ({"name": ..., "ref": ..., "options": {...}}) or null')
    for section in ("generation", "prompts"):
        entry = desc.get(section)
        if entry is None:
            continue
        if not isinstance(entry, dict):
            raise bad(section, entry, "an object of settings, or absent")
        for (where, key), (ok, allowed) in _SETTINGS.items():
            if where == section and key in entry and not ok(entry[key]):
                raise bad(f"{section}.{key}", entry[key], allowed)
        per_agent = [("max_prompt_length", _positive_int_or_none, "an integer >= 1 (tokens) or null")]
        if section == "prompts":
            per_agent.append(("chat_templates", lambda v: v is None or isinstance(v, str), "a string or null"))
        for key, ok, allowed in per_agent:
            value = entry.get(key)
            if value is None:
                continue
            if not isinstance(value, dict):
                raise bad(f"{section}.{key}", value, f"an object agent -> value ({allowed}), one entry per agent")
            for agent, v in value.items():
                if agent not in names:
                    raise bad(f"{section}.{key}", value, f"keyed by the team's agents {names} (not {agent!r})")
                if not ok(v):
                    raise bad(f"{section}.{key}.{agent}", v, allowed)


def _check_one_save(folder: str, desc: dict, folders: dict) -> None:
    """Every agent folder was written by the save that wrote team.json (teams saved before `save_id`: unchecked)."""
    save_id = desc.get("save_id")
    if save_id is None:
        return
    for a, path in folders.items():
        try:
            with open(os.path.join(path, SAVE_STAMP)) as f:
                stamp = f.read().strip()
        except OSError:
            stamp = None
        if stamp != save_id:
            raise ValueError(
                f"{folder!r} mixes two saved teams: agent {a!r}'s folder {path!r} was not written with its "
                f"{TEAM_FILE}. Copy or save the whole team again (save_model()), or load it from a checkpoint-* folder."
            )


def check_loaded_base(team: AgentTeam, desc: dict, team_file: str, adapter_agents: list[str]) -> None:
    """Adapters run on the base they were trained on, or not at all: each LoRA agent's frozen weights, as loaded,
    must have the fingerprint team.json records (`base_identity`). Without this, an edited `base_model` or a
    `base_model=` override naming another base of the same shapes loads and generates without a word.

    A base recorded in float16 fingerprints as its float16 values: when the plain fingerprint differs, the loaded
    weights are also looked at through float16 before refusing. A base loaded in float16 cannot be compared with
    one recorded at a higher precision, and a team saved before the record (or under ZeRO-3) has none: both load
    with a warning that says so."""
    import warnings

    recorded = desc.get("base") or {}
    unrecorded = [a for a in adapter_agents if not (recorded.get(a) or {}).get("frozen_fingerprint")]
    if unrecorded:
        warnings.warn(
            f"{team_file!r} records no base fingerprint for agents {unrecorded} (saved before trl-collm recorded one, "
            "or under ZeRO-3): their base cannot be checked; make sure it is the base the adapters were trained on.",
            stacklevel=3,
        )
    for a in adapter_agents:
        if a in unrecorded:
            continue
        then = recorded[a]["frozen_fingerprint"]
        model = team.model_of(a)
        now = _frozen_fingerprint(model)
        if now is None or now == then or _frozen_fingerprint(model, through=torch.float16) == then:
            continue
        if any(p.dtype == torch.float16 for p in model.parameters()):
            warnings.warn(
                f"agent {a!r}'s base was loaded in float16, whose values cannot be compared with the fingerprint "
                f"{team_file!r} records; load with dtype=torch.float32 (or bfloat16) to have it checked.",
                stacklevel=3,
            )
            continue
        inner = getattr(getattr(base_model_of(model), "config", None), "_name_or_path", None)
        raise ValueError(
            f"agent {a!r} of {team_file!r} was trained on base {(recorded.get(a) or {}).get('model')!r}, but the "
            f"base loaded ({inner!r}) has other frozen weights (fingerprint {now}, recorded {then}): its adapters "
            "would run on the wrong model. Pass base_model=<the base it was trained on> (or restore team.json)."
        )


def _adapter_base(folder: str) -> str | None:
    """The base an agent folder's LoRA adapter names (None: the folder is a full model)."""
    path = os.path.join(folder, "adapter_config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f).get("base_model_name_or_path") or None


def load_team(
    folder: str, base_model: str | None = None, device: str | torch.device | None = None, dtype=None
) -> AgentTeam:
    """Rebuild the agents of a saved team (a local folder or a Hub repo id; full models or LoRA adapters on their
    base) for decentralized inference. The team keeps its team.json (`team.description`), whose sampling and prompt
    settings `inference.play` plays it with.

    `base_model` overrides the base recorded for LoRA agents (in team.json for a shared base, in each adapter's
    `adapter_config.json` for separate ones; e.g. a local copy of the base). A base whose weights differ from the
    ones the team was trained on is refused (`check_loaded_base`).
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not os.path.isdir(folder):  # a Hub repo id: fetch the whole team once (fails clearly when offline)
        from .card import is_hub_id

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
    _check_one_save(folder, desc, folders)
    for a, path in folders.items():  # before any model loads: safetensors' own error names no file
        bad = unreadable_weights(path)
        if bad is not None:
            raise ValueError(
                f"{bad[0]} (the weights of agent {a!r}) cannot be read ({bad[1]}): the file is truncated or corrupt "
                "(an interrupted copy or save); copy the whole team folder again or re-save it with save_model()."
            )
    tokenizers = {a: AutoTokenizer.from_pretrained(folders[a]) for a in names}
    if desc["layout"] == "shared_base":
        base_path = base_model or desc.get("base_model")
        if not base_path:
            raise ValueError(
                "team.json records no base model; pass `base_model` (the path or Hub id the adapters were trained on)."
            )
        base = AutoModelForCausalLM.from_pretrained(resolve_base_ref(base_path, folder), dtype=dtype)
        model = PeftModel.from_pretrained(base, folders[names[0]], adapter_name=names[0])
        for a in names[1:]:
            model.load_adapter(folders[a], adapter_name=a)
        team = AgentTeam(names, tokenizers, shared_base=model, description=desc)
        adapter_agents = list(names)
    else:
        policies, adapter_agents = {}, []
        for a in names:
            adapter = _adapter_base(folders[a])
            if adapter is None:
                policies[a] = AutoModelForCausalLM.from_pretrained(folders[a], dtype=dtype)
                continue
            # As the trainer built it (a PeftModel on its base): the same module names, so the same fingerprint.
            base = AutoModelForCausalLM.from_pretrained(base_model or adapter, dtype=dtype)
            policies[a] = PeftModel.from_pretrained(base, folders[a])
            adapter_agents.append(a)
        team = AgentTeam(names, tokenizers, policies=policies, description=desc)
    check_loaded_base(team, desc, os.path.join(folder, TEAM_FILE), adapter_agents)
    team.requires_grad_(False)
    team.eval()
    if device is not None:
        team.to(device)
    return team
