"""An env that breaks the protocol is named, with its method, in one line of the CLI (envs/protocol.py's EnvError):
a `reset` with one observation for a two-agent task is the env's fault, not `--agent_names`'; a `step` with a None
observation or reward is said in one line, not a traceback."""

from __future__ import annotations

import pytest

from trl_collm import MultiAgentEnv
from trl_collm.cli import main
from trl_collm.envs.protocol import EnvError, StepResult
from trl_collm.tasks import TaskSpec


class OneObservation(MultiAgentEnv):
    def reset(self, row):
        return ["only one"]

    def step(self, completions):
        return StepResult(reward=1.0, observations=None, done=True)


class NoneObservation(MultiAgentEnv):
    def reset(self, row):
        return ["a", "b"]

    def step(self, completions):
        return StepResult(reward=1.0, observations=[None, "next"], done=False)


class NoneReward(MultiAgentEnv):
    def reset(self, row):
        return ["a", "b"]

    def step(self, completions):
        return StepResult(reward=None, observations=None, done=True)


def _rows(split="train", limit=None):
    return [{"prompt": f"p{i}"} for i in range(limit or 4)]


def _spec(env_cls, turns=1):
    return TaskSpec(
        name=env_cls.__name__,
        agent_names=["a1", "a2"],
        make_env=env_cls,
        load_dataset=_rows,
        num_turns=turns,
        description="a broken env",
    )


ONE = _spec(OneObservation)
NONE_OBSERVATION = _spec(NoneObservation, turns=2)
NONE_REWARD = _spec(NoneReward)


def _cli_error(capsys, tmp_path, task: str, *extra) -> str:
    argv = ["mc", "--task", f"{__file__}:{task}", "--model_name_or_path", "tiny", "--use_cpu", "true"]
    argv += ["--output_dir", str(tmp_path / "out"), "--total_episodes", "2", "--per_device_train_batch_size", "1"]
    argv += ["--num_generations", "2", "--response_length", "2", "--report_to", "none", "--plot", "false"]
    argv += ["--save_strategy", "no", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("trl-collm: error: "), err
    return err


def test_a_reset_short_of_observations_is_the_envs_fault(capsys, tmp_path, qwen_path):
    err = _cli_error(capsys, tmp_path, "ONE")
    assert "OneObservation.reset returned 1 observation(s)" in err and "fix the env" in err, err
    assert "--agent_names" not in err
    err = _cli_error(capsys, tmp_path, "ONE", "--agent_names", "x", "y")  # the user's own names: the flag is named
    assert "--agent_names asks for 2 agents" in err, err


@pytest.mark.parametrize(
    "task,said",
    [
        ("NONE_OBSERVATION", "NoneObservation.step returned an invalid observation for episode 0, agent 0 (a1): None"),
        ("NONE_REWARD", "NoneReward.step returned None for episode 0; every episode needs a reward"),
    ],
)
def test_a_step_returning_none_is_one_line_naming_the_env(capsys, tmp_path, qwen_path, task, said):
    assert said in _cli_error(capsys, tmp_path, task)


def test_from_python_it_is_an_env_error_naming_the_env(tmp_path, make_config, qwen_path):
    from trl_collm import MultiAgentPPOTrainer

    args = make_config(tmp_path, agent_names=["a1", "a2"])
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=_rows(limit=8), env=NoneReward())
    with pytest.raises(EnvError, match=r"NoneReward\.step returned None for episode 0"):
        tr.train()
