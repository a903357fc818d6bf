"""End-to-end runs of MultiAgentPPOTrainer on tiny offline models (CPU, a few seconds each)."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from trl_collm import MultiAgentEnv, MultiAgentPPOTrainer, StepResult

# ---------------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------------


def varied_reward(prompts, completions, **kwargs):
    """Joint reward that differs between episodes, so whitened advantages are not all zero."""
    return [float(len(c[0]) % 3) + 0.5 * float(len(c[-1]) % 2) for c in completions]


def snapshot(params):
    return [p.detach().clone() for p in params]


def changed(before, params) -> list[bool]:
    params = list(params)
    assert len(before) == len(params) and params, "no parameters to compare"
    return [not torch.equal(b, p.detach()) for b, p in zip(before, params)]


def agent_snapshots(trainer):
    return {a: snapshot(trainer.team.agent_parameters(a)) for a in trainer.team.names}


def critic_snapshots(trainer):
    return {k: snapshot(u.own_parameters()) for k, u in trainer.critic.units.items()}


def assert_all_trained(trainer, agents_before, critics_before):
    """Every tensor of every agent and every critic moved (Adam moves any tensor with a non-zero gradient)."""
    for a, before in agents_before.items():
        flags = changed(before, trainer.team.agent_parameters(a))
        assert all(flags), f"agent {a}: {flags.count(False)}/{len(flags)} tensors did not change"
    for key, before in critics_before.items():
        flags = changed(before, trainer.critic.units[key].own_parameters())
        assert all(flags), f"critic {key}: {flags.count(False)}/{len(flags)} tensors did not change"
    for a in trainer.team.names:
        assert all(torch.isfinite(p).all() for p in trainer.team.agent_parameters(a))


def assert_finite_metrics(metrics, keys):
    for key in keys:
        assert key in metrics, f"missing metric {key}"
        assert math.isfinite(metrics[key]), f"{key}={metrics[key]}"


def rows_of(ds, k=4):
    return [ds[i] for i in range(k)]


# ---------------------------------------------------------------------------------------------------------------
# CC / DC, 2 and 3 agents
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("critic_type", ["centralized", "decentralized"])
@pytest.mark.parametrize("num_agents", [2, 3])
def test_cc_dc_train_every_agent_and_critic(tmp_path, make_config, prompts_dataset, qwen_path, critic_type, num_agents):
    args = make_config(tmp_path, num_agents=num_agents, critic_type=critic_type)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=varied_reward)
    names = [f"agent_{i}" for i in range(num_agents)]
    assert tr.team.names == names and tr.team.layout == "separate"
    expected_units = ["central"] if critic_type == "centralized" else names
    assert sorted(tr.critic.units) == sorted(expected_units)
    # Separate models: no parameter is shared between agents or with a critic.
    ids = [id(p) for a in names for p in tr.team.agent_parameters(a)]
    ids += [id(p) for u in tr.critic.units.values() for p in u.own_parameters()]
    assert len(ids) == len(set(ids))

    agents_before, critics_before = agent_snapshots(tr), critic_snapshots(tr)
    refs_before = {a: snapshot(tr.team._refs[a].parameters()) for a in names}
    out = tr.train()

    assert out.global_step == 2  # total_episodes 8 / batch 4
    assert_all_trained(tr, agents_before, critics_before)
    for a in names:  # reference policies are frozen
        assert not any(changed(refs_before[a], tr.team._refs[a].parameters()))
    # Agents sample and update independently: starting from the same weights, they end up different.
    first = tr.team.agent_parameters(names[0])
    for a in names[1:]:
        assert any(not torch.equal(p, q) for p, q in zip(first, tr.team.agent_parameters(a)))
    keys = ["objective/scores", "loss/policy_avg", "loss/value_avg"]
    keys += [f"{a}/objective/scores" for a in names] + [f"{a}/loss/policy_avg" for a in names]
    keys += [f"critic/{k}/loss" for k in expected_units]
    assert_finite_metrics(out.metrics, keys)


# ---------------------------------------------------------------------------------------------------------------
# heterogeneous team, one centralized critic
# ---------------------------------------------------------------------------------------------------------------


class _RecordingTokenizer:
    """Delegates to a tokenizer and records the texts it encodes."""

    def __init__(self, tok):
        self._tok = tok
        self.texts = []

    def __call__(self, text, *args, **kwargs):
        self.texts.extend([text] if isinstance(text, str) else text)  # one text or a batch of them
        return self._tok(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_heterogeneous_team_shares_one_centralized_critic(
    tmp_path, make_config, prompts_dataset, qwen_path, llama_path
):
    from transformers import AutoTokenizer

    args = make_config(tmp_path, agent_names=["qw", "ll"])
    tr = MultiAgentPPOTrainer(
        args=args, model=[qwen_path, llama_path], train_dataset=prompts_dataset, reward_funcs=varied_reward
    )
    tq, tl = tr.team.tokenizers["qw"], tr.team.tokenizers["ll"]
    assert tq.get_vocab() != tl.get_vocab()
    assert type(tr.team.policies["qw"]).__name__.startswith("Qwen2") and type(
        tr.team.policies["ll"]
    ).__name__.startswith("Llama")
    assert list(tr.critic.units) == ["central"]
    unit = tr.critic.units["central"]
    # The critic (built from the first agent's folder) has its own tokenizer: the qwen one, not the llama one.
    assert unit.tokenizer.get_vocab() == AutoTokenizer.from_pretrained(qwen_path).get_vocab()

    roll = tr.rollout(rows_of(prompts_dataset))
    (cb,) = tr.critic.batches(roll)
    view = cb.views[0]
    assert view.startswith("[qw] ") and "\n\n[ll] " in view
    ids, mask = unit.pad(unit.tokenize([view]), "cpu")
    assert ids[0][mask[0].bool()].tolist() == tq(view, add_special_tokens=False)["input_ids"]
    assert ids[0][mask[0].bool()].tolist() != tl(view, add_special_tokens=False)["input_ids"]

    spy = _RecordingTokenizer(unit.tokenizer)
    unit.tokenizer = spy
    agents_before, critics_before = agent_snapshots(tr), critic_snapshots(tr)
    out = tr.train()
    assert_all_trained(tr, agents_before, critics_before)
    # During training the critic tokenized joint views (both agents' contexts) with its own tokenizer.
    assert spy.texts and all(t.startswith("[qw] ") and "\n\n[ll] " in t for t in spy.texts)
    assert_finite_metrics(out.metrics, ["qw/objective/scores", "ll/objective/scores", "critic/central/loss"])


# ---------------------------------------------------------------------------------------------------------------
# shared-base LoRA team
# ---------------------------------------------------------------------------------------------------------------


def _lora():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


def _lora_trainer(tmp_path, make_config, ds, qwen_path, **cfg):
    args = make_config(tmp_path, num_agents=2, **cfg)
    return MultiAgentPPOTrainer(
        args=args, model=qwen_path, peft_config=_lora(), train_dataset=ds, reward_funcs=varied_reward
    )


def _base_params(team):
    return {n: p for n, p in team.shared_base.named_parameters() if "lora_" not in n}


@pytest.mark.parametrize("critic_type", ["centralized", "decentralized"])
def test_shared_base_lora_team_trains_adapters_only(tmp_path, make_config, prompts_dataset, qwen_path, critic_type):
    from transformers import AutoModelForCausalLM

    tr = _lora_trainer(tmp_path, make_config, prompts_dataset, qwen_path, critic_type=critic_type)
    team = tr.team
    assert team.layout == "shared_base" and not hasattr(team, "policies")
    assert team.model_of("agent_0") is team.model_of("agent_1")
    assert all(r is None for r in team._refs.values())  # the base with adapters off is the reference, no copies
    units = tr.critic.units
    assert sorted(units) == (["central"] if critic_type == "centralized" else ["agent_0", "agent_1"])
    for unit in units.values():
        assert unit.placement == "shared_base_adapter" and not hasattr(unit, "value_model")
        assert len(unit.own_parameters()) > 2  # head weight+bias, then the critic adapter's LoRA tensors
    # Exactly one copy of the base weights in the whole trainable module tree.
    base_numel = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(qwen_path).parameters())
    tree_non_lora = sum(p.numel() for n, p in tr.model.named_parameters() if "lora_" not in n and "summary" not in n)
    assert tree_non_lora == base_numel
    base = _base_params(team)
    assert base and not any(p.requires_grad for p in base.values())

    base_before = {n: p.detach().clone() for n, p in base.items()}
    agents_before = agent_snapshots(tr)
    heads_before = {k: snapshot(u.head.parameters()) for k, u in units.items()}
    adapters_before = {k: snapshot(u.own_parameters()[2:]) for k, u in units.items()}
    tr.train()

    assert all(torch.equal(base_before[n], p) for n, p in _base_params(team).items()), "the frozen base changed"
    for a, before in agents_before.items():
        params = team.agent_parameters(a)
        assert all(f".{a}." in n for n, p in team.shared_base.named_parameters() if any(p is q for q in params))
        assert any(changed(before, params)), f"agent {a}'s LoRA did not change"
        # lora_B starts at zero and receives a gradient at the first step; it must have moved.
        lora_b = [p for n, p in team.shared_base.named_parameters() if f"lora_B.{a}." in n]
        assert lora_b and all(p.abs().sum() > 0 for p in lora_b)
    for k, unit in units.items():
        assert all(changed(heads_before[k], unit.head.parameters())), f"critic {k}'s head did not change"
        assert any(changed(adapters_before[k], unit.own_parameters()[2:])), f"critic {k}'s adapter did not change"


def test_shared_base_lora_saved_adapters_reload_with_same_logits(tmp_path, make_config, prompts_dataset, qwen_path):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    tr = _lora_trainer(tmp_path, make_config, prompts_dataset, qwen_path)
    tr.train()
    out_dir = tmp_path / "saved"
    tr.save_model(str(out_dir))
    desc = json.loads((out_dir / "team.json").read_text())
    assert desc["agents"] == ["agent_0", "agent_1"] and desc["layout"] == "shared_base"

    tok = tr.team.tokenizers["agent_0"]
    ids = torch.tensor([tok("the team writes the plan and checks the code", add_special_tokens=False)["input_ids"]])
    base_model = tr.team.shared_base
    base_model.eval()
    in_memory = {}
    with torch.no_grad():
        for a in tr.team.names:
            with tr.team.active(a) as m:
                in_memory[a] = m(input_ids=ids).logits
        with base_model.disable_adapter():
            plain = base_model(input_ids=ids).logits
    for a in tr.team.names:
        folder = out_dir / a
        assert (folder / "adapter_config.json").is_file() and (folder / "adapter_model.safetensors").is_file()
        reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(qwen_path), str(folder)).eval()
        with torch.no_grad():
            logits = reloaded(input_ids=ids).logits
        torch.testing.assert_close(logits, in_memory[a], atol=1e-5, rtol=0)
        assert (logits - plain).abs().max() > 1e-5, "the saved adapter has no effect"
    assert (in_memory["agent_0"] - in_memory["agent_1"]).abs().max() > 1e-5, "both agents have the same adapter"

    # The critic: its adapter and its value head are saved next to each other.
    unit = tr.critic.units["central"]
    head = load_file(str(out_dir / "critic" / "value_head.safetensors"))
    for k, v in unit.head.state_dict().items():
        assert torch.equal(head[k], v)
    assert (out_dir / "critic" / "adapter_config.json").is_file()


def test_shared_base_mixed_adapter_generation_matches_per_adapter(tmp_path, make_config, prompts_dataset, qwen_path):
    tr = _lora_trainer(tmp_path, make_config, prompts_dataset, qwen_path)
    team = tr.team
    # Make the two adapters clearly different (trained adapters barely move in a test-sized run).
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in team.shared_base.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 2.0)
    team.shared_base.eval()
    prompts = ["count one and", "the team writes the plan and", "two plus three is"]  # different lengths
    sampler = tr.sampler_for_step(greedy=True)
    kwargs = sampler.settings.generate_kwargs(team.pad_id(team.names[0]))
    assert kwargs["do_sample"] is False
    joint = sampler({a: prompts for a in team.names})
    texts = {}
    for a in team.names:
        alone = sampler({a: prompts})[a]
        # Reference: PEFT with only this adapter active and no per-row routing.
        ids, mask = team.encode(a, prompts, "cpu")
        with team.active(a) as m:
            direct = m.generate(input_ids=ids, attention_mask=mask, **kwargs)[:, ids.shape[1] :]
        g = joint[a]
        assert torch.equal(g.query_ids, alone.query_ids)
        width = g.response_ids.shape[1]
        assert torch.equal(g.response_ids, alone.response_ids)
        assert g.texts == alone.texts
        direct = torch.nn.functional.pad(direct, (0, width - direct.shape[1]), value=kwargs["pad_token_id"])[:, :width]
        assert torch.equal(g.response_ids[g.response_mask], direct[g.response_mask])
        texts[a] = g.texts
    assert texts["agent_0"] != texts["agent_1"], "adapters generate the same text; the comparison above has no power"


# ---------------------------------------------------------------------------------------------------------------
# per-agent reward vectors
# ---------------------------------------------------------------------------------------------------------------


def test_per_agent_reward_vectors(tmp_path, make_config, prompts_dataset, qwen_path):
    def lengths(prompts, completions, **kwargs):
        return [[float(len(c[0])), -float(len(c[1]))] for c in completions]

    args = make_config(tmp_path, num_agents=2, reward_type="per_agent")
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=lengths)
    roll = tr.rollout(rows_of(prompts_dataset))
    turn = roll.turns[0]
    assert roll.rewards.shape == (4, 1, 2)
    for k, e in enumerate(turn["agent_0"].episode_ids.tolist()):
        assert roll.rewards[e, 0, 0] == len(turn["agent_0"].gen.texts[k])
        assert roll.rewards[e, 0, 1] == -len(turn["agent_1"].gen.texts[k])


def test_per_agent_scores_metrics(tmp_path, make_config, prompts_dataset, qwen_path):
    def constant(prompts, completions, **kwargs):
        return [[1.0, 0.0] for _ in completions]

    args = make_config(tmp_path, num_agents=2)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=constant)
    roll = tr.rollout(rows_of(prompts_dataset))
    assert torch.equal(roll.rewards[..., 0], torch.ones(4, 1)) and torch.equal(roll.rewards[..., 1], torch.zeros(4, 1))
    out = tr.train()
    for m in tr._metrics_history:
        assert m["agent_0/objective/scores"] == pytest.approx(1.0)
        assert m["agent_1/objective/scores"] == pytest.approx(0.0)
        assert m["objective/scores"] == pytest.approx(0.5)  # mean over episodes and agents
    assert len(tr._metrics_history) == out.global_step == 2


# ---------------------------------------------------------------------------------------------------------------
# multi-turn episodes, early termination
# ---------------------------------------------------------------------------------------------------------------


class ScriptedEnv(MultiAgentEnv):
    """Turn t (1-based) pays [1.0, 0.2] (mean 0.6) if t == row["stop"], else [1.0, 0.0] (mean 0.5: not above a 0.5
    threshold); the env itself ends the episode after row["done_at"] turns. Every step is logged in a class list."""

    calls: list = []

    def reset(self, row):
        self.row, self.t = row, 0
        return [f"{row['prompt']} a", f"{row['prompt']} b"]

    def step(self, completions):
        assert len(completions) == 2
        self.t += 1
        ScriptedEnv.calls.append((self.row["prompt"], self.t))
        reward = [1.0, 0.2] if self.t == self.row["stop"] else [1.0, 0.0]
        return StepResult(
            reward=reward, observations=[f"turn {self.t} a", f"turn {self.t} b"], done=self.t >= self.row["done_at"]
        )


# (stop, done_at) -> turns played with num_turns=3 and threshold 0.5
EPISODES = [
    (1, 9, 1),  # early termination after turn 1
    (2, 9, 2),  # early termination after turn 2
    (9, 9, 3),  # runs to num_turns
    (9, 2, 2),  # env says done after turn 2
    (9, 1, 1),  # env says done after turn 1
    (3, 9, 3),  # threshold crossed at the last turn
]


def _scripted_dataset(episodes):
    return Dataset.from_dict(
        {
            "prompt": [f"episode {i}" for i in range(len(episodes))],
            "stop": [s for s, _, _ in episodes],
            "done_at": [d for _, d, _ in episodes],
        }
    )


def test_multiturn_early_termination_and_done(tmp_path, make_config, qwen_path):
    ds = _scripted_dataset(EPISODES)
    args = make_config(tmp_path, num_agents=2, num_turns=3, early_termination_threshold=0.5)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=ds, env=ScriptedEnv())
    ScriptedEnv.calls = []
    roll = tr.rollout([ds[i] for i in range(len(ds))])
    expected_turns = [t for _, _, t in EPISODES]
    expected_mask = torch.tensor([[t < n for t in range(3)] for n in expected_turns])
    assert torch.equal(roll.turn_mask, expected_mask)
    # The env was never stepped past the end of an episode.
    steps = {f"episode {i}": 0 for i in range(len(EPISODES))}
    for prompt, _ in ScriptedEnv.calls:
        steps[prompt] += 1
    assert list(steps.values()) == expected_turns
    # Rewards of played turns are the scripted ones; unplayed turns hold zeros.
    for e, (stop, _, n) in enumerate(EPISODES):
        for t in range(3):
            want = ([1.0, 0.2] if t + 1 == stop else [1.0, 0.0]) if t < n else [0.0, 0.0]
            assert roll.rewards[e, t].tolist() == pytest.approx(want)
    # Each turn lists the episodes still running, and the agents are prompted with the env's next observations.
    for t, turn in enumerate(roll.turns):
        assert turn["agent_0"].episode_ids.tolist() == [e for e, n in enumerate(expected_turns) if t < n]
        if t > 0:
            assert all(c == f"turn {t} b" for c in turn["agent_1"].contexts)


def test_multiturn_train(tmp_path, make_config, qwen_path):
    episodes = EPISODES[:4]  # one rollout batch = the whole dataset: turns 1, 2, 3, 2
    ds = _scripted_dataset(episodes)
    args = make_config(tmp_path, num_agents=2, num_turns=3, early_termination_threshold=0.5)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=ds, env=ScriptedEnv())
    agents_before, critics_before = agent_snapshots(tr), critic_snapshots(tr)
    out = tr.train()
    assert out.global_step == 2
    assert_all_trained(tr, agents_before, critics_before)
    for m in tr._metrics_history:
        assert m["objective/turns"] == pytest.approx(2.0)
        assert m["agent_0/objective/scores"] == pytest.approx(2.0)  # 1.0 per played turn
        assert m["agent_1/objective/scores"] == pytest.approx(0.2 * 2 / 4)  # two episodes crossed the threshold


# ---------------------------------------------------------------------------------------------------------------
# saving
# ---------------------------------------------------------------------------------------------------------------


def _assert_same_weights(loaded, trained):
    a, b = loaded.state_dict(), trained.state_dict()
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k].detach()), k


@pytest.mark.parametrize("critic_type", ["centralized", "decentralized"])
def test_save_and_reload_separate_team(tmp_path, make_config, prompts_dataset, qwen_path, critic_type):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    args = make_config(tmp_path, num_agents=2, critic_type=critic_type)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=varied_reward)
    initial = AutoModelForCausalLM.from_pretrained(qwen_path)
    tr.train()
    out_dir = tmp_path / "saved"
    tr.save_model(str(out_dir))

    desc = json.loads((out_dir / "team.json").read_text())
    assert desc["agents"] == ["agent_0", "agent_1"]
    assert desc["agent_folders"] == {"agent_0": "agent_0", "agent_1": "agent_1"}
    assert desc["critic"]["type"] == critic_type
    for a in tr.team.names:
        loaded = AutoModelForCausalLM.from_pretrained(out_dir / a)
        _assert_same_weights(loaded, tr.team.policies[a])
        assert not torch.equal(loaded.lm_head.weight, initial.lm_head.weight)  # the trained weights, not the start
        assert AutoTokenizer.from_pretrained(out_dir / a).get_vocab() == tr.team.tokenizers[a].get_vocab()
    if critic_type == "centralized":
        assert desc["critic"]["units"]["central"]["folder"] == "critic"
        critic = AutoModelForSequenceClassification.from_pretrained(out_dir / "critic")
        assert critic.config.num_labels == 2  # per_agent_heads: one value per agent
        _assert_same_weights(critic, tr.critic.units["central"].value_model)
    else:  # one critic per agent, in critic/<agent>/
        for a in tr.team.names:
            assert desc["critic"]["units"][a]["folder"] == os.path.join("critic", a)
            critic = AutoModelForSequenceClassification.from_pretrained(out_dir / "critic" / a)
            assert critic.config.num_labels == 1
            _assert_same_weights(critic, tr.critic.units[a].value_model)
    assert not os.path.exists(out_dir / "config.json")  # a team has no root model


def test_save_single_agent_like_trl_ppo(tmp_path, make_config, prompts_dataset, qwen_path):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    args = make_config(tmp_path)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=varied_reward)
    assert tr.team.names == ["policy"]
    tr.train()
    out_dir = tmp_path / "saved"
    tr.save_model(str(out_dir))
    assert (out_dir / "config.json").is_file() and (out_dir / "model.safetensors").is_file()
    _assert_same_weights(AutoModelForCausalLM.from_pretrained(out_dir), tr.team.policies["policy"])
    _assert_same_weights(
        AutoModelForSequenceClassification.from_pretrained(out_dir / "critic"), tr.critic.units["central"].value_model
    )
    assert json.loads((out_dir / "team.json").read_text())["agent_folders"] == {"policy": "."}


# ---------------------------------------------------------------------------------------------------------------
# preset and token-level advantages
# ---------------------------------------------------------------------------------------------------------------


class TwoTurnEnv(MultiAgentEnv):
    def reset(self, row):
        self.t = 0
        return [row["prompt"] + " a", row["prompt"] + " b"]

    def step(self, completions):
        self.t += 1
        return StepResult(
            reward=float(len(completions[0]) % 3),
            observations=[f"turn {self.t} a", f"turn {self.t} b"],
            done=self.t >= 2,
        )


def test_collm_preset_multiturn(tmp_path, make_config, prompts_dataset, qwen_path):
    args = make_config(tmp_path, num_agents=2, num_turns=2, preset="collm")
    assert args.policy_loss_type == "reinforce" and args.num_ppo_epochs == 1 and args.lam == 0.0
    assert args.learning_rate == 5e-6 and args.critic_updates == "per_agent"
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, env=TwoTurnEnv())
    agents_before, critics_before = agent_snapshots(tr), critic_snapshots(tr)
    out = tr.train()
    assert out.global_step == 2
    assert_all_trained(tr, agents_before, critics_before)
    assert out.metrics["objective/turns"] == pytest.approx(2.0)
    assert_finite_metrics(
        out.metrics, ["loss/policy_avg", "loss/value_avg", "agent_0/objective/scores", "agent_1/objective/scores"]
    )


def test_token_level_advantages_dc(tmp_path, make_config, prompts_dataset, qwen_path):
    args = make_config(tmp_path, num_agents=2, critic_type="decentralized", advantage_level="token")
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=varied_reward)
    roll = tr.rollout(rows_of(prompts_dataset))
    scored = tr.score_rollout(roll)
    cbs = scored.critic_batches
    for a in tr.team.names:
        at = scored.turns[0][a]
        assert at.advantages.shape == at.gen.response_ids.shape  # one advantage per response token
        assert torch.all(at.advantages[~at.gen.response_mask] == 0)
    # PPO's targets for each critic batch, paired by index, in its own record (the critic's batch holds none)
    for cb, target in zip(cbs, scored.advantages.targets, strict=True):
        assert target.old_values.shape == target.mask.shape == roll.turns[0][cb.key].gen.response_ids.shape
        assert not hasattr(cb, "old_values") and not hasattr(cb, "returns")
    agents_before, critics_before = agent_snapshots(tr), critic_snapshots(tr)
    out = tr.train()
    assert_all_trained(tr, agents_before, critics_before)
    assert_finite_metrics(
        out.metrics, ["loss/policy_avg", "loss/value_avg", "critic/agent_0/loss", "critic/agent_1/loss"]
    )


# ---------------------------------------------------------------------------------------------------------------
# The deferred old-log-prob pass (one epoch, one minibatch) gives the same training as the scoring pass
# ---------------------------------------------------------------------------------------------------------------


def assert_same_snapshots(got: dict, want: dict):
    """Two runs' parameter snapshots (agent_snapshots / critic_snapshots) equal up to float rounding."""
    assert got.keys() == want.keys()
    for key in got:
        for x, y in zip(got[key], want[key]):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(preset="collm", critic_type="centralized"),  # REINFORCE rule, per-agent schedule
        dict(critic_type="decentralized", num_ppo_epochs=1, policy_loss_type="ppo", kl_coef=0.0),  # PPO clip, joint
    ],
)
def test_deferred_old_logprobs_match_the_scoring_pass(tmp_path, make_config, prompts_dataset, qwen_path, overrides):
    """Skipping the scoring forward must not change a single update: same weights and the same logged metrics as a
    run forced through the scoring pass (`old_logprobs_from_update=False`, and not from the sampler either), and
    the trainer really took the short path."""
    runs = []
    for force in (False, True):
        # Both runs forward the whole prompt in the update, so that the only difference is where the old log-probs
        # come from (the kept prefill's own equivalence, by rounding only: tests/test_prompt_cache.py).
        switches = dict(old_logprobs_from_update=not force, old_logprobs_from_sampler=False)
        switches["reuse_rollout_prefill"] = False
        args = make_config(tmp_path / str(force), learning_rate=1e-2, **overrides, **switches)
        trainer = MultiAgentPPOTrainer(
            args=args, model=[qwen_path, qwen_path], train_dataset=prompts_dataset, reward_funcs=varied_reward
        )
        assert trainer.plan_iteration(4).old_logprobs_from_update.on is (not force)
        before = agent_snapshots(trainer), critic_snapshots(trainer)
        calls = []
        original = trainer.team.logprobs
        trainer.team.logprobs = lambda *a, **k: calls.append(torch.is_grad_enabled()) or original(*a, **k)
        trainer.train()
        logged = [h for h in trainer.state.log_history if "objective/entropy" in h]
        assert_all_trained(trainer, *before)  # the comparison below is between runs that really learned
        runs.append((agent_snapshots(trainer), critic_snapshots(trainer), logged, calls))
    (agents_d, critics_d, logs_d, calls_d), (agents_s, critics_s, logs_s, calls_s) = runs
    # 2 iterations x 2 agents: the short path makes only the update's forwards (with grad); the long one twice as many.
    assert calls_d == [True] * 4 and len(calls_s) == 8 and calls_s.count(False) == 4
    assert_same_snapshots(agents_d, agents_s)
    assert_same_snapshots(critics_d, critics_s)
    assert len(logs_d) == len(logs_s) == 2
    for hd, hs in zip(logs_d, logs_s):
        for key in ("objective/entropy", "policy/approxkl_avg", "val/ratio", "loss/policy_avg", "objective/scores"):
            assert hd[key] == pytest.approx(hs[key], rel=1e-4, abs=1e-6), key
    assert logs_d[0]["objective/entropy"] > 0


