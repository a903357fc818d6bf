"""Presets are defaults (trainers/presets.py): a field the caller left alone holds a `PresetDefault`, which the
preset's value replaces; any value the caller gave wins, on every path, without reading who called."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest
import yaml
from transformers import HfArgumentParser
from trl import TrlParser

import trl_collm
from trl_collm import MC_PRESETS, PRESETS, MultiAgentMCConfig, MultiAgentPPOConfig
from trl_collm.trainers.presets import PresetDefault, check_presettable, plain

BASE = dict(output_dir="unused", use_cpu=True, bf16=False, report_to=[])
ARGV = ["--output_dir", "unused", "--use_cpu", "true", "--report_to", "none"]


def _parse(argv):
    (args,) = HfArgumentParser(MultiAgentPPOConfig).parse_args_into_dataclasses(ARGV + argv)
    return args


@pytest.mark.parametrize("cls", [MultiAgentPPOConfig, MultiAgentMCConfig])
@pytest.mark.parametrize("with_preset", [False, True])
def test_no_field_keeps_its_wrapper(cls, with_preset):
    preset = dict(preset=next(iter(cls.presets))) if with_preset else {}
    args = cls(**BASE, **preset)
    wrapped = [f.name for f in dataclasses.fields(args) if isinstance(getattr(args, f.name), PresetDefault)]
    assert wrapped == []
    if not with_preset:  # without a preset every wrapped field gets its plain default
        assert (args.gamma, args.temperature, args.max_grad_norm, args.weight_decay) == (1.0, 0.7, 1.0, 0.0)


@pytest.mark.parametrize("order", ["flag_first", "preset_first"])
def test_a_flag_at_its_default_beats_the_preset_wherever_it_stands(order):
    flags = ["--gamma", "1.0", "--scale_logits_by_temperature", "true"]
    args = _parse(flags + ["--preset", "collm"] if order == "flag_first" else ["--preset", "collm"] + flags)
    assert (args.gamma, args.scale_logits_by_temperature) == (1.0, True)  # given, at the defaults
    assert (args.lam, args.temperature, args.policy_loss_type) == (0.0, 0.6, "reinforce")  # the preset's


def test_parse_dict_and_replace_keep_what_was_given():
    (args,) = HfArgumentParser(MultiAgentPPOConfig).parse_dict(dict(BASE, preset="collm", vf_coef=0.1))
    assert args.vf_coef == 0.1 and args.lam == 0.0
    # replace() passes every field as a plain value: the preset is not applied a second time over them
    again = dataclasses.replace(MultiAgentPPOConfig(**BASE, preset="collm", lam=0.5), gamma=1.0)
    assert (again.lam, again.gamma, again.temperature) == (0.5, 1.0, 0.6)


def test_help_shows_plain_defaults():
    text = HfArgumentParser(MultiAgentPPOConfig).format_help()
    assert "PresetDefault" not in text and "(default: 0.95)" in text  # lam


def test_a_preset_naming_an_unwrapped_field_is_refused_at_definition():
    with pytest.raises(TypeError, match=r"preset 'x' sets 'response_length'.*PresetDefault"):
        check_presettable(MultiAgentPPOConfig, {"x": {"response_length": 8}})
    with pytest.raises(TypeError, match=r"'no_such_field', which is not a field of MultiAgentMCConfig"):
        check_presettable(MultiAgentMCConfig, {"x": {"no_such_field": 1}})
    check_presettable(MultiAgentPPOConfig, PRESETS)  # today's presets pass (as they do at import)
    check_presettable(MultiAgentMCConfig, MC_PRESETS)


def test_no_code_reads_a_callers_frame_and_no_config_reads_argparse_internals():
    root = pathlib.Path(trl_collm.__file__).parent
    words = {p: ("_getframe", "f_locals", "f_back") for p in root.rglob("*.py")}
    for p in (root / "trainers").glob("*.py"):
        words[p] += ("._actions", "parse_known_args")
    hits = [f"{p.relative_to(root)}: {w}" for p, ws in words.items() for w in ws if w in p.read_text()]
    assert hits == []


# Each field set explicitly to the library's default: the preset would otherwise replace it.
COLLM_AT_DEFAULTS = dict(centralized_value="per_agent_heads", policy_loss_type="ppo", gamma=1.0, kl_coef=0.05)
MAGRPO_AT_DEFAULTS = dict(gamma=1.0, temperature=0.7, beta=0.0, top_p=1.0)


def _defaults(cls, names):
    # a field a preset may fill holds its default wrapped (trainers/presets.py)
    return {f.name: plain(f.default) for f in cls.__dataclass_fields__.values() if f.name in names}


# ---------------------------------------------------------------------------------------------------------------
# a preset never overrides what the user set
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls,preset,explicit",
    [(MultiAgentPPOConfig, "collm", COLLM_AT_DEFAULTS), (MultiAgentMCConfig, "magrpo", MAGRPO_AT_DEFAULTS)],
)
def test_a_field_set_to_its_default_beats_the_preset(cls, preset, explicit):
    assert _defaults(cls, explicit) == explicit  # the point: each value is the library default
    preset_values = cls.presets[preset]
    assert any(preset_values[k] != v for k, v in explicit.items() if k in preset_values)
    args = cls(**BASE, preset=preset, **explicit)
    assert {k: getattr(args, k) for k in explicit} == explicit
    # the fields left unset still get the preset's values
    bare = cls(**BASE, preset=preset)
    for key, value in preset_values.items():
        if key not in explicit and key != "centralized_value":
            assert getattr(args, key) == value == getattr(bare, key), key


def test_preset_on_the_command_line_keeps_flags_and_yaml_keys_at_default_values(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(dict(preset="collm", kl_coef=0.05, gamma=1.0, use_cpu=True, report_to="none")))
    argv = ["--output_dir", str(tmp_path), "--config", str(config), "--policy_loss_type", "ppo"]
    (args,) = TrlParser(MultiAgentPPOConfig).parse_args_and_config(argv)
    assert (args.kl_coef, args.gamma, args.policy_loss_type) == (0.05, 1.0, "ppo")
    assert args.temperature == 0.6 and args.lam == 0.0  # not given: the preset's
    # a plain HfArgumentParser command line (no YAML)
    from transformers import HfArgumentParser

    argv = ["--output_dir", str(tmp_path), "--preset", "collm", "--gamma", "1.0", "--use_cpu", "true"]
    (args,) = HfArgumentParser(MultiAgentPPOConfig).parse_args_into_dataclasses(argv + ["--report_to", "none"])
    assert args.gamma == 1.0 and args.kl_coef == 0.0 and args.temperature == 0.6


# ---------------------------------------------------------------------------------------------------------------
# 5. the collm preset is the reference rule, team value included
# ---------------------------------------------------------------------------------------------------------------


def test_collm_preset_trains_one_team_value():
    args = MultiAgentPPOConfig(**BASE, preset="collm")
    assert args.centralized_value == "team"
    assert (
        MultiAgentPPOConfig(**BASE, preset="collm", centralized_value="agent_tagged").centralized_value
        == "agent_tagged"
    )
    # per-agent rewards need a value per agent: the preset leaves the default there instead of failing
    assert MultiAgentPPOConfig(**BASE, preset="collm", reward_type="per_agent").centralized_value == "per_agent_heads"
