"""Tests for trl_collm.envs: the episode/batch env layers, reward-function envs, reward validation and the
reward-model wrapper."""

from __future__ import annotations

import math

import pytest
import torch

from trl_collm.envs import (
    BatchStep,
    MultiAgentEnv,
    RewardFunctionEnv,
    RewardModelFunction,
    StepResult,
    as_float_rewards,
    check_agent_names,
)

NAMES = ["alice", "bob"]


# ---------------------------------------------------------------------------------------------------------------
# A scripted 2-turn counting game
# ---------------------------------------------------------------------------------------------------------------


class CountingEnv(MultiAgentEnv):
    """Each agent says a number; the running total starts at row["start"]. Turn 1 rewards each agent with its own
    number (per agent); turn 2 rewards the team jointly with the total, and ends the episode."""

    agent_names = NAMES
    max_turns = 2

    def __init__(self):
        self.total = None
        self.turn = 0
        self.history = []

    def reset(self, row):
        self.total = row["start"]
        self.turn = 0
        self.history = []
        return [f"{name}: total is {self.total}" for name in NAMES]

    def step(self, completions):
        self.turn += 1
        numbers = [int(c) for c in completions]
        self.history.append(numbers)
        self.total += sum(numbers)
        if self.turn == 1:
            return StepResult(
                reward=[float(x) for x in numbers],
                observations=[f"{name}: total is {self.total}" for name in NAMES],
                done=False,
                info={"turn": 1},
            )
        return StepResult(reward=float(self.total), observations=None, done=True, info={"turn": 2})


def test_reset_batch_clones_per_episode_and_validates_observations():
    env = CountingEnv()
    obs = env.reset_batch([{"start": 0}, {"start": 10}, {"start": 100}], num_agents=2)
    assert obs == [
        ["alice: total is 0", "bob: total is 0"],
        ["alice: total is 10", "bob: total is 10"],
        ["alice: total is 100", "bob: total is 100"],
    ]
    assert len(env._episodes) == 3
    assert len({id(e) for e in env._episodes}) == 3 and all(e is not env for e in env._episodes)
    # the template env itself is never reset
    assert env.total is None
    # state is independent: mutating one episode's history does not leak into another
    env._episodes[0].history.append("x")
    assert env._episodes[1].history == [] and env._episodes[2].history == []


def test_reset_batch_does_not_nest_old_episodes_into_new_clones():
    env = CountingEnv()
    env.reset_batch([{"start": 0}] * 3, 2)
    env.reset_batch([{"start": 1}] * 2, 2)
    assert len(env._episodes) == 2
    assert all("_episodes" not in vars(e) for e in env._episodes)


def test_step_batch_two_turns_rewards_dones_and_only_given_episodes():
    env = CountingEnv()
    env.reset_batch([{"start": 0}, {"start": 10}, {"start": 100}], 2)

    # Turn 1 only on episodes 2 and 0 (in that order): per-agent rewards.
    out = env.step_batch([["1", "2"], ["3", "4"]], episode_ids=[2, 0], num_agents=2)
    assert isinstance(out, BatchStep)
    assert out.rewards.shape == (2, 2) and out.rewards.dtype == torch.float32
    assert out.rewards.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert out.dones.dtype == torch.bool and out.dones.tolist() == [False, False]
    assert out.observations == [
        ["alice: total is 103", "bob: total is 103"],
        ["alice: total is 7", "bob: total is 7"],
    ]
    assert out.infos == [{"turn": 1}, {"turn": 1}]
    # Episode 1 was not touched.
    assert env._episodes[1].turn == 0 and env._episodes[1].total == 10
    assert env._episodes[0].turn == 1 and env._episodes[2].turn == 1

    # Turn 2 on episode 0: joint reward broadcast to both agents, done.
    out = env.step_batch([["5", "5"]], [0], 2)
    assert out.rewards.tolist() == [[17.0, 17.0]]
    assert out.dones.tolist() == [True]
    assert out.observations == [None]
    # Stepping a finished episode is a trainer bug and is reported.
    with pytest.raises(ValueError, match=r"episode 0, which is already done"):
        env.step_batch([["1", "1"]], [0], 2)


