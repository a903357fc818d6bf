"""Trainer features beyond the core loop: evaluate, generate_completions, a TRL-PPO-style single agent with a reward
model / value model / reference model on token-id prompts, value normalisation, per-module learning rates."""

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from trl_collm import MultiAgentEnv, MultiAgentPPOTrainer, StepResult


class CountingEnv(MultiAgentEnv):
    """Reward 1.0 per turn for agent_0, 0.0 for agent_1, over 2 turns: returns are known exactly."""

    def reset(self, row):
        self.t = 0
        return [row["prompt"] + " A", row["prompt"] + " B"]

    def step(self, completions):
        self.t += 1
        return StepResult(reward=[1.0, 0.0], observations=["next A", "next B"], done=self.t >= 2)


def test_evaluate_reports_exact_returns(tmp_path, qwen_path, prompts_dataset, make_config):
    args = make_config(tmp_path, num_agents=2, num_turns=2, per_device_eval_batch_size=3)
    trainer = MultiAgentPPOTrainer(
        args=args,
        model=qwen_path,
        train_dataset=prompts_dataset,
        eval_dataset=prompts_dataset.select(range(5)),
        env=CountingEnv(),
    )
    metrics = trainer.evaluate()
    assert metrics["eval_agent_0/return"] == 2.0
    assert metrics["eval_agent_1/return"] == 0.0
    assert metrics["eval_return"] == 1.0
    assert metrics["eval_turns"] == 2.0


def test_generate_completions_returns_every_agent_and_turn(tmp_path, qwen_path, prompts_dataset, make_config, capsys):
    args = make_config(tmp_path, agent_names=["ann", "ben"], num_turns=2)
    trainer = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, env=CountingEnv())
    table = trainer.generate_completions(num_rows=3)
    assert len(table) == 6  # 3 episodes x 2 turns
    assert {e["turn"] for e in table} == {0, 1}
    assert all(e["ann/prompt"].endswith("A") or e["ann/prompt"] == "next A" for e in table)
    assert all(isinstance(e["ben/completion"], str) for e in table)
    assert "episode 0 turn 1" in capsys.readouterr().out


def test_trl_ppo_shape_single_agent_with_reward_value_and_ref_models(tmp_path, qwen_path, make_config):
    """TRL's PPO example: token-id prompts, reward/value models as sequence classifiers, an explicit ref policy."""
    tok = AutoTokenizer.from_pretrained(qwen_path)
    policy = AutoModelForCausalLM.from_pretrained(qwen_path)
    ref = AutoModelForCausalLM.from_pretrained(qwen_path)
    value = AutoModelForSequenceClassification.from_pretrained(qwen_path, num_labels=1)
    reward = AutoModelForSequenceClassification.from_pretrained(qwen_path, num_labels=1)
    value.config.pad_token_id = reward.config.pad_token_id = tok.pad_token_id
    ids = [tok(p)["input_ids"] for p in ["one two", "three four five", "red wool", "the plan"]]
    dataset = Dataset.from_dict({"input_ids": ids})
    args = make_config(tmp_path, missing_eos_penalty=1.0)
    policy_before = [p.clone() for p in policy.parameters()]
    ref_before = [p.clone() for p in ref.parameters()]
    trainer = MultiAgentPPOTrainer(args, tok, policy, ref, reward, dataset, value)
    assert args.advantage_level == "token"  # one agent: TRL's per-token semantics
    trainer.train()
    history = trainer._metrics_history
    for key in [
        "objective/kl",
        "objective/entropy",
        "objective/non_score_reward",
        "objective/rlhf_reward",
        "objective/scores",
        "policy/approxkl_avg",
        "policy/clipfrac_avg",
        "loss/policy_avg",
        "loss/value_avg",
        "val/clipfrac_avg",
        "policy/entropy_avg",
        "val/ratio",
        "val/ratio_var",
        "val/num_eos_tokens",
        "lr",
        "episode",
        "eps",
    ]:
        assert key in history[-1], key
    assert any(not torch.equal(a, b) for a, b in zip(policy_before, policy.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(ref_before, ref.parameters()))
    # the rollout prompts are the dataset's token ids, unchanged
    roll = trainer.rollout([dataset[0]])
    g = roll.turns[0]["policy"].gen
    assert g.query_ids[0][g.query_mask[0].bool()].tolist() == ids[0]
    # the rollout reward is the reward model's score of this prompt + completion (EOS penalty comes later, in scoring)
    from trl_collm import RewardModelFunction

    expected = RewardModelFunction(reward, tok)(prompts=[[ids[0]]], completions=[[g.texts[0]]])[0]
    assert abs(float(roll.rewards[0, 0, 0]) - expected) < 1e-5


def test_value_normalisation_tracks_returns(tmp_path, qwen_path, prompts_dataset, make_config):
    args = make_config(tmp_path, num_agents=2, num_turns=2, value_normalization=True)
    trainer = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, env=CountingEnv())
    trainer.train()
    rms = trainer.value_rms
    # returns with gamma=1: agent_0 gets 2 then 1, agent_1 gets 0 and 0 -> running mean near 0.75 (+ the init count)
    assert 0.6 < rms.mean < 0.8
    assert rms.var > 0.3


