"""trl_collm.rollout: the runners check every environment's rewards in one place, the cross-product runner included
(a batch environment builds its reward tensor itself, past the per-episode checks of `MultiAgentEnv.step`)."""

import re

import pytest
import torch
from test_mc import ScriptedTeam

from trl_collm.envs import BatchStep, MultiAgentEnv
from trl_collm.rollout import run_cross, run_episodes, run_tree


class BatchEnv(MultiAgentEnv):
    """A batch environment that returns the reward rows it is given (the same rows every step), done after a step."""

    def __init__(self, rows):
        self.rows = rows

    def reset(self, row):
        return [row["prompt"], row["prompt"]]

    def step_batch(self, completions, episode_ids, num_agents, agent_names=None):
        k = len(episode_ids)
        return BatchStep(torch.tensor(self.rows[:k]), [None] * k, torch.ones(k, dtype=torch.bool), [{}] * k)


def _run(runner, env):
    team = ScriptedTeam(["a", "b"], [{"a": ["1", "2"], "b": ["3", "4"]}] * 2)
    rows = [{"prompt": "p"}]
    if runner == "episodes":
        team.script = [{"a": ["1"], "b": ["3"]}]
        return run_episodes(team, env, rows, 1)
    if runner == "tree":
        return run_tree(team, env, rows, 1, 2, "tree")
    return run_cross(team, env, rows, 2, 2, torch.Generator().manual_seed(0))  # 2 of the 4 combinations


RUNNERS = ["episodes", "tree", "cross"]


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_nan_reward_fails_on_every_runner_with_one_message(runner):
    # episode 1 (the second row every runner scores) holds the NaN; `episodes` scores one row, so its row 0 does
    rows = [[1.0, float("nan")], [1.0, float("nan")]] if runner == "episodes" else [[1.0, 2.0], [float("nan"), 0.0]]
    episode = 0 if runner == "episodes" else 1
    message = f"BatchEnv.step_batch returned a reward that is non-finite in float32 for episode {episode} (turn 0)"
    with pytest.raises(ValueError, match=re.escape(message)):
        _run(runner, BatchEnv(rows))


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_reward_row_of_the_wrong_length_fails_on_every_runner_with_one_message(runner):
    env = BatchEnv([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])  # three rewards per episode for a team of two
    k = 1 if runner == "episodes" else 2
    message = f"BatchEnv.step_batch returned rewards of shape ({k}, 3) for {k} episodes (turn 0); expected ({k}, 2)"
    with pytest.raises(ValueError, match=re.escape(message)):
        _run(runner, env)


def test_finite_rewards_of_the_right_shape_pass_the_check():
    tree = _run("cross", BatchEnv([[1.0, 2.0], [3.0, 4.0]]))
    assert tree.credit_mask[0].any()  # the check let the step through and the credit was assigned