def test_step_batch_argument_errors():
    env = CountingEnv()
    with pytest.raises(RuntimeError, match="before reset_batch"):
        env.step_batch([["1", "2"]], [0], 2)
    env.reset_batch([{"start": 0}], 2)
    with pytest.raises(ValueError, match=r"episode id 5.*started 1 episodes"):
        env.step_batch([["1", "2"]], [5], 2)
    with pytest.raises(ValueError, match=r"got 3 completions for episode 0; expected one completion per agent \(2\)"):
        env.step_batch([["1", "2", "3"]], [0], 2)
    with pytest.raises(ValueError, match=r"2 completion lists for 1 episode ids"):
        env.step_batch([["1", "2"], ["1", "2"]], [0], 2)


# ---------------------------------------------------------------------------------------------------------------
# Validation errors of the base batch layer
# ---------------------------------------------------------------------------------------------------------------


class BadResetEnv(MultiAgentEnv):
    def __init__(self, obs):
        self.obs = obs

    def reset(self, row):
        return self.obs


class ScriptedStepEnv(MultiAgentEnv):
    def __init__(self, result, reward_type="auto"):
        self.result = result
        self.reward_type = reward_type

    def reset(self, row):
        return ["a", "b"]

    def step(self, completions):
        return self.result


def test_reset_wrong_number_of_observations():
    env = BadResetEnv(["x", "y", "z"])
    with pytest.raises(
        ValueError,
        match=r"BadResetEnv\.reset returned 3 observations for episode 0; the team has 2 agents \(alice, bob\)\. "
        r"Return one observation per agent\.",
    ):
        env.reset_batch([{}], 2, agent_names=NAMES)


def test_reset_observation_of_wrong_type():
    env = BadResetEnv(["ok", 3.5])
    with pytest.raises(ValueError, match=r"BadResetEnv\.reset .*episode 0, agent 1 \(bob\): 3\.5.*str.*list\[int\]"):
        env.reset_batch([{}], 2, agent_names=NAMES)
    env = BadResetEnv(["ok", [1, "two"]])
    with pytest.raises(ValueError, match=r"invalid observation for episode 0, agent 1"):
        env.reset_batch([{}], 2)
    # A conversation is an observation (each agent renders it with its chat template); a broken message is not.
    env = BadResetEnv([[{"role": "user", "content": "hi"}], "ok"])
    assert env.reset_batch([{}], 2) == [[[{"role": "user", "content": "hi"}], "ok"]]
    env = BadResetEnv([[{"role": "user"}], "ok"])
    with pytest.raises(ValueError, match=r"BadResetEnv\.reset's observation for episode 0, agent 0 .*messages"):
        env.reset_batch([{}], 2)
    env = BadResetEnv([[{"role": "user", "content": 3}], "ok"])
    with pytest.raises(ValueError, match=r"\[0\] needs a str 'role' and a str 'content'"):
        env.reset_batch([{}], 2)


def test_token_id_observations_are_accepted():
    env = BadResetEnv([[1, 2, 3], (4, 5)])
    obs = env.reset_batch([{}], 2)
    assert obs == [[[1, 2, 3], [4, 5]]]


def test_step_observations_none_while_not_done():
    env = ScriptedStepEnv(StepResult(reward=1.0, observations=None, done=False))
    env.reset_batch([{}, {}], 2)
    with pytest.raises(
        ValueError, match=r"ScriptedStepEnv\.step returned observations=None for episode 1 while done=False"
    ):
        env.step_batch([["p", "q"]], [1], 2)


def test_step_wrong_number_of_next_observations():
    env = ScriptedStepEnv(StepResult(reward=1.0, observations=["only one"], done=False))
    env.reset_batch([{}], 2)
    with pytest.raises(
        ValueError, match=r"ScriptedStepEnv\.step returned 1 observations for episode 0; the team has 2 agents"
    ):
        env.step_batch([["p", "q"]], [0], 2)


def test_step_non_bool_done():
    for bad in ("False", None, torch.tensor([True, False])):
        env = ScriptedStepEnv(StepResult(reward=1.0, observations=["a", "b"], done=bad))
        env.reset_batch([{}], 2)
        with pytest.raises(ValueError, match=r"ScriptedStepEnv\.step returned .*done.* for episode 0"):
            env.step_batch([["p", "q"]], [0], 2)
    # numpy-like / tensor scalars are fine
    env = ScriptedStepEnv(StepResult(reward=1.0, observations=None, done=torch.tensor(True)))
    env.reset_batch([{}], 2)
    assert env.step_batch([["p", "q"]], [0], 2).dones.tolist() == [True]


