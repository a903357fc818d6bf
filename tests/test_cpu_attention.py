"""CPU attention (trl_collm.cpu.attention): float32 under CPU bf16 autocast (closer to float32 than bf16 attention,
left padding still masked), grouped query heads without key / value copies (float32 outputs bitwise transformers'
`sdpa`, gradients equal up to rounding, less kept for the backward), the switch not written into saved configs, and
the trainers turning it on for every CPU run."""

import json

import torch
from backward import forward_backward
from transformers import AutoModelForCausalLM

from trl_collm.cpu.attention import NAME, use_cpu_attention


def _models(path):
    plain = AutoModelForCausalLM.from_pretrained(path).eval()
    f32 = AutoModelForCausalLM.from_pretrained(path).eval()
    assert plain.config._attn_implementation == "sdpa"
    assert use_cpu_attention(f32) == 1 and f32.config._attn_implementation == NAME
    return plain, f32


def _batch(n=3, length=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 200, (n, length), generator=g)
    mask = torch.ones(n, length, dtype=torch.long)
    mask[1, :7] = 0  # left padding
    mask[2, :3] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos


def test_float32_runs_are_bitwise_transformers_sdpa(qwen_path):
    plain, f32 = _models(qwen_path)
    assert f32.config.num_attention_heads > f32.config.num_key_value_heads  # grouped heads: the path that changed
    ids, mask, pos = _batch()
    with torch.no_grad():
        assert torch.equal(
            plain(input_ids=ids, attention_mask=mask, position_ids=pos).logits,
            f32(input_ids=ids, attention_mask=mask, position_ids=pos).logits,
        )


def test_grouped_heads_keep_less_and_give_the_same_gradients(qwen_path):
    plain, f32 = _models(qwen_path)
    ids, mask, pos = _batch()
    _, plain_bytes, want = forward_backward(plain, ids, attention_mask=mask, position_ids=pos)
    _, grouped_bytes, got = forward_backward(f32, ids, attention_mask=mask, position_ids=pos)
    # The tiny Qwen2 (4 query heads, 2 key / value heads, head size 8, 2 layers, 3 x 24 tokens): transformers keeps
    # float32 keys and values copied to 4 heads, 2 x 4 x 8 x 4 B per token and layer; grouped keeps them at 2 heads:
    # 2 x 2 x 8 x 4 B = 128 B less per token and layer. And one additive float32 mask (3 x 1 x 24 x 24) for both
    # layers instead of one per layer (the kernel's own conversion of the boolean mask, which autograd keeps).
    assert plain_bytes - grouped_bytes == 2 * 72 * 128 + (2 - 1) * 3 * 24 * 24 * 4
    for name, g in want.items():  # the key / value gradients are summed over each group inside the kernel
        torch.testing.assert_close(got[name], g, rtol=1e-5, atol=1e-6, msg=name)


