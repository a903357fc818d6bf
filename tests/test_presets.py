"""Presets are defaults (trainers/presets.py): a field the caller left alone holds a `PresetDefault`, which the
preset's value replaces; any value the caller gave wins, on every path, without reading who called."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest
from transformers import HfArgumentParser

import trl_collm
from trl_collm import MC_PRESETS, PRESETS, MultiAgentMCConfig, MultiAgentPPOConfig
from trl_collm.trainers.presets import PresetDefault, check_presettable

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