def test_step_reward_errors_name_env_and_episode():
    env = ScriptedStepEnv(StepResult(reward=[1.0, 2.0, 3.0], done=True))
    env.reset_batch([{}, {}], 2, agent_names=NAMES)
    with pytest.raises(
        ValueError,
        match=r"ScriptedStepEnv\.step returned 3 rewards for episode 1 but the team has 2 agents \(alice, bob\); "
        r"return a float or a list of 2 floats",
    ):
        env.step_batch([["p", "q"]], [1], 2, agent_names=NAMES)

    env = ScriptedStepEnv(StepResult(reward=float("nan"), done=True))
    env.reset_batch([{}], 2)
    with pytest.raises(ValueError, match=r"ScriptedStepEnv\.step returned a non-finite reward nan for episode 0"):
        env.step_batch([["p", "q"]], [0], 2)

    env = ScriptedStepEnv(StepResult(reward=[1.0, 2.0], done=True), reward_type="joint")
    env.reset_batch([{}], 2)
    with pytest.raises(
        ValueError, match=r"ScriptedStepEnv\.step returned a list of rewards for episode 0 but reward_type='joint'"
    ):
        env.step_batch([["p", "q"]], [0], 2)

    env = ScriptedStepEnv((1.0, None, True))
    env.reset_batch([{}], 2)
    with pytest.raises(
        ValueError, match=r"ScriptedStepEnv\.step returned .*tuple.* for episode 0; return a StepResult"
    ):
        env.step_batch([["p", "q"]], [0], 2)


def test_per_agent_reward_type_broadcasts_scalars():
    env = ScriptedStepEnv(StepResult(reward=2.5, done=True), reward_type="per_agent")
    env.reset_batch([{}], 2)
    assert env.step_batch([["p", "q"]], [0], 2).rewards.tolist() == [[2.5, 2.5]]


# ---------------------------------------------------------------------------------------------------------------
# as_float_rewards
# ---------------------------------------------------------------------------------------------------------------


def test_as_float_rewards_mixed_entries():
    out = as_float_rewards([1, [2.0, 3.0], True, torch.tensor(0.5)], 2, "reward function 'f'", "auto")
    assert out.dtype == torch.float32 and out.shape == (4, 2)
    assert out.tolist() == [[1.0, 1.0], [2.0, 3.0], [1.0, 1.0], [0.5, 0.5]]
    assert as_float_rewards(torch.tensor([1.0, 2.0]), 3, "f", "joint").tolist() == [[1.0] * 3, [2.0] * 3]
    assert as_float_rewards([], 2, "f", "auto").shape == (0, 2)


def test_as_float_rewards_errors():
    src = "reward function 'my_reward'"
    with pytest.raises(ValueError, match=r"reward function 'my_reward' returned a non-finite reward inf for episode 1"):
        as_float_rewards([0.0, float("inf")], 2, src, "auto")
    with pytest.raises(
        ValueError, match=r"'my_reward' returned a non-finite reward nan for episode 0, agent 1 \(bob\)"
    ):
        as_float_rewards([[0.0, math.nan]], 2, src, "auto", agent_names=NAMES)
    with pytest.raises(
        ValueError,
        match=r"'my_reward' returned 3 rewards for episode 1 but the team has 2 agents \(alice, bob\); "
        r"return a float or a list of 2 floats",
    ):
        as_float_rewards([1.0, [1.0, 2.0, 3.0]], 2, src, "auto", agent_names=NAMES)
    with pytest.raises(ValueError, match=r"'my_reward' returned 2 rewards but the batch has 3 episodes"):
        as_float_rewards([1.0, 2.0], 2, src, "auto", num_episodes=3)
    with pytest.raises(ValueError, match=r"'my_reward' returned a non-numeric reward 'high'.* for episode 0"):
        as_float_rewards(["high"], 2, src, "auto")
    with pytest.raises(ValueError, match=r"'my_reward' returned a non-numeric reward 'x'.* for episode 0, agent 0"):
        as_float_rewards([["x", 1.0]], 2, src, "per_agent")
    with pytest.raises(ValueError, match=r"'my_reward' returned None for episode 2"):
        as_float_rewards([1.0, 2.0, None], 2, src, "auto")
    with pytest.raises(
        ValueError, match=r"'my_reward' returned a list of rewards for episode 0 but reward_type='joint'"
    ):
        as_float_rewards([[1.0, 2.0]], 2, src, "joint")
    with pytest.raises(ValueError, match=r"reward_type must be one of"):
        as_float_rewards([1.0], 2, src, "team")


