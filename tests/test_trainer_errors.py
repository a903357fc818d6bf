"""Bad input fails early with a message that names the argument (or the user code) at fault."""

from __future__ import annotations

import math
import re

import pytest
from datasets import Dataset

from trl_collm import MultiAgentEnv, MultiAgentPPOTrainer, StepResult


def ok_reward(prompts, completions, **kwargs):
    return [1.0 for _ in completions]


def rows_of(ds, k=4):
    return [ds[i] for i in range(k)]


# ---------------------------------------------------------------------------------------------------------------
# agent-count mismatches at construction
# ---------------------------------------------------------------------------------------------------------------


def test_processing_class_list_of_wrong_length(tmp_path, make_config, prompts_dataset, qwen_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen_path)
    with pytest.raises(ValueError, match=re.escape("`processing_class` has 1 entries but the team has 2 agents")):
        MultiAgentPPOTrainer(
            args=make_config(tmp_path, num_agents=2),
            model=qwen_path,
            processing_class=[tok],
            train_dataset=prompts_dataset,
            reward_funcs=ok_reward,
        )
    with pytest.raises(ValueError, match=re.escape("`processing_class` has keys")):
        MultiAgentPPOTrainer(
            args=make_config(tmp_path, num_agents=2),
            model=qwen_path,
            processing_class={"agent_0": tok},
            train_dataset=prompts_dataset,
            reward_funcs=ok_reward,
        )


def test_model_list_vs_num_agents(tmp_path, make_config, prompts_dataset, qwen_path):
    with pytest.raises(ValueError, match=re.escape("`model` lists 2 models but `num_agents`=3")):
        MultiAgentPPOTrainer(
            args=make_config(tmp_path, num_agents=3),
            model=[qwen_path, qwen_path],
            train_dataset=prompts_dataset,
            reward_funcs=ok_reward,
        )
    with pytest.raises(ValueError, match=re.escape("`model` lists 2 models but `agent_names` has 3 names")):
        MultiAgentPPOTrainer(
            args=make_config(tmp_path, agent_names=["a", "b", "c"]),
            model=[qwen_path, qwen_path],
            train_dataset=prompts_dataset,
            reward_funcs=ok_reward,
        )


def test_value_model_list_length_for_dc(tmp_path, make_config, prompts_dataset, qwen_path):
    args = make_config(tmp_path, num_agents=2, critic_type="decentralized")
    with pytest.raises(ValueError, match=re.escape("`value_model` has 1 entries but the team has 2 agents")):
        MultiAgentPPOTrainer(
            args=args, model=qwen_path, value_model=[qwen_path], train_dataset=prompts_dataset, reward_funcs=ok_reward
        )
    with pytest.raises(ValueError, match=re.escape("`value_model` has 3 entries but the team has 2 agents")):
        MultiAgentPPOTrainer(
            args=args,
            model=qwen_path,
            value_model=[qwen_path] * 3,
            train_dataset=prompts_dataset,
            reward_funcs=ok_reward,
        )


def test_value_model_list_for_cc(tmp_path, make_config, prompts_dataset, qwen_path):
    args = make_config(tmp_path, num_agents=2)
    with pytest.raises(ValueError, match=re.escape("`value_model` lists 2")):
        MultiAgentPPOTrainer(
            args=args,
            model=qwen_path,
            value_model=[qwen_path] * 2,
            train_dataset=prompts_dataset,
            reward_funcs=ok_reward,
        )


def test_value_model_with_wrong_number_of_outputs(tmp_path, make_config, prompts_dataset, qwen_path):
    from transformers import AutoModelForSequenceClassification

    vm = AutoModelForSequenceClassification.from_pretrained(qwen_path, num_labels=1)  # CC per_agent_heads needs 2
    with pytest.raises(ValueError, match=re.escape("`value_model` for critic 'central' has 1 outputs")):
        MultiAgentPPOTrainer(
            args=make_config(tmp_path, num_agents=2),
            model=qwen_path,
            value_model=vm,
            train_dataset=prompts_dataset,
            reward_funcs=ok_reward,
        )


# ---------------------------------------------------------------------------------------------------------------
# rewards
# ---------------------------------------------------------------------------------------------------------------


def _trainer(tmp_path, make_config, ds, qwen_path, reward, **cfg):
    args = make_config(tmp_path, num_agents=2, **cfg)
    return MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=ds, reward_funcs=reward)


def test_reward_vector_of_wrong_length(tmp_path, make_config, prompts_dataset, qwen_path):
    def three(prompts, completions, **kwargs):
        return [[1.0, 2.0, 3.0] for _ in completions]

    tr = _trainer(tmp_path, make_config, prompts_dataset, qwen_path, three)  # only detected once rewards exist
    msg = re.escape("reward function 'three' returned 3 rewards for episode 0 but the team has 2 agents")
    with pytest.raises(ValueError, match=msg):
        tr.rollout(rows_of(prompts_dataset))
    with pytest.raises(ValueError, match=msg):
        tr.train()


