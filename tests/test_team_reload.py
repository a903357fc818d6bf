"""A saved team or a checkpoint reloaded onto another base is refused, never silently wrong (issue 29, part 3).

The adapters of a LoRA team mean nothing on another base of the same shapes, yet load and generate there: team.json
records each agent's base fingerprint (``base_identity``), and ``load_team`` and a resume now compare it with the
base they load. The other base is ``tiny_model_dir("tiny-qwen2-seed1", seed=1)``: the test model's architecture and
shapes, other weights.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from trl_collm.trainers import checkpoints


def _reward(prompts, completions, **kwargs):
    # completions[e] lists episode e's texts, one per agent: score the first agent's text (len(completions[e]),
    # the agents' count, would give every episode the same reward)
    return [float(len(c[0]) % 3) for c in completions]


def _lora(layout):
    from peft import LoraConfig

    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    return cfg if layout == "shared_base" else [cfg, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"])]


def _trainer(args, model, dataset, layout):
    from trl_collm import MultiAgentPPOTrainer

    return MultiAgentPPOTrainer(
        args=args, model=model, train_dataset=dataset, reward_funcs=_reward, peft_config=_lora(layout)
    )


@pytest.fixture(scope="module")
def other_base():
    from trl_collm.testing import tiny_model_dir

    return tiny_model_dir("tiny-qwen2-seed1", seed=1)


@pytest.fixture(params=["shared_base", "separate"])
def trained(request, tmp_path, make_config, prompts_dataset, qwen_path):
    """A 2-agent LoRA team trained one step, saved, with a checkpoint."""
    args = make_config(tmp_path, num_agents=2, save_strategy="steps", save_steps=1)
    tr = _trainer(args, qwen_path, prompts_dataset, request.param)
    tr.train()
    tr.save_model(args.output_dir)
    return request.param, args, checkpoints.complete_checkpoints(args.output_dir)[-1]


def _edit_team_json(folder, edit):
    path = os.path.join(folder, "team.json")
    with open(path) as f:
        desc = json.load(f)
    edit(desc)
    with open(path, "w") as f:
        json.dump(desc, f)


def test_load_team_refuses_another_base_of_the_same_shapes(trained, other_base, qwen_path, tmp_path):
    from trl_collm.team.saved import load_team

    layout, args, _ = trained
    team = load_team(args.output_dir)  # the base it was trained on: loads
    assert team.names == ["agent_0", "agent_1"]
    copy = shutil.copytree(qwen_path, tmp_path / "copy-of-base")  # the same weights elsewhere: loads
    assert load_team(args.output_dir, base_model=str(copy)).names == team.names
    with pytest.raises(ValueError, match=r"agent 'agent_0' of .*team\.json' was trained on base .* other frozen"):
        load_team(args.output_dir, base_model=other_base)


def test_load_team_refuses_an_edited_base_record(trained, other_base):
    from trl_collm.team.saved import load_team

    layout, args, _ = trained
    if layout == "shared_base":
        _edit_team_json(args.output_dir, lambda d: d.update(base_model=other_base))
    else:  # a separate LoRA agent's base is named in its adapter_config.json
        path = os.path.join(args.output_dir, "agent_1", "adapter_config.json")
        with open(path) as f:
            cfg = json.load(f)
        cfg["base_model_name_or_path"] = other_base
        with open(path, "w") as f:
            json.dump(cfg, f)
    agent = "agent_0" if layout == "shared_base" else "agent_1"
    with pytest.raises(ValueError, match=rf"agent '{agent}' of .* would run on the wrong model\. Pass base_model="):
        load_team(args.output_dir)


def test_load_team_without_a_record_warns_that_it_cannot_check(trained):
    from trl_collm.team.saved import load_team

    _, args, _ = trained
    _edit_team_json(args.output_dir, lambda d: d.pop("base"))
    with pytest.warns(UserWarning, match=r"records no base fingerprint for agents \['agent_0', 'agent_1'\]"):
        load_team(args.output_dir)


def test_resume_from_a_checkpoint_without_team_json_is_refused(
    trained, make_config, tmp_path, prompts_dataset, other_base
):
    layout, _, ck = trained
    os.remove(os.path.join(ck, "team.json"))
    resume = make_config(tmp_path, num_agents=2, save_strategy="no", total_episodes=12)
    tr = _trainer(resume, other_base, prompts_dataset, layout)
    with pytest.raises(ValueError, match=re.escape(f"checkpoint {ck!r} has no team.json, so the base model")):
        tr.train(resume_from_checkpoint=ck)


def test_resume_from_a_checkpoint_without_base_record_is_refused(
    trained, make_config, tmp_path, prompts_dataset, qwen_path
):
    layout, _, ck = trained
    _edit_team_json(ck, lambda d: d.pop("base"))
    resume = make_config(tmp_path, num_agents=2, save_strategy="no", total_episodes=12)
    tr = _trainer(resume, qwen_path, prompts_dataset, layout)
    with pytest.raises(ValueError, match=r"records no base fingerprint for agents \['agent_0', 'agent_1'\]"):
        tr.train(resume_from_checkpoint=ck)


def test_load_team_names_a_truncated_weights_file(trained):
    """A truncated adapter_model.safetensors reached load_team's caller as safetensors' own error (no file named)."""
    from trl_collm.team.saved import load_team

    _, args, _ = trained
    path = os.path.join(args.output_dir, "agent_1", "adapter_model.safetensors")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(ValueError, match=re.escape(f"{path} (the weights of agent 'agent_1') cannot be read")) as info:
        load_team(args.output_dir)
    assert "\n" not in str(info.value) and "re-save it with save_model()" in str(info.value)


def test_load_team_names_a_truncated_full_model(tmp_path, make_config, prompts_dataset, qwen_path):
    from trl_collm import MultiAgentPPOTrainer
    from trl_collm.team.saved import load_team

    args = make_config(tmp_path, num_agents=2)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=_reward)
    tr.save_model(args.output_dir)
    path = os.path.join(args.output_dir, "agent_0", "model.safetensors")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)
    with pytest.raises(ValueError, match=re.escape(f"{path} (the weights of agent 'agent_0') cannot be read")):
        load_team(args.output_dir)
