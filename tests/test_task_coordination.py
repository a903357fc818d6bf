"""Coordination games: action parsing, payoffs against the tables, the repeated game's sparse/dense rewards,
an oracle team reaching the optimum, and short CC / DC / MC runs (mechanics)."""

import pytest
import torch

from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer, MultiAgentPPOTrainer
from trl_collm.tasks import get_task
from trl_collm.tasks.coordination import CLIMBING, PENALTY, RepeatedMatrixEnv, numbers_reward, parse_action


@pytest.mark.parametrize(
    "text, k, expected",
    [
        ("A", 3, 0),
        (" b) because", 3, 1),
        ("C", 3, 2),
        ("c", 3, 2),
        ("D", 3, ord("D") % 3),  # not an option letter: falls back to the character code
        ("7", 10, 7),
        ("x", 3, ord("x") % 3),
        ("", 3, 0),
        ("   ", 3, 0),
    ],
)
def test_parse_action(text, k, expected):
    assert parse_action(text, k) == expected


def test_matrix_payoffs_follow_the_tables():
    env = get_task("coord-climbing").make_env()
    rows = [{"round": 0}] * 4
    env.reset_batch(rows, 2)
    step = env.step_batch([["A", "A"], ["A", "B"], ["B", "C"], ["C", "C"]], [0, 1, 2, 3], 2)
    assert torch.allclose(step.rewards[:, 0], torch.tensor([11, -30, 6, 5]) / 11.0)
    env = get_task("coord-penalty").make_env()
    env.reset_batch(rows, 2)
    step = env.step_batch([["A", "A"], ["A", "C"], ["B", "B"], ["C", "C"]], [0, 1, 2, 3], 2)
    assert torch.allclose(step.rewards[:, 1], torch.tensor([1.0, -1.0, 0.2, 1.0]))
    assert CLIMBING[0][0] == max(max(r) for r in CLIMBING) and PENALTY[0][0] == PENALTY[2][2] == 10


def test_numbers_reward_by_hand():
    # digits 3 + 4 = 7: exact -> 1; 9 + 9 = 18 vs 10 -> 1 - 8/10 = 0.2; 0 + 0 = 0 vs 15 -> floored at 0
    got = numbers_reward(None, [["3", "4"], ["9", "9"], ["0", "0"]], target=[7, 10, 15])
    assert got == pytest.approx([1.0, 0.2, 0.0])


def test_repeated_game_sparse_and_dense_returns():
    plays = [["A", "A"], ["B", "B"], ["A", "B"], ["C", "C"]]  # payoffs 11, 7, -30, 5 (/11)
    for sparse in (True, False):
        env = RepeatedMatrixEnv(turns=4, sparse=sparse)
        obs = env.reset({"round": 3})
        assert len(obs) == 2 and "turn 1 of 4" in obs[0]
        rewards = []
        for t, play in enumerate(plays):
            result = env.step(play)
            rewards.append(result.reward)
            assert result.done == (t == 3)
            if t < 3:
                assert "player 1 chose" in result.observations[0] and "player 2 chose" in result.observations[1]
        mean = (11 + 7 - 30 + 5) / 11 / 4
        if sparse:
            assert rewards[:3] == [0.0, 0.0, 0.0] and rewards[3] == pytest.approx(mean)
        else:
            assert sum(rewards) == pytest.approx(mean)


@pytest.mark.parametrize(
    "name, answers",
    [
        ("coord-climbing", ["A", "A"]),
        ("coord-penalty", ["C", "C"]),
        ("coord-repeated", ["A", "A"]),
    ],
)
def test_oracle_team_reaches_the_optimum(name, answers):
    task = get_task(name)
    env = task.make_env()
    rows = [task.load_dataset("eval")[i] for i in range(3)]
    env.reset_batch(rows, 2)
    total = torch.zeros(3)
    active = [0, 1, 2]
    for _ in range(task.num_turns):
        step = env.step_batch([answers] * len(active), active, 2)
        total[active] += step.rewards[:, 0]
        active = [e for e, d in zip(active, step.dones.tolist()) if not d]
    assert not active
    assert torch.allclose(total, torch.full((3,), task.max_reward))


def test_numbers_oracle_and_dataset_targets():
    task = get_task("coord-numbers")
    ds = task.load_dataset("eval", num_agents=3)
    env = task.make_env(num_agents=3)
    rows = [ds[i] for i in range(4)]
    env.reset_batch(rows, 3)
    answers = []
    for row in rows:  # split the target into three digits
        t = row["target"]
        digits = [min(9, t), min(9, max(0, t - 9)), max(0, t - 18)]
        answers.append([str(d) for d in digits])
    step = env.step_batch(answers, [0, 1, 2, 3], 3)
    assert torch.allclose(step.rewards, torch.ones(4, 3))


@pytest.mark.parametrize("algo", ["cc", "dc", "mc"])
@pytest.mark.parametrize("name", ["coord-penalty", "coord-repeated"])
def test_short_training_runs(tmp_path, qwen_path, make_config, algo, name):
    task = get_task(name)
    common = dict(
        agent_names=task.agent_names,
        num_turns=task.num_turns,
        response_length=2,
        per_device_train_batch_size=2,
        total_episodes=2,
        learning_rate=1e-2,
    )
    if algo == "mc":
        args = MultiAgentMCConfig(
            output_dir=str(tmp_path / "o"),
            num_generations=2,
            use_cpu=True,
            bf16=False,
            report_to=[],
            save_strategy="no",
            disable_tqdm=True,
            num_sample_generations=0,
            expansion="per_branch",
            **common,
        )
        trainer = MultiAgentMCTrainer(
            args=args, model=qwen_path, train_dataset=task.load_dataset("train", limit=4), env=task.make_env()
        )
    else:
        args = make_config(tmp_path, critic_type="centralized" if algo == "cc" else "decentralized", **common)
        trainer = MultiAgentPPOTrainer(
            args=args, model=qwen_path, train_dataset=task.load_dataset("train", limit=4), env=task.make_env()
        )
    before = {a: [p.detach().clone() for p in trainer.team.agent_parameters(a)] for a in task.agent_names}
    out = trainer.train()
    assert -30 / 11 - 1e-6 <= out.metrics["objective/scores"] <= 1.0 + 1e-6  # the worst payoff is -30/11
    for a in task.agent_names:
        assert any(not torch.equal(b, p) for b, p in zip(before[a], trainer.team.agent_parameters(a))), a
