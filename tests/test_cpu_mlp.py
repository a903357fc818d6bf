"""The lean gated MLP (trl_collm.cpu.mlp): the same outputs and gradients bitwise as transformers' MLP, in float32
and under CPU bf16 autocast, one intermediate activation less kept for the backward, only gated SiLU MLPs switched,
and the trainers switching it on for CPU runs."""

import pytest
import torch
from backward import forward_backward
from torch import nn
from transformers import AutoModelForCausalLM

from trl_collm.cpu.mlp import SiluMul, use_lean_mlp


def _pair(path):
    plain = AutoModelForCausalLM.from_pretrained(path)
    lean = AutoModelForCausalLM.from_pretrained(path)
    assert use_lean_mlp(lean) == lean.config.num_hidden_layers  # one MLP per layer
    assert use_lean_mlp(lean) == 0  # switched once
    return plain, lean


@pytest.mark.parametrize("bf16", [False, True])
def test_same_numbers_bitwise_and_one_activation_less(qwen_path, bf16):
    plain, lean = _pair(qwen_path)
    ids = torch.randint(5, 200, (3, 24), generator=torch.Generator().manual_seed(0))
    want, plain_bytes, want_grads = forward_backward(plain, ids, bf16)
    got, lean_bytes, got_grads = forward_backward(lean, ids, bf16)
    assert torch.equal(got, want)
    for name, g in want_grads.items():
        assert torch.equal(got_grads[name], g), name
    # silu(gate) is no longer kept: intermediate size 64 x (4 B float32 | 2 B bf16) per token, 72 tokens, 2 layers.
    assert plain_bytes - lean_bytes == 2 * 72 * 64 * (2 if bf16 else 4)


def test_silu_mul_gradients_against_autograd():
    g = torch.Generator().manual_seed(1)
    gate, up = (torch.randn(5, 7, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(SiluMul.apply, (gate, up))
    up_only = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    SiluMul.apply(gate.detach(), up_only).sum().backward()
    torch.testing.assert_close(up_only.grad, nn.functional.silu(gate.detach()))


def test_other_mlps_are_left_alone(qwen_path):
    model = AutoModelForCausalLM.from_pretrained(qwen_path)
    for layer in model.model.layers:
        layer.mlp.act_fn = nn.GELU()  # not SiLU: the product would be another function
    assert use_lean_mlp(model) == 0

    class Other(nn.Module):  # the right attribute names, another forward
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2)
            self.act_fn = nn.SiLU()

    assert use_lean_mlp(Other()) == 0


def test_the_trainer_switches_it_on(tmp_path, qwen_path, prompts_dataset):
    from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer
    from trl_collm.testing import CPU_RUN_SETTINGS

    args = MultiAgentPPOConfig(
        output_dir=str(tmp_path),
        num_agents=2,
        response_length=4,
        total_episodes=4,
        per_device_train_batch_size=4,
        **CPU_RUN_SETTINGS,
    )
    trainer = MultiAgentPPOTrainer(
        args=args,
        model=qwen_path,
        train_dataset=prompts_dataset,
        reward_funcs=lambda prompts, completions, **kw: [1.0] * len(completions),
    )
    mlps = [m for m in trainer.team.modules() if type(m).__name__ == "Qwen2MLP"]
    assert mlps and all(getattr(m, "_lean_mlp", False) for m in mlps)
