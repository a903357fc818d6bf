"""A saved team remembers its task and carries a portable card (team/card.py): eval defaults to the recorded task
and refuses another, card names are portable, the card's snippet plays with the training's task options, and the
card reports the evaluation of the saved weights."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

from test_cli_usability import _fake_team, _one_line_error

from trl_collm.cli import main

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
