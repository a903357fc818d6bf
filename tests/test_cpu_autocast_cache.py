"""The bf16 copies of frozen linear weights under CPU autocast (trl_collm.cpu.autocast_cache): the same numbers as
plain autocast, made once per weight, refreshed when the weight changes, and never used for a weight that trains."""

import torch
from torch import nn

from trl_collm.cpu.autocast_cache import cache_frozen_linears


def _net(seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8, bias=False))
    net.requires_grad_(False)
    return net


def test_outputs_are_bitwise_those_of_plain_autocast_and_the_copy_is_made_once():
    plain, cached = _net(), _net()
    assert cache_frozen_linears(cached) == 2
    x = torch.randn(5, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = plain(x)
        got = cached(x)
        copy = cached[0]._autocast_copy
        again = cached(x)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want) and torch.equal(again, want)
    assert cached[0]._autocast_copy is copy  # made at the first call, reused after
    assert copy.dtype == torch.bfloat16 and torch.equal(copy, cached[0].weight.to(torch.bfloat16))
    assert torch.equal(cached(x), plain(x)) and cached(x).dtype == torch.float32  # no autocast: float32 as before


def test_an_in_place_change_of_the_weight_refreshes_the_copy():
    net = _net()
    cache_frozen_linears(net)
    x = torch.randn(3, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = net(x)
        with torch.no_grad():
            net[0].weight.mul_(2.0)  # e.g. a state dict loaded into the frozen base
        after = net(x)
        want = _net().requires_grad_(False)
        with torch.no_grad():
            want[0].weight.mul_(2.0)
        assert torch.equal(after, want(x)) and not torch.equal(after, before)


def test_a_weight_that_trains_keeps_autocasts_own_path_and_its_gradient():
    net = _net()
    net[0].weight.requires_grad_(True)
    cache_frozen_linears(net)
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        net(x).float().sum().backward()
    assert net[0].weight.grad is not None and net[0].weight.grad.abs().sum() > 0
    assert not hasattr(net[0], "_autocast_copy") and hasattr(net[2], "_autocast_copy")


def _train_lora_team_in_bf16(tmp_path, qwen_path, prompts_dataset):
    from peft import LoraConfig

    from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer
    from trl_collm.testing import CPU_RUN_SETTINGS

    args = MultiAgentPPOConfig(
        output_dir=str(tmp_path),
        num_agents=2,
        response_length=5,
        total_episodes=8,
        per_device_train_batch_size=4,
        seed=0,
        **{**CPU_RUN_SETTINGS, "bf16": True},
    )
    trainer = MultiAgentPPOTrainer(
        args=args,
        model=qwen_path,
        train_dataset=prompts_dataset,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        reward_funcs=lambda prompts, completions, **kw: [float(len(c[0]) % 3) for c in completions],
    )
    trainer.train()
    return trainer, torch.cat([p.detach().flatten() for p in trainer.team.parameters() if p.requires_grad])


def test_a_bf16_lora_team_on_cpu_trains_to_the_weights_of_plain_autocast(
    tmp_path, qwen_path, prompts_dataset, monkeypatch
):
    trainer, cached = _train_lora_team_in_bf16(tmp_path / "cached", qwen_path, prompts_dataset)
    frozen = [m for m in trainer.team.modules() if isinstance(m, nn.Linear) and not m.weight.requires_grad]
    assert frozen and all(hasattr(m, "_autocast_copy") for m in frozen)  # the base's layers used their copies
    import trl_collm.cpu as cpu

    monkeypatch.setattr(cpu, "cache_frozen_linears", lambda module: 0)
    _, plain = _train_lora_team_in_bf16(tmp_path / "plain", qwen_path, prompts_dataset)
    assert torch.equal(cached, plain)