@pytest.mark.parametrize(
    "overrides",
    [
        dict(critic_type="centralized"),  # chunks of 2 of the 4 episodes (the default)
        dict(critic_type="centralized", value_micro_batch_size=1),
        dict(critic_type="centralized", value_micro_batch_size=4),  # the whole batch in one chunk
        dict(critic_type="decentralized"),  # two critic batches (one per agent) in each chunk
        # 2 turns: a chunk's turn-0 targets read its turn-1 values, and the update's 8 pairs run in two micro-batches
        dict(critic_type="centralized", num_turns=2),
        dict(critic_type="decentralized", num_turns=2, value_micro_batch_size=3),
        # some episodes end after their first turn: the turn-1 batch holds only the others
        dict(critic_type="centralized", num_turns=2, ragged=True),
    ],
)
def test_the_critic_step_while_scoring_matches_the_scoring_pass(
    tmp_path, make_config, prompts_dataset, qwen_path, overrides
):
    """Backpropagating the critic's value loss while scoring, chunk by chunk of episodes (`reuse_value_forward`),
    must not change a single update: the same weights and logged metrics as a run forced through the scoring pass's
    critic forward and the update's own value losses; and the short path really ran: every view valued once, with
    gradients, in chunks of value_micro_batch_size episodes (the long path: every view twice, once without).
    Plain SGD: Adam would hide a gradient's wrong scale (the critic's adapter is moved by its value loss alone)."""
    runs = []
    overrides = dict(overrides)
    ragged = overrides.pop("ragged", False)
    two_turns = overrides.get("num_turns") == 2
    for force in (False, True):
        args = make_config(
            tmp_path / str(force),
            optim="sgd",
            learning_rate=0.1,
            num_ppo_epochs=1,
            kl_coef=0.0,
            policy_loss_type="ppo",
            reuse_value_forward=not force,
            **overrides,
        )
        env = RaggedTwoTurnEnv() if ragged else TwoTurnEnv()
        source = dict(env=env) if two_turns else dict(reward_funcs=varied_reward)
        trainer = MultiAgentPPOTrainer(args=args, model=[qwen_path, qwen_path], train_dataset=prompts_dataset, **source)
        assert trainer.plan_iteration(4 * args.num_turns).reuse_value_forward.on is not force
        before = agent_snapshots(trainer), critic_snapshots(trainer)
        calls = []  # (with gradients, episodes valued) per critic forward
        original = trainer.critic.values

        def counted(cb, device, rows=None, original=original, calls=calls):
            picked = cb.episode_ids if rows is None else cb.episode_ids[rows]
            calls.append((torch.is_grad_enabled(), sorted(picked.tolist())))
            return original(cb, device, rows)

        trainer.critic.values = counted
        trainer.train()
        logged = [h for h in trainer.state.log_history if "loss/value_avg" in h]
        assert_all_trained(trainer, *before)
        runs.append((agent_snapshots(trainer), critic_snapshots(trainer), logged, calls, before[1]))
    (agents_d, critics_d, logs_d, calls_d, critics_before), (agents_s, critics_s, logs_s, calls_s, _) = runs
    views = 2 * 4 * (1 + two_turns) * (2 if overrides["critic_type"] == "decentralized" else 1)  # 2 iterations
    if ragged:  # some episodes ended after one turn: fewer views than turns x episodes (the test's point)
        views = sum(len(eps) for grad, eps in calls_s if not grad)
        assert 2 * 4 < views < 2 * 4 * 2
    assert all(grad for grad, _ in calls_d)  # the short path: only forwards with gradients
    assert sum(len(eps) for _, eps in calls_d) == views  # each view once
    chunk = overrides.get("value_micro_batch_size", 2)
    assert max(len(set(eps)) for _, eps in calls_d) == min(chunk, 4)  # no forward reads more than one chunk
    assert sum(len(eps) for grad, eps in calls_s if not grad) == views  # the long path: a scoring forward ...
    assert sum(len(eps) for grad, eps in calls_s if grad) == views  # ... and the update's own
    assert_same_snapshots(agents_d, agents_s)
    assert_same_snapshots(critics_d, critics_s)
    moved = max(float((x - y).abs().max()) for k in critics_d for x, y in zip(critics_d[k], critics_before[k]))
    assert moved > 1e-3  # far above the comparison's tolerance: a wrong weight on the value loss would show
    assert len(logs_d) == len(logs_s) >= 1
    keys = ("loss/value_avg", "loss/policy_avg", "critic/value_mean", "critic/advantage_std", "val/clipfrac_avg")
    for hd, hs in zip(logs_d, logs_s):
        for key in keys:
            if two_turns and key in ("loss/value_avg", "val/clipfrac_avg"):
                continue  # the long path logs the mean of its two micro-batches' means, the short path the batch's
            assert hd[key] == pytest.approx(hs[key], rel=1e-4, abs=1e-6), key


