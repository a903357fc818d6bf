"""Mixed-adapter LoRA batches as stacked matmuls (trl_collm.cpu.lora_mixed): the same outputs, gradients and sampled
tokens as PEFT's adapter-by-adapter path, rebuilt after the weights change, PEFT's path kept where it must."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from trl_collm.cpu.lora_mixed import stack_mixed_lora_batches, stacks_kept
from trl_collm.testing import tiny_model_dir

NAMES = ["alice", "bob", "__base__", "bob", "alice"]


def _team(rank_bob: int = 4):
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir())
    cfg = dict(lora_alpha=8, target_modules=["q_proj", "v_proj"])
    model = get_peft_model(base, LoraConfig(r=4, **cfg), adapter_name="alice")
    model.add_adapter("bob", LoraConfig(r=rank_bob, **cfg))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:  # lora_B starts at zero: random values so every adapter changes the outputs
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
                p.requires_grad_(True)  # PEFT trains the active adapter only; a team trains each of them
    return model.eval()


def _inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randint(5, 200, (len(NAMES), 9), generator=g)


def _logits(model, ids, names=NAMES):
    return model(input_ids=ids, adapter_names=names).logits


def test_stacked_batches_give_peft_outputs_row_by_row_base_rows_included():
    model, ids = _team(), _inputs()
    with torch.no_grad():
        plain = _logits(model, ids)
        assert stack_mixed_lora_batches(model) == 2 * len(model.base_model.model.model.layers)  # q_proj, v_proj
        stacked = _logits(model, ids)
        with model.disable_adapter():
            base = model(input_ids=ids).logits
    torch.testing.assert_close(stacked, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stacked[2], base[2], rtol=1e-5, atol=1e-5)  # "__base__" rows get no adapter
    assert not torch.allclose(stacked[0], stacked[1], atol=1e-3)  # the adapters really differ


def test_under_cpu_bf16_autocast_the_outputs_match_peft_to_bf16_rounding():
    model, ids = _team(), _inputs()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        plain = _logits(model, ids).float()
        stack_mixed_lora_batches(model)
        stacked = _logits(model, ids).float()
    torch.testing.assert_close(stacked, plain, rtol=2e-2, atol=2e-2)


def test_stacks_are_kept_within_a_decoding_pass_only_and_gradients_match_peft():
    model, ids = _team(), _inputs()
    stack_mixed_lora_batches(model)
    layers = [m for m in model.modules() if hasattr(m, "_collm_stacked")]

    def stacks():
        return [m._collm_stacked_weights for m in layers]

    with torch.no_grad():
        with stacks_kept():
            before = _logits(model, ids)
            first = stacks()
            _logits(model, ids)
            assert all(a is b for a, b in zip(first, stacks())) and first[0] is not None  # stacked once per pass
        _logits(model, ids)
        assert all(kept is None for kept in stacks())  # outside a pass nothing is kept
        for name, p in model.named_parameters():
            if "lora_B" in name and "bob" in name:
                p.data.add_(
                    0.5
                )  # a write no version counter sees (as DeepSpeed's optimizer writes): a new pass sees it
        with stacks_kept():
            after = _logits(model, ids)
    assert not torch.allclose(after[1], before[1], atol=1e-3) and torch.allclose(after[0], before[0], atol=1e-6)
    plain_model = _team()
    with torch.no_grad():
        for (_, p), (_, q) in zip(model.named_parameters(), plain_model.named_parameters()):
            q.copy_(p)
        torch.testing.assert_close(after, _logits(plain_model, ids), rtol=1e-5, atol=1e-5)
    for m in (model, plain_model):
        m.zero_grad()
        _logits(m, ids).square().mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    plain_grads = {n: p.grad for n, p in plain_model.named_parameters() if p.grad is not None}
    assert grads.keys() == plain_grads.keys() and any("bob" in n for n in grads)
    for n in grads:
        torch.testing.assert_close(grads[n], plain_grads[n], rtol=1e-4, atol=1e-6)


def test_generate_samples_the_same_tokens_as_peft_mixed_batches():
    model, ids = _team(), _inputs()
    kwargs = dict(max_new_tokens=12, do_sample=True, top_k=0, pad_token_id=0, adapter_names=NAMES)
    torch.manual_seed(0)
    plain = model.generate(input_ids=ids, **kwargs)
    stack_mixed_lora_batches(model)
    torch.manual_seed(0)
    assert torch.equal(model.generate(input_ids=ids, **kwargs), plain)


def test_layers_it_cannot_stack_keep_pefts_path(monkeypatch):
    """Adapters of different ranks cannot share one stack: PEFT's own forward runs, with its numbers."""
    from peft.tuners.lora import Linear

    model, ids = _team(rank_bob=2), _inputs()
    with torch.no_grad():
        plain = _logits(model, ids)
    calls = []
    real = Linear._mixed_batch_forward
    monkeypatch.setattr(Linear, "_mixed_batch_forward", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    stack_mixed_lora_batches(model)
    with torch.no_grad():
        assert torch.equal(_logits(model, ids), plain)
    assert len(calls) == sum(isinstance(m, Linear) for m in model.modules())
