"""Config parsing (TRL PPO flags, presets) and the Hub push at the huggingface_hub call boundary."""

import os
import re

import pytest
from transformers import HfArgumentParser

from trl_collm import PRESETS, MultiAgentPPOConfig, MultiAgentPPOTrainer

TRL_PPO_DEFAULTS = dict(
    learning_rate=3e-6,
    num_mini_batches=1,
    total_episodes=None,
    local_rollout_forward_batch_size=64,
    num_sample_generations=10,
    response_length=53,
    stop_token=None,
    stop_token_id=None,
    temperature=0.7,
    missing_eos_penalty=None,
    num_ppo_epochs=4,
    whiten_rewards=False,
    kl_coef=0.05,
    kl_estimator="k1",
    cliprange=0.2,
    vf_coef=0.1,
    cliprange_value=0.2,
    gamma=1.0,
    lam=0.95,
    ds3_gather_for_generation=True,
    model_adapter_name=None,
    ref_adapter_name=None,
)


def _cfg(tmp_path, **kw):
    return MultiAgentPPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], **kw)


def test_trl_ppo_field_defaults_and_no_world_size_shadow(tmp_path):
    cfg = _cfg(tmp_path)
    for name, value in TRL_PPO_DEFAULTS.items():
        assert getattr(cfg, name) == value, name
    # TrainingArguments.world_size is a property; TRL's PPOConfig shadowed it with a field, breaking DeepSpeed.
    assert "world_size" not in MultiAgentPPOConfig.__dataclass_fields__
    assert cfg.world_size == 1


def test_cli_parses_trl_ppo_flags(tmp_path):
    parser = HfArgumentParser(MultiAgentPPOConfig)
    (cfg,) = parser.parse_args_into_dataclasses(
        [
            "--output_dir",
            str(tmp_path),
            "--use_cpu",
            "--bf16",
            "False",
            "--num_ppo_epochs",
            "2",
            "--missing_eos_penalty",
            "1.0",
            "--stop_token",
            "eos",
            "--kl_estimator",
            "k3",
            "--agent_names",
            "alice",
            "bob",
            "--critic_type",
            "decentralized",
            "--total_episodes",
            "40",
        ]
    )
    assert cfg.num_ppo_epochs == 2 and cfg.missing_eos_penalty == 1.0 and cfg.stop_token == "eos"
    assert cfg.kl_estimator == "k3" and cfg.agent_names == ["alice", "bob"] and cfg.critic_type == "decentralized"
    assert cfg.total_episodes == 40


def test_preset_fills_defaults_but_explicit_values_win(tmp_path):
    cfg = _cfg(tmp_path, preset="collm")
    for key, value in PRESETS["collm"].items():
        got = getattr(cfg, key)
        assert (got.value if hasattr(got, "value") else got) == value, key
    cfg = _cfg(tmp_path, preset="collm", gamma=0.5, max_grad_norm=None)
    assert cfg.gamma == 0.5 and cfg.max_grad_norm is None and cfg.lam == 0.0
    assert _cfg(tmp_path, preset="collm-1.4").gamma == 1.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(preset="ppo2"), "preset"),
        (dict(critic_type="central"), "critic_type"),
        (dict(critic_placement="gpu"), "critic_placement"),
        (dict(num_agents=3, agent_names=["a", "b"]), "num_agents"),
        (dict(agent_names=["a", "a"]), "agent_names"),
        (dict(agent_names=["critic", "b"]), "agent_names"),
        (dict(gamma=1.5), "gamma"),
        (dict(num_turns=0), "num_turns"),
        (dict(policy_loss_type="reinforce", num_ppo_epochs=2), "num_ppo_epochs"),
        (dict(advantage_level="token", centralized_value="team"), "centralized_value"),
        (dict(advantage_level="token", num_turns=2), "num_turns"),
        (dict(reward_type="per_agent", centralized_value="team"), "per_agent"),
        (dict(stop_token="</s>"), "stop_token"),
    ],
)
def test_config_errors_name_the_argument(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _cfg(tmp_path, **kwargs)


def test_push_to_hub_uploads_the_whole_team(tmp_path, monkeypatch):
    import transformers.trainer as hf_trainer
    from datasets import Dataset

    from trl_collm.testing import tiny_model_dir

    calls = {}

    class FakeApi:
        def create_repo(self, repo_id, **kw):
            calls["repo"] = repo_id
            return type("R", (), {"repo_id": f"me/{repo_id}"})()

        def upload_folder(self, repo_id, folder_path, **kw):
            calls["upload"] = (
                repo_id,
                sorted(
                    os.path.relpath(os.path.join(root, f), folder_path)
                    for root, _, files in os.walk(folder_path)
                    for f in files
                ),
            )
            calls["card"] = open(os.path.join(folder_path, "README.md")).read()

    monkeypatch.setattr(hf_trainer, "hf_api", lambda: FakeApi())
    path = tiny_model_dir("tiny-qwen2")
    out = tmp_path / "team-out"
    args = MultiAgentPPOConfig(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,
        report_to=[],
        agent_names=["alice", "bob"],
        per_device_train_batch_size=2,
        response_length=4,
        total_episodes=2,
        save_strategy="no",
        num_sample_generations=0,
        disable_tqdm=True,
    )
    trainer = MultiAgentPPOTrainer(
        args=args,
        model=path,
        train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}),
        reward_funcs=lambda prompts, completions, **k: [1.0] * len(prompts),
    )
    trainer.train()
    trainer.push_to_hub(dataset_name="toy")
    repo, files = calls["upload"]
    assert repo == "me/team-out"
    for needed in [
        "team.json",
        "README.md",
        "alice/model.safetensors",
        "bob/model.safetensors",
        "critic/model.safetensors",
        "alice/tokenizer.json",
    ]:
        assert needed in files, (needed, files)
    card = calls["card"]
    assert re.search(r"\| alice \| `[^`]*tiny-qwen2[^`]*` \(local\) \| `alice` \|", card) and "centralized" in card
    assert "None" not in card and "team-out" in card and "load_team('me/team-out')" in card