def test_check_agent_names():
    env = CountingEnv()
    check_agent_names(env, ["alice", "bob"])  # no error
    with pytest.raises(ValueError, match=r"CountingEnv\.agent_names is \['alice', 'bob'\].*\['alice', 'carol'\]"):
        check_agent_names(env, ["alice", "carol"])
    with pytest.raises(ValueError, match=r"different order"):
        check_agent_names(env, ["bob", "alice"])
    env.agent_names = None
    check_agent_names(env, ["x", "y", "z"])  # unset names are not checked


# ---------------------------------------------------------------------------------------------------------------
# RewardFunctionEnv
# ---------------------------------------------------------------------------------------------------------------


ROWS = [
    {"prompt": "2+2=", "answer": "4", "difficulty": 1},
    {"prompt": "3+3=", "answer": "6", "difficulty": 2},
    {"prompt": "1+0=", "answer": "1", "difficulty": 3},
]


class Recorder:
    """Reward function object that records every call (no __name__: its class name is used)."""

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, completions, **columns):
        self.calls.append({"prompts": prompts, "completions": completions, "columns": columns})
        # joint: the number of agents that answered correctly
        return [float(sum(c == a for c in cs)) for cs, a in zip(completions, columns["answer"])]


def test_reward_function_env_weighted_sum_batched_calls_and_columns():
    correct = Recorder()
    length_calls = []

    def length_reward(prompts, completions, **kwargs):
        length_calls.append(1)
        return [[float(len(c)) for c in cs] for cs in completions]  # per agent

    env = RewardFunctionEnv([correct, length_reward], reward_weights=[2.0, 0.5])
    assert env.reward_func_names == ["Recorder", "length_reward"]
    obs = env.reset_batch(ROWS, 2)
    assert obs == [["2+2=", "2+2="], ["3+3=", "3+3="], ["1+0=", "1+0="]]

    completions = [["4", "five"], ["6", "6"]]
    out = env.step_batch(completions, episode_ids=[0, 1], num_agents=2)

    # each reward function ran once for the whole batch
    assert len(correct.calls) == 1 and len(length_calls) == 1
    call = correct.calls[0]
    assert call["prompts"] == [["2+2=", "2+2="], ["3+3=", "3+3="]]
    assert call["completions"] == completions
    assert call["columns"] == {"answer": ["4", "6"], "difficulty": [1, 2]}  # "prompt" is not a column kwarg

    expected = [
        [2.0 * 1 + 0.5 * 1, 2.0 * 1 + 0.5 * 4],
        [2.0 * 2 + 0.5 * 1, 2.0 * 2 + 0.5 * 1],
    ]
    assert torch.allclose(out.rewards, torch.tensor(expected))
    assert out.dones.tolist() == [True, True] and out.observations == [None, None]
    comps = env.last_reward_components
    assert set(comps) == {"Recorder", "length_reward"}
    assert comps["Recorder"].tolist() == [[1.0, 1.0], [2.0, 2.0]]
    assert comps["length_reward"].tolist() == [[1.0, 4.0], [1.0, 1.0]]

    # the remaining episode can still be stepped; the finished ones cannot
    out = env.step_batch([["1", "0"]], [2], 2)
    assert out.rewards.tolist() == [[2.5, 2.5]]  # one agent correct (joint 1.0 * 2) + length 1 * 0.5
    with pytest.raises(ValueError, match="already done"):
        env.step_batch([["1", "0"]], [0], 2)


def test_reward_function_env_weights_length_mismatch():
    with pytest.raises(ValueError, match=r"reward_weights has 1 entries but there are 2 reward functions"):
        RewardFunctionEnv([Recorder(), Recorder()], reward_weights=[1.0])