def test_reward_list_of_wrong_length(tmp_path, make_config, prompts_dataset, qwen_path):
    def short(prompts, completions, **kwargs):
        return [1.0] * (len(completions) - 1)

    tr = _trainer(tmp_path, make_config, prompts_dataset, qwen_path, short)
    with pytest.raises(
        ValueError, match=re.escape("reward function 'short' returned 3 rewards but the batch has 4 episodes")
    ):
        tr.rollout(rows_of(prompts_dataset))


def test_per_agent_reward_rejected_when_joint(tmp_path, make_config, prompts_dataset, qwen_path):
    def vec(prompts, completions, **kwargs):
        return [[1.0, 0.0] for _ in completions]

    tr = _trainer(tmp_path, make_config, prompts_dataset, qwen_path, vec, reward_type="joint")
    with pytest.raises(ValueError, match=re.escape("reward_type='joint'")):
        tr.rollout(rows_of(prompts_dataset))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_rewards(tmp_path, make_config, prompts_dataset, qwen_path, bad):
    def nonfinite(prompts, completions, **kwargs):
        return [[1.0, bad] for _ in completions]

    tr = _trainer(tmp_path, make_config, prompts_dataset, qwen_path, nonfinite)
    with pytest.raises(ValueError, match=re.escape(f"reward function 'nonfinite' returned a non-finite reward {bad}")):
        tr.train()


def test_non_finite_env_reward(tmp_path, make_config, prompts_dataset, qwen_path):
    class NanEnv(MultiAgentEnv):
        def reset(self, row):
            return [row["prompt"], row["prompt"]]

        def step(self, completions):
            return StepResult(reward=float("nan"), done=True)

    tr = MultiAgentPPOTrainer(
        args=make_config(tmp_path, num_agents=2), model=qwen_path, train_dataset=prompts_dataset, env=NanEnv()
    )
    with pytest.raises(ValueError, match=re.escape("NanEnv.step returned a non-finite reward nan")):
        tr.rollout(rows_of(prompts_dataset))


def test_no_reward_source(tmp_path, make_config, prompts_dataset, qwen_path):
    with pytest.raises(ValueError, match="No reward"):
        MultiAgentPPOTrainer(args=make_config(tmp_path, num_agents=2), model=qwen_path, train_dataset=prompts_dataset)


def test_reward_weights_length(tmp_path, make_config, prompts_dataset, qwen_path):
    with pytest.raises(ValueError, match=re.escape("`reward_weights` has 2 entries for 1 reward functions")):
        _trainer(tmp_path, make_config, prompts_dataset, qwen_path, ok_reward, reward_weights=[1.0, 2.0])


def test_reward_funcs_cannot_drive_multiple_turns(tmp_path, make_config, prompts_dataset, qwen_path):
    with pytest.raises(ValueError, match=re.escape("`num_turns`=2 needs an `env`")):
        _trainer(tmp_path, make_config, prompts_dataset, qwen_path, ok_reward, num_turns=2)


# ---------------------------------------------------------------------------------------------------------------
# environments
# ---------------------------------------------------------------------------------------------------------------


class CountEnv(MultiAgentEnv):
    def __init__(self, reset_count=2, step_count=2):
        self.reset_count, self.step_count = reset_count, step_count

    def reset(self, row):
        return [row["prompt"]] * self.reset_count

    def step(self, completions):
        return StepResult(reward=1.0, observations=["next"] * self.step_count, done=False)


def test_env_reset_wrong_number_of_observations(tmp_path, make_config, prompts_dataset, qwen_path):
    args = make_config(tmp_path, num_agents=2, num_turns=2)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, env=CountEnv(reset_count=1))
    with pytest.raises(
        ValueError, match=re.escape("CountEnv.reset returned 1 observations for episode 0; the team has 2 agents")
    ):
        tr.rollout(rows_of(prompts_dataset))
    with pytest.raises(ValueError, match=re.escape("CountEnv.reset returned 1 observations")):
        tr.train()


def test_env_step_wrong_number_of_observations(tmp_path, make_config, prompts_dataset, qwen_path):
    args = make_config(tmp_path, num_agents=2, num_turns=2)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, env=CountEnv(step_count=3))
    with pytest.raises(
        ValueError, match=re.escape("CountEnv.step returned 3 observations for episode 0; the team has 2 agents")
    ):
        tr.rollout(rows_of(prompts_dataset))


def test_env_agent_names_must_match_team(tmp_path, make_config, prompts_dataset, qwen_path):
    env = CountEnv()
    env.agent_names = ["bob", "alice"]
    with pytest.raises(
        ValueError,
        match=re.escape("CountEnv.agent_names is ['bob', 'alice'] but the team's agents are ['alice', 'bob']"),
    ):
        MultiAgentPPOTrainer(
            args=make_config(tmp_path, agent_names=["alice", "bob"], num_turns=2),
            model=qwen_path,
            train_dataset=prompts_dataset,
            env=env,
        )


def test_env_and_reward_funcs_together(tmp_path, make_config, prompts_dataset, qwen_path):
    with pytest.raises(ValueError, match=re.escape("Pass either `env`")):
        MultiAgentPPOTrainer(
            args=make_config(tmp_path, num_agents=2),
            model=qwen_path,
            train_dataset=prompts_dataset,
            env=CountEnv(),
            reward_funcs=ok_reward,
        )


