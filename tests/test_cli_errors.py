"""The command line's mistakes are one line with exit status 2, before any model loads (cli/): training and eval
mistakes, malformed configs, missing packages or sandbox, failed pushes, a full disk, damaged files."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_cli_usability import _fake_team, _one_line_error

from trl_collm.cli import UsageError, main

from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]
CC_CPU = str(ROOT / "examples" / "configs" / "coord-penalty" / "cc-cpu.yaml")


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model load fails loudly: an error that must come before the models shows it does."""
    import transformers

    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the mistake was reported")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)


# ---------------------------------------------------------------------------------------------------------------
# 3. errors: one line, exit 2, before anything expensive
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--agent_names", "a", "b", "c"], ["--agent_names", "3 agents", "seats 2"]),
        # coord-penalty has no num_agents option: refused as such (it used to be swallowed by make_env's **options)
        (["--task_options", '{"num_agents": 3}'], ["takes no option 'num_agents'", "drop it"]),
        (
            ["--task", "coord-numbers", "--task_options", '{"num_agents": 3}', "--agent_names", "a", "b"],
            ["2 agents", "seats 3"],
        ),
        (["--load_in_4bit", "true"], ["--load_in_4bit", "not supported"]),
        (["--model_name_or_path", "./no/such/model"], ["--model_name_or_path ./no/such/model", "no such folder"]),
        (["--agent_models", "tiny", "/no/such/model"], ["--agent_models /no/such/model", "no such folder"]),
        (["--eval_limit", "0"], ["--eval_limit 0", ">= 1"]),
        (["--dataset_source", "I"], ["coord-penalty", "no dataset source"]),
        (["--threads", "-1"], ["--threads -1"]),
    ],
)
def test_training_mistakes_are_one_line_before_models_load(tmp_path, capsys, no_model_loads, extra, expected):
    err = _one_line_error(capsys, ["ppo", "--config", CC_CPU, "--output_dir", str(tmp_path / "out"), *extra])
    for text in expected:
        assert text in err, err


ANY_SIZE_TASK = """
from datasets import Dataset
from trl_collm import RewardFunctionEnv
from trl_collm.tasks import TaskSpec


def joint(prompts, completions, **columns):
    return [0.0 for _ in completions]


TASK = TaskSpec(
    name="any-size",
    description="every agent reads the row's prompt",
    agent_names=["a", "b", "c"],
    num_turns=1,
    make_env=lambda **options: RewardFunctionEnv([joint]),
    load_dataset=lambda split="train", source=None, limit=None: Dataset.from_dict({"prompt": ["hi"] * (limit or 16)}),
)
"""


def test_the_team_check_starts_an_env_that_seats_any_team(tmp_path, no_model_loads):
    """A RewardFunctionEnv without names or formatters cannot reset() alone; the check starts it with the team's
    size, and the run goes on to load the models."""
    (tmp_path / "any_size.py").write_text(ANY_SIZE_TASK)
    argv = ["ppo", "--config", CC_CPU, "--task", f"{tmp_path / 'any_size.py'}:TASK", "--output_dir", str(tmp_path)]
    with pytest.raises(AssertionError, match="a model was loaded"):
        main(argv)


def test_malformed_yaml_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: coord-penalty\n  learning_rate: [1\n")
    err = _one_line_error(capsys, ["ppo", "--config", str(bad)])
    assert "--config" in err and "YAML" in err and "bad.yaml" in err and "line 2" in err
    bad.write_text("- a list\n- not fields\n")
    assert "a YAML mapping" in _one_line_error(capsys, ["ppo", "--config", str(bad)])


def test_config_file_errors_cost_no_torch_import(tmp_path):
    """A missing or malformed --config is said before the parser (transformers, torch) is built."""
    (tmp_path / "bad.yaml").write_text("task: [1\n")
    code = (
        "import sys; from trl_collm.cli import main; "
        f"codes = [main(['ppo', '--config', {str(tmp_path / 'bad.yaml')!r}]), main(['mc', '--config', 'no.yaml'])]; "
        "print(codes, 'torch' in sys.modules)"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=HANG_GUARD_S
    )
    assert res.stdout.strip() == "[2, 2] False", res.stdout + res.stderr[-2000:]


@pytest.mark.parametrize("integration", ["wandb", "tensorboard"])
def test_report_to_without_its_package_is_one_line(tmp_path, capsys, monkeypatch, no_model_loads, integration):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a, **k: None if name.startswith(integration) else real(name, *a, **k)
    )
    err = _one_line_error(
        capsys, ["ppo", "--config", CC_CPU, "--report_to", integration, "--output_dir", str(tmp_path)]
    )
    assert f"--report_to {integration}" in err and "pip install" in err and "--report_to none" in err


def test_a_task_factory_that_takes_arguments_is_named(tmp_path, capsys):
    (tmp_path / "my_task.py").write_text("def make(size):\n    return size\n")
    err = _one_line_error(capsys, ["ppo", "--config", CC_CPU, "--task", f"{tmp_path / 'my_task.py'}:make"])
    assert "'make' takes arguments (size)" in err and "TaskSpec" in err