def test_push_without_critic_and_load_team_round_trip(tmp_path, monkeypatch):
    """include_critic=False leaves critic/ out of the upload; load_team(repo_id) fetches the repo (snapshot_download,
    stubbed to a local copy of what was uploaded) and runs the team decentralized with the trained weights."""
    import shutil

    import huggingface_hub
    import torch
    import transformers.trainer as hf_trainer
    from peft import LoraConfig

    from trl_collm.generation.sampler import SamplingSettings
    from trl_collm.inference import load_team, play
    from trl_collm.tasks import get_task
    from trl_collm.testing import tiny_model_dir

    uploaded = tmp_path / "hub-copy"

    class FakeApi:
        def create_repo(self, repo_id, **kw):
            return type("R", (), {"repo_id": f"me/{repo_id}"})()

        def upload_folder(self, repo_id, folder_path, ignore_patterns=(), **kw):
            import fnmatch

            for root, _, files in os.walk(folder_path):
                for f in files:
                    rel = os.path.relpath(os.path.join(root, f), folder_path)
                    if any(fnmatch.fnmatch(rel, pat) for pat in ignore_patterns):
                        continue
                    (uploaded / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(os.path.join(root, f), uploaded / rel)

    monkeypatch.setattr(hf_trainer, "hf_api", lambda: FakeApi())
    task = get_task("coord-penalty")
    path = tiny_model_dir("tiny-qwen2")
    args = MultiAgentPPOConfig(
        output_dir=str(tmp_path / "lora-team"),
        use_cpu=True,
        bf16=False,
        report_to=[],
        agent_names=task.agent_names,
        per_device_train_batch_size=2,
        response_length=2,
        total_episodes=2,
        save_strategy="no",
        num_sample_generations=0,
        disable_tqdm=True,
        learning_rate=1e-2,
    )
    trainer = MultiAgentPPOTrainer(
        args=args,
        model=path,
        train_dataset=task.load_dataset("train", limit=4),
        env=task.make_env(),
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
    )
    trainer.train()
    trainer.push_to_hub(include_critic=False, dataset_name="coord-penalty")
    files = {str(p.relative_to(uploaded)) for p in uploaded.rglob("*") if p.is_file()}
    assert "team.json" in files and "player_1/adapter_config.json" in files and "player_2/adapter_config.json" in files
    assert not any(f.startswith("critic") for f in files)
    card = (uploaded / "README.md").read_text()
    assert "player_1" in card and "penalty game" in card  # roles: the agents' example prompts
    assert "RewardFunctionEnv" in card and "payoff" in card and "load_team" in card

    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kw: str(uploaded))
    team = load_team("me/lora-team")
    assert team.layout == "shared_base" and team.names == task.agent_names
    live = dict(trainer.team.shared_base.named_parameters())
    for name, p in team.shared_base.named_parameters():
        if "lora_B" in name:
            assert torch.allclose(p, live[name].cpu()), name
    settings = SamplingSettings(max_new_tokens=2, greedy=True)
    transcripts = play(team, task.make_env(), [task.load_dataset("eval")[0]], num_turns=1, settings=settings)
    assert set(transcripts[0]["turns"][0]["agents"]) == set(task.agent_names)