def test_reward_function_env_duplicate_names_are_made_unique():
    env = RewardFunctionEnv([Recorder(), Recorder()])
    assert env.reward_func_names == ["Recorder", "Recorder_1"]


def test_reward_function_env_reward_errors_name_the_function():
    def bad_len(prompts, completions, **kw):
        return [1.0]

    def with_none(prompts, completions, **kw):
        return [None for _ in completions]

    def three(prompts, completions, **kw):
        return [[1.0, 2.0, 3.0] for _ in completions]

    env = RewardFunctionEnv(bad_len)
    env.reset_batch(ROWS[:2], 2)
    with pytest.raises(ValueError, match=r"reward function 'bad_len' returned 1 rewards but the batch has 2 episodes"):
        env.step_batch([["a", "b"], ["c", "d"]], [0, 1], 2)

    env = RewardFunctionEnv(with_none)
    env.reset_batch(ROWS[:1], 2)
    with pytest.raises(ValueError, match=r"reward function 'with_none' returned None for episode 0"):
        env.step_batch([["a", "b"]], [0], 2)

    env = RewardFunctionEnv(three, agent_names=NAMES)
    env.reset_batch(ROWS[:1], 2)
    with pytest.raises(
        ValueError, match=r"'three' returned 3 rewards for episode 0 but the team has 2 agents \(alice, bob\)"
    ):
        env.step_batch([["a", "b"]], [0], 2)

    env = RewardFunctionEnv(three, reward_type="joint")
    env.reset_batch(ROWS[:1], 2)
    with pytest.raises(ValueError, match=r"'three' returned a list of rewards for episode 0 but reward_type='joint'"):
        env.step_batch([["a", "b"]], [0], 2)


def test_formatter_forms():
    row = {"prompt": "Q", "topic": "math"}

    # None: the prompt column for everybody
    assert RewardFunctionEnv(Recorder()).reset_batch([row], 2) == [["Q", "Q"]]

    # list: one per agent, in order
    env = RewardFunctionEnv(Recorder(), formatters=[lambda r: "A:" + r["prompt"], lambda r: "B:" + r["topic"]])
    assert env.reset_batch([row], 2) == [["A:Q", "B:math"]]
    with pytest.raises(ValueError, match=r"got 2 formatters but the team has 3 agents"):
        env.reset_batch([row], 3)

    # dict: keyed by agent name; declares the agent names when none are given
    env = RewardFunctionEnv(
        Recorder(), formatters={"bob": lambda r: "bob sees " + r["topic"], "alice": lambda r: "alice"}
    )
    assert env.agent_names == ["bob", "alice"]
    assert env.reset_batch([row], 2, agent_names=["alice", "bob"]) == [["alice", "bob sees math"]]
    with pytest.raises(ValueError, match=r"no entry for agents \['carol'\]"):
        env.reset_batch([row], 2, agent_names=["alice", "carol"])
    with pytest.raises(ValueError, match=r"formatters has keys \['a'\] but agent_names is \['x'\]"):
        RewardFunctionEnv(Recorder(), formatters={"a": str}, agent_names=["x"])

    # single callable: used for every agent
    env = RewardFunctionEnv(Recorder(), formatters=lambda r: r["topic"].upper())
    assert env.reset_batch([row, {"prompt": "P", "topic": "art"}], 3) == [["MATH"] * 3, ["ART"] * 3]

    # a formatter returning something that is not an observation
    env = RewardFunctionEnv(Recorder(), formatters=[lambda r: "ok", lambda r: 7])
    with pytest.raises(
        ValueError, match=r"RewardFunctionEnv\.reset returned an invalid observation for episode 0, agent 1"
    ):
        env.reset_batch([row], 2)


def test_input_ids_rows_give_token_id_observations_and_prompts():
    rec = Recorder()
    env = RewardFunctionEnv(rec)
    rows = [{"input_ids": [5, 6, 7], "answer": "x"}, {"input_ids": [8], "answer": "y"}]
    obs = env.reset_batch(rows, 2)
    assert obs == [[[5, 6, 7], [5, 6, 7]], [[8], [8]]]
    out = env.step_batch([["x", "x"], ["n", "y"]], [0, 1], 2)
    assert rec.calls[0]["prompts"] == [[[5, 6, 7], [5, 6, 7]], [[8], [8]]]
    assert rec.calls[0]["columns"]["input_ids"] == [[5, 6, 7], [8]]
    assert out.rewards.tolist() == [[2.0, 2.0], [1.0, 1.0]]


