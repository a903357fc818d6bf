"""The copies of frozen linear weights (trl_collm.cpu.autocast_cache): bf16 under CPU autocast, the same numbers as
plain autocast; packed for oneDNN in float32 decoding steps, the same up to rounding; made once per weight,
refreshed when the weight changes, and never used for a weight that trains."""

import pytest
import torch
from backward import forward_backward
from seeded_sampling import sample_with_scores
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


def _lora_qwen(path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(path),
        LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"]),
    )
    for name, p in model.named_parameters():  # non-zero B, so that the adapters' gradients reach their inputs
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    return model


def test_shared_input_casts_give_the_same_numbers_and_keep_one_copy(qwen_path):
    """q / k / v (and gate / up, and each LoRA A beside its base) read one bf16 copy of their float32 input: the
    logits and every LoRA gradient bitwise those of plain autocast, one cast copy kept per shared input."""
    plain, shared = _lora_qwen(qwen_path), _lora_qwen(qwen_path)
    cache_frozen_linears(shared)
    ids = torch.randint(5, 200, (3, 24), generator=torch.Generator().manual_seed(0))
    want, plain_bytes, want_grads = forward_backward(plain, ids, bf16=True)
    got, shared_bytes, got_grads = forward_backward(shared, ids, bf16=True)
    assert torch.equal(got, want)
    assert want_grads.keys() == got_grads.keys() and len(want_grads) == 2 * 3 * 2  # 2 layers x 3 modules x A, B
    for name, g in want_grads.items():
        assert torch.equal(got_grads[name], g), name
    # A frozen linear keeps no input for its backward (no weight gradient); a LoRA A does. Per layer, plain autocast
    # keeps A_q's and A_v's own casts of the attention input (and A_up's of the MLP input); shared, A_q and A_v keep
    # one copy: one bf16 copy of 32 values (64 B) less per token and layer, 2 layers x 72 tokens.
    assert plain_bytes - shared_bytes == 2 * 72 * 64


def test_a_changed_input_is_cast_again():
    net, plain = _net(), _net()
    cache_frozen_linears(net)
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        first = net[0](x)
        x.mul_(3.0)  # in place: a new version of the same tensor object, which the memo must not serve
        second = net[0](x)
        assert torch.equal(second, plain[0](x)) and not torch.equal(first, second)


def test_calls_without_a_graph_use_the_packed_weight_with_the_same_outputs():
    from trl_collm.cpu.autocast_cache import _can_prepack

    if not _can_prepack(torch.bfloat16):
        pytest.skip("this CPU's oneDNN does not run bf16 natively: the packed path is off")
    net, plain = _net(), _net()
    cache_frozen_linears(net)
    x = torch.randn(6, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with_graph = net(x.requires_grad_())  # a graph: F.linear on the bf16 copy, nothing packed
        assert getattr(net[0], "_autocast_packed", None) is None
        with torch.no_grad():
            packed = net(x)
        assert net[0]._autocast_packed is not None and net[0]._autocast_packed.is_mkldnn
        with torch.no_grad():
            want = plain(x)
    assert torch.equal(packed, want) and torch.equal(with_graph.detach(), want)


def _big_frozen(rows_in=512, rows_out=256):
    """A frozen layer large enough for the float32 packed path (512 x 256 = PACK_MIN_WEIGHT elements)."""
    torch.manual_seed(0)
    return nn.Linear(rows_in, rows_out).requires_grad_(False)


def test_float32_decoding_calls_use_a_packed_weight_with_the_outputs_up_to_rounding():
    from trl_collm.cpu.autocast_cache import PACK_MAX_ROWS, PACK_MIN_WEIGHT, _can_prepack

    if not _can_prepack(torch.float32):
        pytest.skip("no oneDNN linear in this torch build: the float32 packed path is off")
    layer, small = _big_frozen(), _net()
    assert layer.weight.numel() == PACK_MIN_WEIGHT
    plain = _big_frozen()
    cache_frozen_linears(layer)
    cache_frozen_linears(small)
    x = torch.randn(2, 8, 512)  # 16 rows: a decoding step's batch
    with torch.no_grad():
        got = layer(x)
        assert layer._autocast_packed.is_mkldnn and not hasattr(layer, "_autocast_copy")  # float32: no bf16 copy
        torch.testing.assert_close(got, plain(x), rtol=1e-5, atol=1e-6)
        small(torch.randn(16, 16))
        assert getattr(small[0], "_autocast_packed", None) is None  # too small to pay: F.linear, bitwise as before
        layer._autocast_packed = None
        wide = torch.randn(PACK_MAX_ROWS + 1, 512)  # more rows than a decoding step (a prefill): F.linear
        assert torch.equal(layer(wide), plain(wide)) and layer._autocast_packed is None
        layer(x)
        packed_once = layer._autocast_packed
        layer(x)
        assert layer._autocast_packed is packed_once  # made once, reused
        layer.weight.mul_(2.0)  # an in-place load: packed again from the new values
        plain.weight.mul_(2.0)
        torch.testing.assert_close(layer(x), plain(x), rtol=1e-5, atol=1e-6)
        assert layer._autocast_packed is not packed_once
    y = layer(x.clone().requires_grad_())  # a graph: F.linear, so that the input's gradient flows as before
    y.sum().backward()
    trained = _big_frozen().requires_grad_(True)
    cache_frozen_linears(trained)
    with torch.no_grad():
        trained(x)
    assert getattr(trained, "_autocast_packed", None) is None  # a weight that trains is never packed


def test_a_float32_model_decodes_the_same_tokens_with_its_large_weights_packed():
    """A Qwen2 of the "small" size (256 hidden, 688 MLP): its MLP weights are packed, its attention ones are not.
    Sampled with the same seed, the adapted model draws the same tokens, scores equal up to float rounding."""
    from transformers import AutoModelForCausalLM

    from trl_collm.cpu import adapt_for_cpu
    from trl_collm.cpu.autocast_cache import _can_prepack
    from trl_collm.testing import tiny_model_dir

    if not _can_prepack(torch.float32):
        pytest.skip("no oneDNN linear in this torch build: the float32 packed path is off")
    path = tiny_model_dir("small-qwen2", size="small")
    plain = AutoModelForCausalLM.from_pretrained(path).eval()
    adapted = AutoModelForCausalLM.from_pretrained(path).eval()
    adapted.requires_grad_(False)
    adapt_for_cpu(adapted)
    ids = torch.randint(5, 200, (4, 12), generator=torch.Generator().manual_seed(0))

    mask = torch.ones_like(ids)
    want_tokens, want_scores = sample_with_scores(plain, ids, mask, max_new_tokens=12)
    tokens, scores = sample_with_scores(adapted, ids, mask, max_new_tokens=12)
    mlp = adapted.model.layers[0].mlp
    assert mlp.up_proj._autocast_packed.is_mkldnn and mlp.down_proj._autocast_packed.is_mkldnn
    assert getattr(adapted.model.layers[0].self_attn.q_proj, "_autocast_packed", None) is None  # 256 x 256: plain
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(scores, want_scores, rtol=1e-4, atol=1e-4)
