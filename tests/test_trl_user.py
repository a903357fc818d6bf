"""What a TRL user trips on (issue 23): torch's thread count on CPU, one-line errors raised before any model loads,
a team that remembers its task, portable cards with the run's evaluation, and TRL's habits (top_k=0, GRPO-style
reward functions, a grouped and quick `--help`). Each test here failed on the code before the fix."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_cli_usability import _fake_team

from trl_collm.cli import UsageError, main

from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]
CC_CPU = str(ROOT / "examples" / "configs" / "coord-penalty" / "cc-cpu.yaml")


def _one_line_error(capsys, argv) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("trl-collm: error: ") and "\n" not in err, err[-3000:]
    return err


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model load fails loudly: an error that must come before the models shows it does."""
    import transformers

    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the mistake was reported")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)


# ---------------------------------------------------------------------------------------------------------------
# 2. threads
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_cpu_runs_choose_their_thread_count(monkeypatch, restore_threads):
    from trl_collm.cli import set_cpu_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    assert set_cpu_threads(None, on_cpu=True) == 1 and torch.get_num_threads() == 1  # the CPU default
    torch.set_num_threads(2)
    assert set_cpu_threads(None, on_cpu=False) is None and torch.get_num_threads() == 2  # GPU: torch's choice
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert set_cpu_threads(None, on_cpu=True) is None and torch.get_num_threads() == 2  # the user's OMP_NUM_THREADS
    assert set_cpu_threads(3, on_cpu=True) == 3 and torch.get_num_threads() == 3  # the flag wins
    with pytest.raises(UsageError, match="--threads 0"):
        set_cpu_threads(0, on_cpu=True)


