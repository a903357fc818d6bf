"""A hand-edited team.json is checked when it is read (team/saved.py): a bad setting is refused by `load_team` (and
`trl-collm play`) in one message naming the file, the field, the value and what is allowed, never later as a raw
TypeError / AttributeError at play."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from test_numerics import ok_reward

from trl_collm.team import saved


@pytest.fixture(scope="module")
def saved_folder(tmp_path_factory, qwen_path):
    from conftest import CPU_DEFAULTS

    from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer

    root = tmp_path_factory.mktemp("team-json")
    args = MultiAgentPPOConfig(output_dir=str(root / "out"), agent_names=["writer", "editor"], **CPU_DEFAULTS)
    prompts = [{"prompt": p} for p in ["a b", "c d", "e f", "g h"]]
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts, reward_funcs=ok_reward)
    tr.save_model(str(root / "team"))
    return root / "team"


@pytest.fixture
def team_copy(saved_folder, tmp_path):
    folder = tmp_path / "team"
    shutil.copytree(saved_folder, folder)
    return folder


def _edit(folder, section, key, value):
    path = folder / "team.json"
    desc = json.loads(path.read_text())
    if section is None:
        desc[key] = value
    else:
        desc[section][key] = value
    path.write_text(json.dumps(desc))
    return path


@pytest.mark.parametrize(
    "section,key,value,field,allowed",
    [
        ("generation", "temperature", "0.7", "generation.temperature", "a number > 0"),
        ("generation", "top_p", 2, "generation.top_p", "a number in (0, 1]"),
        ("generation", "response_length", 0, "generation.response_length", "an integer >= 1"),
        ("generation", "stop_token_id", "eos", "generation.stop_token_id", "null, a token id"),
        ("prompts", "max_prompt_length", {"writer": "lots"}, "prompts.max_prompt_length.writer", "an integer >= 1"),
        ("prompts", "max_prompt_length", "512", "prompts.max_prompt_length", "an object agent -> value"),
        ("prompts", "max_prompt_length", {"nobody": 8}, "prompts.max_prompt_length", "keyed by the team's agents"),
        ("prompts", "agent_context", "everything", "prompts.agent_context", "one of ['observation', 'history']"),
        ("prompts", "chat_templates", {"writer": 3}, "prompts.chat_templates.writer", "a string or null"),
        ("generation", "min_p", 2, "generation.min_p", "a number in [0, 1]"),
        ("generation", "repetition_penalty", "1.2", "generation.repetition_penalty", "a number > 0"),
        ("generation", "generation_kwargs", [1], "generation.generation_kwargs", "an object of generate()"),
        (None, "generation", [1, 2], "generation", "an object of settings"),
        (None, "num_turns", "two", "num_turns", "an integer >= 1"),
        (None, "base_model", 5, "base_model", "the path or Hub id"),
    ],
)
def test_load_team_refuses_a_bad_setting_naming_file_field_value_and_what_is_allowed(
    team_copy, section, key, value, field, allowed
):
    from trl_collm.inference import load_team

    path = _edit(team_copy, section, key, value)
    with pytest.raises(ValueError) as info:
        load_team(str(team_copy))
    message = str(info.value)
    shown = value["writer"] if field.endswith(".writer") else value  # a per-agent entry: that agent's value
    for part in (str(path), repr(field), repr(shown), allowed):
        assert part in message, (part, message)


def test_the_saved_team_loads_back_and_plays_with_its_checked_settings(team_copy):
    from trl_collm.inference import load_team, saved_prompts, saved_settings

    team = load_team(str(team_copy))
    assert team.names == ["writer", "editor"]
    assert saved_prompts(str(team_copy)).agent_context == "observation"
    assert saved_settings(str(team_copy), greedy=False).max_new_tokens == 6
    _edit(team_copy, "prompts", "agent_context", "history")  # the other allowed value
    assert saved_prompts(str(team_copy)).agent_context == "history"


def test_the_allowed_agent_contexts_are_the_prompt_settings_ones():
    from trl_collm.generation.prompts import AGENT_CONTEXTS

    assert saved.AGENT_CONTEXTS == AGENT_CONTEXTS


def test_play_says_a_bad_team_json_in_one_line(team_copy, capsys):
    from trl_collm.cli import main

    path = _edit(team_copy, "generation", "temperature", "hot")
    code = main(["play", "--team_dir", str(team_copy), "--task", "coord-penalty", "--limit", "1"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert re.search(re.escape(str(path)) + r".*'generation\.temperature' is 'hot'.*a number > 0", err), err