def test_rows_without_prompt_or_input_ids():
    env = RewardFunctionEnv(Recorder())
    with pytest.raises(
        ValueError, match=r"no 'prompt' or 'input_ids' column \(its keys are \['answer', 'question'\]\)"
    ):
        env.reset_batch([{"question": "q", "answer": "a"}], 2)


def test_reward_function_env_single_episode_api():
    env = RewardFunctionEnv(Recorder(), agent_names=NAMES)
    assert env.reset({"prompt": "P", "answer": "1"}) == ["P", "P"]
    result = env.step(["1", "2"])
    assert result.done and result.reward == [1.0, 1.0]


# ---------------------------------------------------------------------------------------------------------------
# RewardModelFunction
# ---------------------------------------------------------------------------------------------------------------


class CharTokenizer:
    """Stand-in tokenizer: one id per character (ids 1..63; 0 is the pad id)."""

    pad_token_id = 0

    def __init__(self, padding_side="right"):
        self.padding_side = padding_side
        self.truncation_side = "right"
        self.decode_calls = 0

    def encode_one(self, text):
        return [1 + (ord(ch) % 63) for ch in text]

    def __call__(self, texts):
        return {"input_ids": [self.encode_one(t) for t in texts]}

    def decode(self, ids, skip_special_tokens=False):
        self.decode_calls += 1
        # ids map back to characters among chr(0..62) (modular inverse of encode on ASCII < 63)
        return "".join(chr(i - 1) for i in ids)


@pytest.fixture(scope="module")
def tiny_rm():
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        pad_token_id=0,
        num_labels=1,
    )
    model = Qwen2ForSequenceClassification(config)
    model.eval()
    return model


def _direct_score(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, 0].item()


@pytest.mark.parametrize("side", ["right", "left"])
def test_reward_model_function_matches_direct_forward(tiny_rm, side):
    tok = CharTokenizer(padding_side=side)
    rm = RewardModelFunction(tiny_rm, tok, batch_size=3)
    assert rm.__name__ == "reward_model"
    prompts = [["12", "345"], ["6", "7890"]]
    completions = [["a", "bcdef"], ["", "gh"]]
    out = rm(prompts, completions)
    assert len(out) == 2 and all(len(x) == 2 for x in out)
    for e in range(2):
        for i in range(2):
            expected = _direct_score(tiny_rm, tok.encode_one(prompts[e][i] + completions[e][i]))
            assert out[e][i] == pytest.approx(expected, abs=1e-5)
    # different sequences give different scores (the test would be vacuous otherwise)
    assert len({round(v, 6) for row in out for v in row}) > 1


def test_reward_model_function_token_id_prompts_single_agent_and_max_length(tiny_rm):
    tok = CharTokenizer()
    rm = RewardModelFunction(tiny_rm, tok, batch_size=2)
    prompt_ids = tok.encode_one("12+3=")
    out = rm([[prompt_ids], ["99"]], [["15"], ["x"]])
    assert tok.decode_calls == 1
    # n == 1: a plain float per episode
    assert isinstance(out[0], float) and isinstance(out[1], float)
    assert out[0] == pytest.approx(_direct_score(tiny_rm, tok.encode_one("12+3=15")), abs=1e-5)
    assert out[1] == pytest.approx(_direct_score(tiny_rm, tok.encode_one("99x")), abs=1e-5)

    short = RewardModelFunction(tiny_rm, tok, max_length=3)
    assert short([["12345"]], [["67"]])[0] == pytest.approx(_direct_score(tiny_rm, tok.encode_one("123")), abs=1e-5)


def test_reward_model_function_restores_train_mode_and_works_in_env(tiny_rm):
    tok = CharTokenizer()
    rm = RewardModelFunction(tiny_rm, tok)
    tiny_rm.train()
    try:
        env = RewardFunctionEnv([rm], reward_weights=[3.0])
        env.reset_batch([{"prompt": "ab"}], 2)
        out = env.step_batch([["c", "dd"]], [0], 2)
        assert tiny_rm.training  # mode restored
    finally:
        tiny_rm.eval()
    expected = [3.0 * _direct_score(tiny_rm, tok.encode_one(s)) for s in ("abc", "abdd")]
    assert torch.allclose(out.rewards, torch.tensor([expected]), atol=1e-5)
    assert env.reward_func_names == ["reward_model"]
    assert torch.allclose(env.last_reward_components["reward_model"] * 3.0, out.rewards)