def test_a_missing_sandbox_is_one_line(tmp_path, capsys, monkeypatch, no_model_loads):
    from trl_collm.sandbox import SandboxUnavailable
    from trl_collm.tasks import code

    def missing():
        raise SandboxUnavailable("the code sandbox needs bubblewrap (`bwrap`), which is not installed: apt install")

    monkeypatch.setattr(code, "require_sandbox", missing)
    argv = ["ppo", "--config", CC_CPU, "--task", "code-humaneval", "--output_dir", str(tmp_path), "--train_limit", "16"]
    err = _one_line_error(capsys, argv)
    assert "bubblewrap" in err


def test_a_failed_push_of_any_kind_is_one_line(tmp_path):
    """Hub errors are not all OSErrors (httpx.ConnectError is not): after saving, any of them is one line."""
    from trl_collm.cli import _push

    ConnectError = type("ConnectError", (Exception,), {})

    class Trainer:
        def push_to_hub(self, **kw):
            raise ConnectError("[Errno -3] Temporary failure in name resolution\n" + "  frame\n" * 70)

    with pytest.raises(UsageError) as info:
        _push(Trainer(), SimpleNamespace(output_dir=str(tmp_path / "team")), "coord-penalty")
    message = str(info.value)
    assert "saved in" in message and "ConnectError" in message and "name resolution" in message
    assert "frame" not in message


def test_a_full_disk_while_checkpointing_is_one_line(tmp_path, monkeypatch):
    from trl_collm.cli import _disk_errors
    from trl_collm.trainers import checkpoints

    tmp = tmp_path / "out" / "checkpoint-4.tmp"
    tmp.mkdir(parents=True)

    def full(*a, **k):
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4416 vs 4304")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(UsageError) as info, _disk_errors(str(tmp_path / "out")):
        checkpoints._save_state({}, str(tmp / checkpoints.STATE_FILE))
    assert "resume_state.pt" in str(info.value) and "disk full" in str(info.value)
    assert not tmp.exists()  # the unfinished checkpoint's space is given back
    with pytest.raises(UsageError, match="No space left"), _disk_errors(str(tmp_path)):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x"))
    with pytest.raises(OSError, match="other"), _disk_errors(str(tmp_path)):
        raise OSError(errno.EIO, "other")  # not a full disk: not the user's, keeps its traceback


def test_prompts_are_cleaned_where_envs_hand_them_over():
    """A lone surrogate (tokenizers raise TypeError on it) becomes U+FFFD; an empty prompt is refused by name."""
    from trl_collm.envs import RewardFunctionEnv

    text = [lambda row: row["t"]] * 2
    env = RewardFunctionEnv(lambda prompts, completions, **kw: [0.0] * len(completions), formatters=text)
    assert env.reset_batch([{"t": "ok\ud800!"}, {"t": "fine"}], 2) == [["ok\ufffd!", "ok\ufffd!"], ["fine", "fine"]]
    with pytest.raises(ValueError, match=r"empty prompt for episode 1, agent 0"):
        env.reset_batch([{"t": "ok"}, {"t": ""}], 2)


def test_code_feedback_with_a_surrogate_reaches_the_tokenizer_clean(qwen_path):
    """Generated code's exception message comes back as the next observation: it is cleaned on the way in."""
    from transformers import AutoTokenizer

    from trl_collm.envs import MultiAgentEnv, StepResult

    class Feedback(MultiAgentEnv):
        def reset(self, row):
            return ["write code", "write code"]

        def step(self, completions):
            return StepResult([0.0, 0.0], ["UnicodeError: '\udcff' in output"] * 2, False, {})

    env = Feedback()
    env.reset_batch([{}], 2)
    obs = env.step_batch([["a", "b"]], [0], 2).observations[0]
    assert obs[0] == "UnicodeError: '\ufffd' in output"
    AutoTokenizer.from_pretrained(qwen_path)(obs[0])  # raised TypeError before


def test_eval_mistakes_are_one_line(tmp_path, capsys, qwen_path):
    team = _fake_team(tmp_path / "team", qwen_path, ["player_1", "player_2"], response_length=2)
    base = ["eval", "--team_dir", str(team), "--task", "coord-penalty"]
    assert "--limit 0" in _one_line_error(capsys, [*base, "--limit", "0"])
    err = _one_line_error(capsys, [*base, "--split", "test"])
    assert "--split" in err and "'test'" in err
    assert "no dataset source" in _one_line_error(capsys, [*base, "--dataset_source", "I"])
    err = _one_line_error(capsys, ["eval", "--team_dir", str(team)])
    assert "--task" in err and "records no task" in err


def test_a_truncated_weights_file_is_named(tmp_path, capsys, qwen_path):
    team = _fake_team(tmp_path / "team", qwen_path, ["player_1", "player_2"], response_length=2)
    weights = team / "player_2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    err = _one_line_error(capsys, ["eval", "--team_dir", str(team), "--task", "coord-penalty", "--limit", "1"])
    assert str(weights) in err and "truncated or corrupt" in err


def test_a_missing_local_team_folder_is_not_a_repo_id_error(tmp_path):
    from trl_collm.team.saved import load_team

    with pytest.raises(FileNotFoundError, match="no such folder"):
        load_team(str(tmp_path / "no" / "team"))