def test_param_groups_carry_agent_and_critic_learning_rates(tmp_path, qwen_path, prompts_dataset, make_config):
    args = make_config(tmp_path, agent_names=["a", "b"], learning_rate=1e-3, critic_learning_rate=5e-4)
    trainer = MultiAgentPPOTrainer(
        args=args,
        model=qwen_path,
        train_dataset=prompts_dataset,
        reward_funcs=lambda prompts, completions, **k: [1.0] * len(prompts),
    )
    groups = {g["name"]: g for g in trainer.param_groups()}
    assert set(groups) == {"a", "b", "critic/central"}
    assert groups["a"]["lr"] == 1e-3 and groups["critic/central"]["lr"] == 5e-4
    ids = [{id(p) for p in g["params"]} for g in groups.values()]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2])  # disjoint: one optimizer, separate updates


def test_long_prompts_are_cut_to_the_context_with_a_warning(tmp_path, qwen_path, make_config):
    long_prompt = "the team writes the plan " * 40
    dataset = Dataset.from_dict({"prompt": [long_prompt] * 4})
    args = make_config(tmp_path, num_agents=2, max_prompt_length=12)
    trainer = MultiAgentPPOTrainer(
        args=args,
        model=qwen_path,
        train_dataset=dataset,
        reward_funcs=lambda prompts, completions, **k: [1.0] * len(prompts),
    )
    assert trainer.sampler.prompts.max_prompt_length == {"agent_0": 12, "agent_1": 12}
    # the critic is cut to its own context (2048 positions for the tiny model), not to max_prompt_length
    assert trainer.critic.units["central"].max_tokens == 2048
    with pytest.warns(UserWarning, match="keeping the last 12"):
        roll = trainer.rollout([dataset[0]])
    g = roll.turns[0]["agent_0"].gen
    assert g.query_ids.shape[1] == 12
    tok = trainer.team.tokenizers["agent_0"]
    assert tok.decode(g.query_ids[0]) == tok.decode(tok(long_prompt, add_special_tokens=False)["input_ids"][-12:])


def test_default_prompt_limit_leaves_room_for_the_response(tmp_path, qwen_path, prompts_dataset, make_config):
    args = make_config(tmp_path, num_agents=2, response_length=6)
    trainer = MultiAgentPPOTrainer(
        args=args,
        model=qwen_path,
        train_dataset=prompts_dataset,
        reward_funcs=lambda prompts, completions, **k: [1.0] * len(prompts),
    )
    assert trainer.sampler.prompts.limit("agent_0") == 2048 - 6


def test_model_init_kwargs_reach_from_pretrained(tmp_path, qwen_path, prompts_dataset, make_config):
    args = make_config(tmp_path, num_agents=2, model_init_kwargs='{"dtype": "bfloat16"}')
    assert args.model_init_kwargs == {"dtype": "bfloat16"}
    trainer = MultiAgentPPOTrainer(
        args=args,
        model=qwen_path,
        train_dataset=prompts_dataset,
        reward_funcs=lambda prompts, completions, **k: [1.0] * len(prompts),
    )
    assert trainer.team.policies["agent_0"].dtype == torch.bfloat16
    assert next(trainer.critic.units["central"].value_model.parameters()).dtype == torch.bfloat16


def test_mc_missing_eos_penalty_lowers_returns(tmp_path):
    import types

    from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer
    from trl_collm.rollout import SampleTree

    ended = [torch.tensor([True, False]), torch.tensor([False, False])]
    turn = {a: types.SimpleNamespace(gen=types.SimpleNamespace(ended=e)) for a, e in zip(["a", "b"], ended)}
    tree = SampleTree(
        ["a", "b"],
        [{}],
        [turn],
        [torch.ones(2, 2)],
        [torch.full((2,), -1)],
        [torch.zeros(2, dtype=torch.long)],
        [torch.zeros(2, dtype=torch.long)],
    )
    cfg = MultiAgentMCConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, missing_eos_penalty=0.5, baseline="none"
    )
    adv = MultiAgentMCTrainer.advantages(types.SimpleNamespace(args=cfg), tree).advantages
    # agent a: sample 0 ended (1.0), sample 1 did not (0.5); agent b: neither ended (0.5, 0.5)
    assert torch.allclose(adv[0], torch.tensor([[1.0, 0.5], [0.5, 0.5]]))
