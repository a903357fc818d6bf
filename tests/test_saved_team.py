"""The saved team (team/saved.py) is whole or refused: saves are atomic, a folder mixing two saves or a damaged
team.json is refused naming the file, and a resume onto another base model of the same shapes is refused."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil

import pytest
import torch

from trl_collm import MultiAgentPPOTrainer
from trl_collm.trainers import checkpoints


def ok_reward(prompts, completions, **kwargs):
    # completions[e] lists episode e's texts, one per agent: score the texts themselves (the agents' count
    # would give every episode the same reward)
    return [float(len(c[0]) % 3) - float(len(c[-1]) % 2) for c in completions]


# ---------------------------------------------------------------------------------------------------------------
# a saved team is whole or refused
# ---------------------------------------------------------------------------------------------------------------


def _weights(team) -> dict:
    return {a: torch.cat([p.detach().flatten() for p in team.model_of(a).parameters()]).clone() for a in team.names}


def _trainer(args, qwen_path, prompts_dataset, **kw):
    from trl_collm import MultiAgentPPOTrainer

    return MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward, **kw)


@pytest.fixture
def two_saves(tmp_path, make_config, prompts_dataset, qwen_path):
    """A trainer whose team is saved in `folder` (weights `old`), then changed in place (weights `new`)."""
    tr = _trainer(make_config(tmp_path, num_agents=2), qwen_path, prompts_dataset)
    folder = tmp_path / "team"
    tr.save_model(str(folder))
    old = _weights(tr.team)
    with torch.no_grad():
        for p in tr.team.parameters():
            p.add_(0.25)
    return tr, folder, old, _weights(tr.team)


def test_full_disk_while_saving_over_a_team_keeps_the_older_team_whole(two_saves, monkeypatch):
    from trl_collm.team.agents import AgentTeam
    from trl_collm.team.saved import load_team

    tr, folder, old, new = two_saves
    save_agent = AgentTeam.save_agent

    def second_agent_hits_a_full_disk(self, name, path, **kw):
        if name == self.names[1]:
            raise OSError(errno.ENOSPC, "No space left on device")
        save_agent(self, name, path, **kw)

    monkeypatch.setattr(AgentTeam, "save_agent", second_agent_hits_a_full_disk)
    with pytest.raises(OSError, match="No space left"):
        tr.save_model(str(folder))
    loaded = _weights(load_team(str(folder)))
    for a in tr.team.names:  # the older team, not one new agent beside one old one
        assert torch.equal(loaded[a], old[a]) and not torch.equal(loaded[a], new[a]), a


def test_save_killed_while_moving_into_place_is_refused_as_incomplete(two_saves, monkeypatch):
    from trl_collm.team import saved

    tr, folder, _, _ = two_saves
    replace = os.replace
    moved = []

    def killed_after_one_move(src, dst):
        if moved:
            raise KeyboardInterrupt  # the process dies between two renames
        if saved.TMP_FOLDER in src:
            moved.append(dst)
        replace(src, dst)

    monkeypatch.setattr(saved.os, "replace", killed_after_one_move)
    with pytest.raises(KeyboardInterrupt):
        tr.save_model(str(folder))
    monkeypatch.setattr(saved.os, "replace", replace)
    with pytest.raises(ValueError, match=re.escape(repr(str(folder))) + " holds an incomplete team"):
        saved.load_team(str(folder))


def test_load_team_refuses_a_folder_mixing_two_saves(two_saves, tmp_path):
    from trl_collm.team.saved import load_team

    tr, folder, _, _ = two_saves
    tr.save_model(str(tmp_path / "newer"))
    victim = tr.team.names[1]
    shutil.rmtree(folder / victim)
    shutil.copytree(tmp_path / "newer" / victim, folder / victim)  # one agent from another save
    with pytest.raises(ValueError, match=re.escape(repr(str(folder))) + f" mixes two saved teams: agent '{victim}'"):
        load_team(str(folder))
    assert set(load_team(str(tmp_path / "newer")).names) == set(tr.team.names)  # a whole team loads


# ---------------------------------------------------------------------------------------------------------------
# a resume onto another base model is refused
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["shared_base", "separate"])
def test_resume_onto_another_base_of_the_same_shapes_is_refused(
    tmp_path, make_config, prompts_dataset, qwen_path, layout
):
    from peft import LoraConfig

    from trl_collm.team.saved import resolve_base_ref
    from trl_collm.testing import tiny_model_dir

    other = tiny_model_dir("tiny-qwen2-seed1", seed=1)  # same architecture and shapes, other weights

    def lora():  # shared_base: one config (adapters on one base); separate: one LoRA model per agent
        cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
        return cfg if layout == "shared_base" else [cfg, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"])]

    args = make_config(tmp_path, num_agents=2, save_strategy="steps", save_steps=1)
    _trainer(args, qwen_path, prompts_dataset, peft_config=lora()).train()
    ck = checkpoints.complete_checkpoints(args.output_dir)[-1]
    recorded = json.loads(open(os.path.join(ck, "team.json")).read())["base"]["agent_0"]["model"]
    assert not os.path.isabs(recorded) and resolve_base_ref(recorded, ck) == qwen_path  # relative to the checkpoint

    resume = make_config(tmp_path, num_agents=2, save_strategy="no", total_episodes=12)
    tr = _trainer(resume, other, prompts_dataset, peft_config=lora())
    with pytest.raises(
        ValueError, match=re.escape(f"on base model {qwen_path!r}, but this run builds it on {other!r}")
    ):
        tr.train(resume_from_checkpoint=ck)
    # the same weights under another path (a local copy of the base) resume
    copy = shutil.copytree(qwen_path, tmp_path / "copy-of-base")
    tr = _trainer(resume, str(copy), prompts_dataset, peft_config=lora())
    tr.train(resume_from_checkpoint=ck)
    assert tr.state.global_step == 3


def test_fingerprint_samples_stay_inside_tensors_above_float32_precision():
    """SmolLM2's embedding has 49,152 x 576 = 28,311,552 elements: a float32 linspace put its last sample at
    index 28,311,552 (out of bounds), so a LoRA team of the real model could not start training."""
    from trl_collm.team.saved import _sample_indices

    for n in (1, 5, 64, 65, 2**24 + 1, 49_152 * 576):
        idx = _sample_indices(n, 64)
        assert len(idx) == min(n, 64) and int(idx[0]) == 0 and int(idx[-1]) == n - 1
        assert bool((idx[1:] > idx[:-1]).all())


# ---------------------------------------------------------------------------------------------------------------
# files the library reads
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def saved_team(tmp_path, make_config, prompts_dataset, qwen_path):
    args = make_config(tmp_path, num_agents=2)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    folder = tmp_path / "team"
    tr.save_model(str(folder))
    return folder


@pytest.mark.parametrize(
    "damage,match",
    [
        (lambda d: d.pop("layout"), r"team\.json.*'layout'"),
        (lambda d: d.pop("agents"), r"team\.json.*'agents'"),
        (lambda d: d.__setitem__("agent_folders", {}), r"team\.json.*agent_folders"),
    ],
)
def test_load_team_with_a_damaged_team_file(saved_team, damage, match):
    from trl_collm.inference import load_team

    path = saved_team / "team.json"
    desc = json.loads(path.read_text())
    damage(desc)
    path.write_text(json.dumps(desc))
    with pytest.raises(ValueError, match=match):
        load_team(str(saved_team))


def test_load_team_with_invalid_json(saved_team):
    from trl_collm.inference import load_team

    (saved_team / "team.json").write_text('{"agents": ["a", ')
    with pytest.raises(ValueError, match=re.escape(str(saved_team / "team.json")) + ".*not valid JSON"):
        load_team(str(saved_team))


def test_load_team_with_a_missing_agent_folder(saved_team):
    import shutil

    from trl_collm.inference import load_team

    desc = json.loads((saved_team / "team.json").read_text())
    victim = desc["agents"][1]
    shutil.rmtree(saved_team / desc["agent_folders"][victim])
    with pytest.raises(ValueError, match=f"agent '{victim}'.*missing"):
        load_team(str(saved_team))


def test_portable_model_refs(tmp_path):
    from trl_collm.team.saved import portable_model_ref, resolve_base_ref

    packaged = tmp_path / "smollm2-135m-instruct-0.1.0-12345"
    packaged.mkdir()
    assert portable_model_ref(str(packaged), str(tmp_path / "team")) == "smollm2-135m-instruct"
    base = tmp_path / "models" / "base"
    base.mkdir(parents=True)
    ref = portable_model_ref(str(base), str(tmp_path / "runs" / "team"))
    assert ref == os.path.join("..", "..", "models", "base")
    assert resolve_base_ref(ref, str(tmp_path / "runs" / "team")) == str(base)
    assert portable_model_ref("Qwen/Qwen2.5-0.5B", str(tmp_path)) == "Qwen/Qwen2.5-0.5B"  # a Hub id as is
