"""Agent names: the one check (team/names.py) at every entry point: `agent_names`, the keys of a `model` dict
and a saved team.json."""

from __future__ import annotations

import json
import os
import re

import pytest

from trl_collm import MultiAgentPPOConfig


def _reward(prompts, completions, **kwargs):
    # completions[e] lists episode e's texts, one per agent: score the first agent's text (len(completions[e]),
    # the agents' count, would give every episode the same reward)
    return [float(len(c[0]) % 3) for c in completions]


BASE = dict(output_dir="unused", use_cpu=True, bf16=False, report_to=[])


# ---------------------------------------------------------------------------------------------------------------
# agent names: one check for agent_names, model={...} keys and team.json
# ---------------------------------------------------------------------------------------------------------------

BAD_NAMES = {
    "/tmp/elsewhere": "path separator",
    "x/y": "path separator",
    "x\\y": "path separator",
    "a\0b": "NUL",
    "a" * 300: "longer than",
    "v1.2": r"'\.'",
    ".": r"'\.'",
    "": "empty",
    "critic": "reserved",
}


@pytest.mark.parametrize("bad", list(BAD_NAMES), ids=[repr(n)[:20] for n in BAD_NAMES])
def test_agent_names_refused_in_the_config(bad):
    with pytest.raises(ValueError, match=r"`agent_names`.*" + BAD_NAMES[bad] + r".*set `agent_names`"):
        MultiAgentPPOConfig(**BASE, agent_names=["ok", bad])


@pytest.mark.parametrize("bad", ["/tmp/elsewhere", "x/y", "a\0b", "v1.2"], ids=["abs", "sep", "nul", "dot"])
def test_agent_names_refused_as_model_dict_keys(tmp_path, make_config, prompts_dataset, qwen_path, bad):
    from trl_collm import MultiAgentPPOTrainer

    args = make_config(tmp_path)
    with pytest.raises(ValueError, match=r"`model` \(a dict name -> model\).*" + BAD_NAMES[bad] + ".*`agent_names`"):
        MultiAgentPPOTrainer(
            args=args, model={"ok": qwen_path, bad: qwen_path}, train_dataset=prompts_dataset, reward_funcs=_reward
        )
    assert not (tmp_path / "out").exists() and not os.path.exists("/tmp/elsewhere")


def test_team_json_with_a_bad_agent_name_or_folder_is_refused(tmp_path):
    from trl_collm.team.saved import TEAM_FILE, read_team_file

    team = {"agents": ["a", "../b"], "layout": "separate", "agent_folders": {"a": "a", "../b": "../b"}}
    (tmp_path / TEAM_FILE).write_text(json.dumps(team))
    with pytest.raises(ValueError, match=re.escape(TEAM_FILE) + r".*'\.\./b'.*path separator"):
        read_team_file(str(tmp_path))
    team = {"agents": ["a", "b"], "layout": "separate", "agent_folders": {"a": "a", "b": "/etc"}}
    (tmp_path / TEAM_FILE).write_text(json.dumps(team))
    with pytest.raises(ValueError, match=re.escape(TEAM_FILE) + r".*'/etc'.*not the agents' own folders"):
        read_team_file(str(tmp_path))