def test_reward_model_function_needs_no_pad_id(tiny_rm):
    """The wrapper finds each row's last real token itself (left padding, last column), so a reward model without
    config.pad_token_id, and a tokenizer whose pad id has no embedding row, still score a padded batch exactly."""
    import copy

    class OutOfRangePad(CharTokenizer):
        pad_token_id = 10_000  # a token a script added without resizing the model
        eos_token_id = None

    model = copy.deepcopy(tiny_rm)
    model.config.pad_token_id = None
    for tok in (CharTokenizer(), OutOfRangePad()):
        rm = RewardModelFunction(model, tok, batch_size=4)
        texts = ["1", "2345", "abcdefg", "zz"]
        out = rm([[t] for t in texts], [[""] for _ in texts])
        for got, text in zip(out, texts):
            assert got == pytest.approx(_direct_score(model, tok.encode_one(text)), abs=1e-5)


def test_reward_model_function_without_a_score_layer_still_requires_pad_id():
    class Scorer(torch.nn.Module):  # a callable reward model with no body/score layer to pool on
        config = type("C", (), {"pad_token_id": None})()

        def forward(self, input_ids, attention_mask=None):
            return type("O", (), {"logits": input_ids.float().sum(-1, keepdim=True)})()

    class NoPad:
        pad_token_id = None

    with pytest.raises(ValueError, match=r"config\.pad_token_id is None"):
        RewardModelFunction(Scorer(), CharTokenizer())
    with pytest.raises(ValueError, match=r"neither the reward model's config nor the tokenizer defines a pad token"):
        RewardModelFunction(Scorer(), NoPad())


# ---------------------------------------------------------------------------------------------------------------
# a TRL-style reward given unwrapped: told by its effect on the first batch
# ---------------------------------------------------------------------------------------------------------------


def _first_batch(reward, texts):
    from trl_collm import RewardFunctionEnv

    env = RewardFunctionEnv([reward], formatters=[lambda row: "left", lambda row: "right"])
    env.reset_batch([{"n": i} for i in range(len(texts))], 2, ["left", "right"])
    return env, env.step_batch(texts, list(range(len(texts))), 2, ["left", "right"])


def trl_length(prompts, completions, **kw):  # written for one completion per sample, no annotation
    return [len(c) for c in completions]


def test_an_unwrapped_trl_style_length_reward_is_warned_about_on_its_first_batch():
    import warnings

    texts = [["a", "bbbb"], ["cc", "d"], ["eeeeee", "ff"]]  # the episodes' lengths differ: 5, 3, 8
    with pytest.warns(UserWarning, match=r"'trl_length' returned the number of agents \(2\).*per_agent\(trl_length\)"):
        env, step = _first_batch(trl_length, texts)
    assert step.rewards.eq(2.0).all()  # what it scored: the list's length, which the warning names
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per function, not on every batch
        env.reset_batch([{"n": 0}, {"n": 1}], 2, ["left", "right"])
        env.step_batch(texts[:2], [0, 1], 2, ["left", "right"])


def test_joint_rewards_and_wrapped_ones_are_not_warned_about():
    import warnings

    from trl_collm.envs import per_agent

    def joint_length(prompts, completions, **kw):
        return [float(sum(len(t) for t in c)) for c in completions]

    def two_agents_answered(prompts, completions, **kw):  # honest, and 2 for every episode here: texts equal in length
        return [float(sum(bool(t) for t in c)) for c in completions]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, step = _first_batch(joint_length, [["a", "bbbb"], ["cc", "d"]])
        assert step.rewards[:, 0].tolist() == [5.0, 3.0]
        _first_batch(two_agents_answered, [["ab", "c"], ["a", "bc"]])  # every episode's texts total 3 characters
        _, step = _first_batch(per_agent(trl_length), [["a", "bbbb"], ["cc", "d"]])
        assert step.rewards.tolist() == [[1.0, 4.0], [2.0, 1.0]]