def test_the_cli_sets_one_thread_on_cpu_before_loading_models(tmp_path, capsys, monkeypatch, restore_threads):
    """`trl-collm ppo` on CPU runs with one thread unless told otherwise; `--threads` is the flag."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    # stop right after the thread choice: an invalid limit is reported just after it
    _one_line_error(capsys, ["ppo", "--config", CC_CPU, "--output_dir", str(tmp_path), "--eval_limit", "0"])
    assert torch.get_num_threads() == 1
    _one_line_error(
        capsys, ["ppo", "--config", CC_CPU, "--output_dir", str(tmp_path), "--eval_limit", "0", "--threads", "2"]
    )
    assert torch.get_num_threads() == 2


def test_warmstart_takes_threads(capsys):
    from trl_collm.warmstart import main as warm_main

    with pytest.raises(SystemExit) as info:
        warm_main(["--out", "unused", "--threads", "0"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--threads 0: give a thread count >= 1" in err, err


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


# ---------------------------------------------------------------------------------------------------------------
# 4. a team that remembers its task
# ---------------------------------------------------------------------------------------------------------------


def test_eval_defaults_to_the_recorded_task_and_refuses_another(tmp_path, capsys, qwen_path):
    record = {"name": "coord-numbers", "ref": "coord-numbers", "options": {"num_agents": 2}, "dataset_source": None}
    team = _fake_team(tmp_path / "team", qwen_path, ["agent_1", "agent_2"], response_length=2, task=record)
    capsys.readouterr()
    assert main(["eval", "--team_dir", str(team), "--limit", "2"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["task"] == "coord-numbers"
    err = _one_line_error(capsys, ["eval", "--team_dir", str(team), "--task", "coord-penalty"])
    assert "trained on task 'coord-numbers'" in err and "drop --task" in err
    err = _one_line_error(capsys, ["play", "--team_dir", str(team), "--task_options", '{"num_agents": 3}'])
    assert '{"num_agents": 2}' in err and "drop --task_options" in err
    capsys.readouterr()  # the same options, given explicitly, are fine
    assert main(["eval", "--team_dir", str(team), "--task_options", '{"num_agents": 2}', "--limit", "1"]) == 0


def test_card_names_are_portable():
    from trl_collm.team.card import portable_name

    assert portable_name("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert portable_name("/root/.cache/trl_collm/tiny-models/tiny-qwen2") == "tiny-qwen2"
    assert portable_name("/home/me/tasks/my_task.py:TASK") == "my_task.py:TASK"
    assert portable_name("coord-penalty") == "coord-penalty" and portable_name("my_tasks:TASK") == "my_tasks:TASK"


def test_the_card_snippet_plays_with_the_training_task_options(tmp_path, monkeypatch, qwen_path):
    """A team trained with task options (a 3-agent coord-numbers): the card's snippet passes them, and runs from
    inside the team folder."""
    import re

    from trl_collm.team.card import team_card

    agents = ["agent_1", "agent_2", "agent_3"]
    team = _fake_team(tmp_path / "trio", qwen_path, agents, response_length=2)
    facts = {
        "agents": agents,
        "agent_folders": {a: a for a in agents},
        "layout": "separate",
        "trainer": "MultiAgentPPOTrainer",
        "preset": None,
        "num_turns": 1,
        "generation": {"response_length": 2},
        "model_name": "trio",
        "repo": None,
        "tags": ["trl"],
        "task_name": "coord-numbers",
        "task_options": {"num_agents": 3},
        "task": {"env": "RewardFunctionEnv"},
        "algorithm": {},
        "algorithm_summary": "test",
        "base_models": dict.fromkeys(agents, qwen_path),
    }
    card = team_card(facts)
    code = re.search(r"## Run the team\n\n```python\n(.*?)```", card, re.DOTALL).group(1)
    assert "options = {'num_agents': 3}" in code and qwen_path not in card
    monkeypatch.chdir(team)
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the card's own snippet
    assert set(scope["transcripts"][0]["turns"][0]["agents"]) == set(agents)


def _card_trainer(log_history, best_step=None, global_step=6):
    state = SimpleNamespace(
        log_history=log_history,
        global_step=global_step,
        best_global_step=best_step,
        best_model_checkpoint=f"out/checkpoint-{best_step}" if best_step else None,
    )
    return SimpleNamespace(state=state, args=SimpleNamespace(load_best_model_at_end=best_step is not None))


def test_the_card_reports_the_evaluation_of_the_saved_weights():
    from trl_collm.team.card import _evaluation, _results

    history = [
        {"loss": 1.0, "step": 2},
        {"eval_return": 0.5, "step": 2},
        {"eval_return": 0.9, "step": 4},
        {"eval_return": 0.7, "step": 6},
    ]
    last = _evaluation(_card_trainer(history))
    assert last == {
        "weights_step": 6,
        "weights_from_best": False,
        "evaluation": {"eval_return": 0.7},
        "evaluation_step": 6,
    }
    best = _evaluation(_card_trainer(history, best_step=4))
    assert best["weights_step"] == 4 and best["evaluation"] == {"eval_return": 0.9} and best["evaluation_step"] == 4
    text = "\n".join(_results(dict(best, metrics={"objective/scores": 0.25, "episode": 48}, last_step=6)))
    assert "at step 4, the best checkpoint's" in text and "| `eval_return` | 0.9 |" in text
    assert "Last logged training iteration (step 6)" in text and "| `objective/scores` | 0.25 |" in text
    assert _evaluation(_card_trainer([{"loss": 1.0, "step": 2}])) == {"weights_step": 6, "weights_from_best": False}


# ---------------------------------------------------------------------------------------------------------------
# 5. TRL habits
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ppo", "mc"])
def test_top_k_zero_means_off(kind):
    from trl_collm import MultiAgentMCConfig, MultiAgentPPOConfig

    cls = MultiAgentPPOConfig if kind == "ppo" else MultiAgentMCConfig
    args = cls(output_dir="unused", use_cpu=True, bf16=False, report_to=[], top_k=0)
    assert args.top_k is None
    with pytest.raises(ValueError, match=r"`top_k` must be .* \(None or 0 switches it off\)"):
        cls(output_dir="unused", use_cpu=True, bf16=False, report_to=[], top_k=-1)


def length_reward(completions: list[str], **kwargs) -> list[float]:  # TRL / GRPO style: one text per sample
    return [float(len(c)) for c in completions]


def test_grpo_reward_functions_are_refused_unless_wrapped():
    from trl.rewards import think_format_reward

    from trl_collm.envs import RewardFunctionEnv

    for f in (length_reward, think_format_reward):
        with pytest.raises(ValueError) as info:
            RewardFunctionEnv([f], agent_names=["left", "right"])
        message = str(info.value)
        assert "\n" not in message and f"per_agent({f.__name__})" in message and "['left', 'right']" in message


def test_per_agent_scores_each_agent_text_with_a_grpo_function():
    from trl.rewards import think_format_reward

    from trl_collm.envs import RewardFunctionEnv, per_agent

    seen = {}

    def with_column(completions: list[str], answer, **kwargs):
        seen["answer"] = answer
        return [float(c == a) for c, a in zip(completions, answer)]

    env = RewardFunctionEnv(
        [per_agent(length_reward), per_agent(with_column), per_agent(think_format_reward)],
        formatters=[lambda r: "left", lambda r: "right"],
        reward_weights=[1.0, 10.0, 100.0],
    )
    env.reset_batch([{"answer": "yes"}, {"answer": "no"}], 2)
    out = env.step_batch([["yes", "<think>\nx\n</think>\ny"], ["no", "nope"]], [0, 1], 2)
    # length + 10 x (text == answer) + 100 x (think format), per agent: hand-computed
    assert out.rewards.tolist() == [[3.0 + 10.0, 20.0 + 100.0], [2.0 + 10.0, 4.0]]
    assert seen["answer"] == ["yes", "yes", "no", "no"]  # the columns repeated for every agent
    assert env.reward_func_names == ["length_reward", "with_column", "think_format_reward"]


def test_help_is_grouped_hides_refused_fields_and_is_kept(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRL_COLLM_CACHE=str(tmp_path))
    code = "import sys; from trl_collm.cli import main; main(['ppo', '--help']); print('torch' in sys.modules)"
    runs = [
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=HANG_GUARD_S
        )
        for _ in range(2)
    ]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    first, second = (r.stdout.rsplit("\n", 2) for r in runs)
    assert first[0] == second[0]  # the same text, ...
    assert first[1] == "True" and second[1] == "False"  # ... the second time without importing torch
    text = first[0]
    for group in ("\ntask:\n", "\nmodel:\n", "\nMultiAgentPPOConfig:\n", "\ntraining:\n"):
        assert group in text, group
    for hidden in ("--torch_compile", "--load_in_4bit", "--bnb_4bit_quant_type", "--fsdp "):
        assert hidden not in text, hidden
    for shown in ("--learning_rate", "--critic_type", "--use_peft", "--threads", "--task_options"):
        assert shown in text, shown
    assert len(text.splitlines()) < 800  # 1,013 lines before


def test_save_model_from_python_writes_the_card_and_no_absolute_path(tmp_path, monkeypatch, make_config, qwen_path):
    """trainer.save_model() writes README.md as the CLI does, and neither it nor team.json names the model's
    absolute folder; load_team still finds the LoRA team's base (recorded relative to the team folder)."""
    from datasets import Dataset
    from peft import LoraConfig

    from trl_collm import MultiAgentPPOTrainer
    from trl_collm.team.saved import load_team

    args = make_config(tmp_path, agent_names=["alice", "bob"], per_device_train_batch_size=2, total_episodes=2)
    trainer = MultiAgentPPOTrainer(
        args=args,
        model=qwen_path,
        train_dataset=Dataset.from_dict({"prompt": ["one two", "three four"]}),
        reward_funcs=lambda prompts, completions, **kw: [float(len(a) > len(b)) for a, b in completions],
        peft_config=LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"),
    )
    trainer.task_record = {"name": "mine", "ref": "my_tasks.py:TASK", "options": {}, "dataset_source": None}
    trainer.train()
    out = tmp_path / "saved"
    trainer.save_model(str(out))
    card, team_json = (out / "README.md").read_text(), (out / "team.json").read_text()
    assert "my_tasks.py:TASK" in card and "| alice |" in card  # the task as the CLI records it, and the agents' table
    for text in (card, team_json):
        assert os.path.dirname(qwen_path) not in text and str(tmp_path) not in text
    desc = json.loads(team_json)
    assert desc["base_model"] == os.path.relpath(qwen_path, out)
    assert desc["base"]["alice"]["model"] == desc["base_model"]
    monkeypatch.chdir(tmp_path.parent)  # resolved against the team folder, not the working directory
    assert load_team(str(out)).names == ["alice", "bob"]


def test_portable_model_refs(tmp_path):
    from trl_collm.team.saved import portable_model_ref, resolve_base_ref

    packaged = tmp_path / "smollm2-135m-instruct-0.1.0-12345"
    packaged.mkdir()
    assert portable_model_ref(str(packaged), str(tmp_path / "team")) == "smollm2-135m-instruct"
    base = tmp_path / "models" / "base"
    base.mkdir(parents=True)
    ref = portable_model_ref(str(base), str(tmp_path / "runs" / "team"))
    assert ref == os.path.join("..", "..", "models", "base")
    assert resolve_base_ref(ref, str(tmp_path / "runs" / "team")) == str(base)
    assert portable_model_ref("Qwen/Qwen2.5-0.5B", str(tmp_path)) == "Qwen/Qwen2.5-0.5B"  # a Hub id as is