# ---------------------------------------------------------------------------------------------------------------
# tokenizers and datasets
# ---------------------------------------------------------------------------------------------------------------


def test_tokenizer_without_pad_token(tmp_path, make_config, prompts_dataset, qwen_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen_path)
    tok.pad_token = None
    assert tok.pad_token_id is None
    with pytest.raises(ValueError, match=re.escape("`processing_class` for agent 'agent_1' has no pad token")):
        MultiAgentPPOTrainer(
            args=make_config(tmp_path, num_agents=2),
            model=qwen_path,
            processing_class=[AutoTokenizer.from_pretrained(qwen_path), tok],
            train_dataset=prompts_dataset,
            reward_funcs=ok_reward,
        )


def test_empty_dataset(tmp_path, make_config, qwen_path):
    with pytest.raises(ValueError, match=re.escape("`train_dataset` is empty")):
        MultiAgentPPOTrainer(
            args=make_config(tmp_path, num_agents=2),
            model=qwen_path,
            train_dataset=Dataset.from_dict({"prompt": []}),
            reward_funcs=ok_reward,
        )


def test_dataset_smaller_than_a_batch(tmp_path, make_config, qwen_path):
    ds = Dataset.from_dict({"prompt": ["one", "two"]})
    tr = MultiAgentPPOTrainer(
        args=make_config(tmp_path, num_agents=2), model=qwen_path, train_dataset=ds, reward_funcs=ok_reward
    )
    with pytest.raises(
        ValueError, match=re.escape("`train_dataset` has 2 rows but one rollout batch takes local_batch_size=4")
    ):
        tr.train()


# ---------------------------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------------------------


def test_bad_critic_type(tmp_path, make_config):
    with pytest.raises(ValueError, match=re.escape("`critic_type`='both' is not valid")):
        make_config(tmp_path, critic_type="both")


def test_unknown_preset(tmp_path, make_config):
    with pytest.raises(ValueError, match=re.escape("`preset`='collm-9' is unknown")):
        make_config(tmp_path, preset="collm-9")


def test_num_agents_vs_agent_names(tmp_path, make_config):
    with pytest.raises(ValueError, match=re.escape("`num_agents`=3 but `agent_names` has 2 names")):
        make_config(tmp_path, num_agents=3, agent_names=["a", "b"])


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(advantage_level="tokens"), "`advantage_level`='tokens' is not valid"),
        (dict(critic_placement="inside"), "`critic_placement`='inside' is not valid"),
        (dict(agent_names=["a", "a"]), "`agent_names` must be unique"),
        (dict(agent_names=["a", "critic"]), "`agent_names`: the agent name 'critic' is reserved"),
        (dict(num_turns=0), "`num_turns` must be >= 1"),
        (dict(gamma=1.5), "`gamma` must be in [0, 1]"),
        (
            dict(advantage_level="token", centralized_value="team"),
            "`advantage_level='token'` needs a value per agent token",
        ),
        (dict(policy_loss_type="reinforce", num_ppo_epochs=2), "`policy_loss_type='reinforce'` is on-policy"),
    ],
)
def test_config_validation(tmp_path, make_config, overrides, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        make_config(tmp_path, **overrides)


def test_token_level_with_heterogeneous_team(tmp_path, make_config, prompts_dataset, qwen_path, llama_path):
    args = make_config(tmp_path, agent_names=["qw", "ll"], advantage_level="token")
    with pytest.raises(ValueError, match=re.escape("`advantage_level='token'` needs the critic to read agent 'll'")):
        MultiAgentPPOTrainer(
            args=args, model=[qwen_path, llama_path], train_dataset=prompts_dataset, reward_funcs=ok_reward
        )


def test_token_level_with_multiple_turns(tmp_path, make_config, prompts_dataset, qwen_path):
    with pytest.raises(ValueError, match=re.escape("`advantage_level='token'` supports `num_turns=1`")):
        args = make_config(tmp_path, num_agents=2, advantage_level="token", num_turns=2)
        MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, env=CountEnv())


def test_shared_base_lora_rejects_peft_model(tmp_path, make_config, prompts_dataset, qwen_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(qwen_path), lora)
    with pytest.raises(ValueError, match=re.escape("`model` is already a PeftModel")):
        MultiAgentPPOTrainer(
            args=make_config(tmp_path, num_agents=2),
            model=peft_model,
            peft_config=lora,
            train_dataset=prompts_dataset,
            reward_funcs=ok_reward,
        )


def test_one_model_object_for_many_agents(tmp_path, make_config, prompts_dataset, qwen_path):
    from transformers import AutoModelForCausalLM

    with pytest.raises(ValueError, match=re.escape("`model` is one model object but the team has 2 agents")):
        MultiAgentPPOTrainer(
            args=make_config(tmp_path, num_agents=2),
            model=AutoModelForCausalLM.from_pretrained(qwen_path),
            train_dataset=prompts_dataset,
            reward_funcs=ok_reward,
        )
