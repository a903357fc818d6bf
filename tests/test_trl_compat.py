"""TRL's habits keep working: top_k=0 means off, GRPO-style reward functions are refused unless wrapped (then score
each agent's text), and `--help` is grouped, hides refused fields and is quick."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]


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
    # the user's kept copy (the shipped texts, which a fresh install reads first, are tests/test_cli_help_texts.py's)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRL_COLLM_CACHE=str(tmp_path), TRL_COLLM_NO_SHIPPED_HELP="1")
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
    assert len(text.splitlines()) < 830  # 1,013 lines before the refused fields were hidden; 801 with the plan switches