def test_under_bf16_autocast_attention_is_float32_and_padding_stays_masked(qwen_path):
    plain, f32 = _models(qwen_path)
    ids, mask, pos = _batch()
    with torch.no_grad():
        want = plain(input_ids=ids, attention_mask=mask, position_ids=pos).logits  # float32 everywhere
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16_attn = plain(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
            f32_attn = f32(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
            # row 1 alone, without its pads: the same numbers up to bf16 rounding of the linear layers
            alone = f32(input_ids=ids[1:2, 7:]).logits.float()
    real = mask.bool()
    err_bf16 = (bf16_attn - want).abs()[real].mean()
    err_f32 = (f32_attn - want).abs()[real].mean()
    assert not torch.equal(bf16_attn, f32_attn)  # the switch changed the kernel's dtype
    assert err_f32 < err_bf16  # and moved the logits towards float32's
    # A dropped padding mask would let row 1 attend to its 7 pad tokens: errors of order 1, not bf16 rounding.
    assert (alone[0] - f32_attn[1, 7:]).abs().max() < 0.1 * (want[1, 7:].abs().max())
    assert (alone[0] - f32_attn[1, 7:]).abs().mean() < 2 * err_bf16


def test_gradients_flow_through_the_float32_attention(qwen_path):
    _, f32 = _models(qwen_path)
    ids, mask, pos = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        f32(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float().logsumexp(-1).sum().backward()
    q = f32.model.layers[0].self_attn.q_proj.weight.grad
    assert q is not None and torch.isfinite(q).all() and q.abs().sum() > 0


def test_a_saved_model_does_not_carry_the_switch(qwen_path, tmp_path):
    _, f32 = _models(qwen_path)
    f32.save_pretrained(tmp_path)
    assert NAME not in (tmp_path / "config.json").read_text()
    json.loads((tmp_path / "config.json").read_text())
    assert AutoModelForCausalLM.from_pretrained(tmp_path).config._attn_implementation == "sdpa"


def test_the_trainer_switches_every_cpu_run(tmp_path, qwen_path, prompts_dataset):
    from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer
    from trl_collm.testing import CPU_RUN_SETTINGS

    seen = {}
    for bf16 in (False, True):
        args = MultiAgentPPOConfig(
            output_dir=str(tmp_path / str(bf16)),
            num_agents=2,
            response_length=4,
            total_episodes=4,
            per_device_train_batch_size=4,
            **{**CPU_RUN_SETTINGS, "bf16": bf16},
        )
        trainer = MultiAgentPPOTrainer(
            args=args,
            model=qwen_path,
            train_dataset=prompts_dataset,
            reward_funcs=lambda prompts, completions, **kw: [1.0] * len(completions),
        )
        models = [trainer.team.model_of(a) for a in trainer.team.names] + [trainer.critic]
        seen[bf16] = {m.config._attn_implementation for mod in models for m in mod.modules() if hasattr(m, "config")}
    assert seen[False] == {NAME} and seen[True] == {NAME}


def test_one_additive_mask_per_forward_changes_no_bit(qwen_path, monkeypatch):
    """The boolean mask converted once and shared by the layers (`additive_mask`) against the kernel converting it
    at every layer: bitwise the same outputs and gradients, float32 and under bf16 autocast, one mask kept instead of
    one per layer."""
    import trl_collm.cpu.attention as attention

    _, f32 = _models(qwen_path)
    ids, mask, pos = _batch()
    layers = f32.config.num_hidden_layers
    mask_bytes = 3 * 24 * 24 * 4
    for autocast in (False, True):
        runs = []
        for shared in (True, False):
            if not shared:  # the mask passed on as it came: the kernel converts it per call
                monkeypatch.setattr(attention, "additive_mask", lambda m, dtype: m)
            runs.append(forward_backward(f32, ids, bf16=autocast, attention_mask=mask, position_ids=pos))
            monkeypatch.undo()
        (out_s, bytes_s, grads_s), (out_p, bytes_p, grads_p) = runs
        assert torch.equal(out_s, out_p)
        assert grads_s.keys() == grads_p.keys() and all(torch.equal(grads_s[k], grads_p[k]) for k in grads_s)
        assert bytes_p - bytes_s == (layers - 1) * mask_bytes


def test_additive_mask_matches_the_kernels_conversion():
    from trl_collm.cpu.attention import additive_mask

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(3))
    mask = torch.rand(2, 1, 5, 5, generator=g) > 0.3
    mask[..., 0] = True  # every query row sees a key
    converted = additive_mask(mask, torch.float32)
    assert (
        converted.dtype == torch.float32 and torch.equal(converted == 0, mask) and torch.isinf(converted[~mask]).all()
    )
    assert additive_mask(mask, torch.float32) is converted  # the memo: one tensor per mask
    mask[0, 0, 0, 1] = ~mask[0, 0, 0, 1]  # an in-place change is a new mask
    assert additive_mask(mask, torch.float32) is not converted
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert torch.equal(sdpa(q, k, v, attn_mask=mask), sdpa(q, k, v, attn_mask=additive_mask(mask, torch.float32)))
    assert additive_mask(None, torch.float32) is None