class RaggedTwoTurnEnv(TwoTurnEnv):
    """TwoTurnEnv whose episodes end after one turn when the first agent's text has an even length."""

    def step(self, completions):
        result = super().step(completions)
        if self.t == 1 and len(completions[0]) % 2 == 0:
            return StepResult(reward=result.reward, observations=result.observations, done=True)
        return result


def test_a_nonfinite_critic_loss_while_scoring_drops_the_step(tmp_path, make_config, prompts_dataset, qwen_path):
    """A non-finite value loss backpropagated while scoring (`reuse_value_forward`) drops the iteration's step as a
    non-finite update loss does: no weight moves on it (the critic's gradients included), the counter says so, and
    the next iteration trains."""
    args = make_config(tmp_path, num_agents=2, total_episodes=12, num_ppo_epochs=1, kl_coef=0.0)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=varied_reward)
    assert tr.plan_iteration(4).reuse_value_forward.on
    original, calls = tr._value_loss, []

    def poisoned(*a, **k):
        loss, clipfrac = original(*a, **k)
        calls.append(k.get("values") is not None)  # values given: the scoring pass's loss
        return (loss * float("nan") if len(calls) == 1 else loss), clipfrac

    tr._value_loss = poisoned
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters() if p.requires_grad}
    first = {}
    tr.add_callback(_SnapshotAfterFirstStep(tr, first))
    tr.train()
    assert calls and all(calls)  # every value loss came from the scoring pass
    hist = tr._metrics_history
    assert hist[0]["train/nonfinite_steps_skipped"] == 1
    assert all(m["train/nonfinite_steps_skipped"] == 0 for m in hist[1:])
    assert all(torch.equal(first[n], before[n]) for n in before), "the poisoned iteration moved a weight"
    changed = [n for n, p in tr.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert any(n for n in changed if "critic" in n) and len(changed) > 1, "the later iterations must still train"


class _SnapshotAfterFirstStep(TrainerCallback):
    def __init__(self, trainer, into: dict):
        self.trainer, self.into = trainer, into

    def on_step_end(self, args, state, control, **kwargs):
        if not self.into:
            self.into.update(
                {n: p.detach().clone() for n, p in self.trainer.model.named_parameters() if p.requires_grad}
            )


def test_values_are_scored_up_front_when_the_update_cannot_give_them(tmp_path, make_config, prompts_dataset, qwen_path):
    """Several epochs or minibatches, the per-agent schedule, token-level advantages, value normalisation or
    activation checkpointing: the scoring pass computes the values without gradients, even when the training
    iteration asks for the critic's step there."""
    cases = [
        dict(num_ppo_epochs=2),
        dict(num_ppo_epochs=1, num_mini_batches=2),
        dict(num_ppo_epochs=1, critic_updates="per_agent"),
        dict(num_ppo_epochs=1, advantage_level="token"),
        dict(num_ppo_epochs=1, value_normalization=True),
        dict(num_ppo_epochs=1, activation_checkpointing=True),
    ]
    for i, overrides in enumerate(cases):
        args = make_config(tmp_path / str(i), **overrides)
        trainer = MultiAgentPPOTrainer(
            args=args, model=[qwen_path, qwen_path], train_dataset=prompts_dataset, reward_funcs=varied_reward
        )
        roll = trainer.rollout(list(prompts_dataset)[:4])
        assert trainer.plan_iteration(4).reuse_value_forward.on is False, overrides
        trainer.create_optimizer()
        scored = trainer.score_rollout(roll, critic_step=True)
        assert scored.critic_step is None, overrides
        assert all(p.grad is None for p in trainer.model.parameters()), overrides


def test_old_logprob_pass_is_kept_when_weights_move_before_the_agents_forward(
    tmp_path, make_config, prompts_dataset, qwen_path
):
    """Several epochs, or a centralized critic head on an actor's backbone under the per-agent schedule (agent 1's
    critic step moves agent 2's backbone first), need the scoring pass."""
    cases = [
        dict(num_ppo_epochs=2),
        dict(num_ppo_epochs=1, num_mini_batches=2),
        dict(preset="collm", critic_placement="actor_head", critic_backbone_agent="player_2"),
    ]
    for i, overrides in enumerate(cases):
        args = make_config(tmp_path / str(i), agent_names=["player_1", "player_2"], **overrides)
        trainer = MultiAgentPPOTrainer(
            args=args, model=[qwen_path, qwen_path], train_dataset=prompts_dataset, reward_funcs=varied_reward
        )
        assert trainer.plan_iteration(4).old_logprobs_from_update.on is False, overrides
