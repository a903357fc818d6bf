"""GRPOConfig's names on MultiAgentMCConfig: the ones that hold for a team set our fields (hand-computed), the ones
that do not are refused in one line naming the equivalent; docs/from-grpo.md carries the field table."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trl_collm import MultiAgentMCConfig
from trl_collm.testing import CPU_RUN_SETTINGS
from trl_collm.trainers import grpo_fields

ROOT = Path(__file__).resolve().parents[1]


def _config(**kw):
    return MultiAgentMCConfig(**dict(CPU_RUN_SETTINGS, output_dir="/tmp/unused-grpo-config"), **kw)


def test_max_completion_length_is_response_length():
    c = _config(max_completion_length=12)
    assert (c.response_length, c.max_completion_length) == (12, 12)
    assert _config(response_length=9).max_completion_length == 9
    with pytest.raises(ValueError, match=r"`max_completion_length`=12 and `response_length`=9 .*set one of them"):
        _config(max_completion_length=12, response_length=9)
    assert dataclasses.replace(c).response_length == 12  # a resolved config copies as it is


@pytest.mark.parametrize(
    "given,expected", [("group", "group"), ("batch", "batch"), ("none", "none"), (True, "group"), ("false", "none")]
)
def test_scale_rewards_takes_grpos_spellings(given, expected):
    assert _config(scale_rewards=given).scale_rewards == expected


def test_scale_rewards_and_scale_advantages_are_one_choice():
    with pytest.raises(ValueError, match="set one of them"):
        _config(scale_rewards="group", scale_advantages=True)
    with pytest.raises(ValueError, match="'group', 'batch', 'none'"):
        _config(scale_rewards="sometimes")


def test_generation_size_sets_the_minibatches():
    # a micro-batch: 2 prompts x 4 completions = 8 completions per agent; 2 of them accumulate into a step
    c = _config(per_device_train_batch_size=2, num_generations=4, gradient_accumulation_steps=2, steps_per_generation=6)
    assert c.num_mini_batches == 3
    c = _config(
        per_device_train_batch_size=2, num_generations=4, gradient_accumulation_steps=2, generation_batch_size=32
    )
    assert c.num_mini_batches == 2  # 32 / 8 = 4 micro-batches, 2 per step
    with pytest.raises(ValueError, match="must be a multiple of .* = 8"):
        _config(per_device_train_batch_size=2, num_generations=4, generation_batch_size=12)
    with pytest.raises(ValueError, match="set one of them"):
        _config(generation_batch_size=8, steps_per_generation=2)
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps \(2\)"):
        _config(gradient_accumulation_steps=2, steps_per_generation=3)


@pytest.mark.parametrize("loss_type,nearest", sorted(grpo_fields.OTHER_GRPO_LOSS_TYPES.items()))
def test_grpo_loss_types_not_here_name_the_nearest(loss_type, nearest):
    with pytest.raises(ValueError) as info:
        _config(loss_type=loss_type)
    assert "\n" not in str(info.value) and f"loss_type={nearest!r}" in str(info.value)


def test_grpo_only_fields_need_a_grpo_loss():
    assert _config(loss_type="dapo", epsilon_high=0.28, delta=1.5).epsilon_high == 0.28
    with pytest.raises(ValueError, match="applies to GRPO's loss types"):
        _config(loss_type="clipped", epsilon_high=0.28)


def test_every_refused_grpo_field_is_refused_in_one_line_naming_the_equivalent():
    refused = [n for n, (status, _) in grpo_fields.GRPO_FIELDS.items() if status == grpo_fields.REFUSED]
    fields = {f.name: f for f in dataclasses.fields(MultiAgentMCConfig)}
    examples = {"pad_to_multiple_of": 64, "importance_sampling_level": "sequence"}
    examples |= {"chat_template_kwargs": {"a": 1}, "multi_objective_aggregation": "normalize_then_sum"}
    examples |= {"cache_implementation": "static", "vllm_server_host": "1.2.3.4", "log_completions_hub_repo": "me/x"}
    examples |= {"vllm_structured_outputs_regex": "x", "vllm_server_base_url": "http://x"}
    checked = 0
    for name in refused:
        assert name in fields, name  # parsed, so TRL's script does not drop the flag
        default = grpo_fields.refused_default(name)
        if name in examples:
            value = examples[name]
        elif isinstance(default, bool):
            value = not default
        elif isinstance(default, (int, float)):
            value = default + 2
        else:
            value = 3  # an unset number (None)
        with pytest.raises(ValueError) as info:
            _config(**{name: value})
        message = str(info.value)
        assert "\n" not in message and f"`{name}`=" in message and grpo_fields.GRPO_FIELDS[name][1] in message
        checked += 1
    assert checked == len(refused) > 35


def test_every_grpo_field_has_a_row_and_the_doc_carries_the_table():
    from transformers import TrainingArguments
    from trl import GRPOConfig

    theirs = {f.name for f in dataclasses.fields(GRPOConfig)} - {f.name for f in dataclasses.fields(TrainingArguments)}
    assert theirs <= set(grpo_fields.GRPO_FIELDS), sorted(theirs - set(grpo_fields.GRPO_FIELDS))
    mine = {f.name for f in dataclasses.fields(MultiAgentMCConfig)}
    assert set(grpo_fields.GRPO_FIELDS) <= mine, sorted(set(grpo_fields.GRPO_FIELDS) - mine)
    doc = (ROOT / "docs" / "from-grpo.md").read_text()
    assert grpo_fields.markdown_table() in doc, "regenerate the table in docs/from-grpo.md (grpo_fields.markdown_table)"


def test_grpo_sampling_fields_are_accepted_and_reach_the_sampler():
    """min_p, repetition_penalty and generation_kwargs (a JSON object's text from the command line) are GRPO's
    settings here too; a bad value is refused naming the field."""
    from trl_collm.generation.sampler import SamplingSettings

    config = _config(min_p=0.05, repetition_penalty=1.3, generation_kwargs='{"typical_p": 0.9}')
    assert config.generation_kwargs == {"typical_p": 0.9}
    settings = SamplingSettings.from_config(config)
    assert (settings.min_p, settings.repetition_penalty, settings.generation_kwargs) == (0.05, 1.3, {"typical_p": 0.9})
    assert SamplingSettings.from_config(_config()).min_p == 0.0  # GRPO's None: off
    with pytest.raises(ValueError, match=r"^`min_p` must be in \[0, 1\], got 1.5"):
        _config(min_p=1.5)
    with pytest.raises(
        ValueError,
        match=r"^`generation_kwargs` sets 'max_new_tokens', a setting of its own here: set "
        r"response_length",
    ):
        _config(generation_kwargs={"max_new_tokens": 9})
