"""The in-place decoding KV cache (trl_collm.cpu.kv_cache): the same tokens and scores as transformers' own cache,
values in the keys' dtype under CPU autocast, written into one buffer, and used by the generate backend."""

from __future__ import annotations

import pytest
import torch
from seeded_sampling import sample_with_scores
from transformers import AutoModelForCausalLM, DynamicCache

from trl_collm.cpu import adapt_for_cpu
from trl_collm.cpu.kv_cache import DecodeCache, ReservedLayer
from trl_collm.team import prefix
from trl_collm.testing import tiny_model_dir


@pytest.fixture(scope="module")
def model():
    m = AutoModelForCausalLM.from_pretrained(tiny_model_dir())
    return m.eval()


def _batch():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 200, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    ids[0, :3], mask[0, :3] = 0, 0  # one left-padded row
    return ids, mask


@pytest.mark.parametrize("bf16", [False, True])
def test_generate_samples_the_same_tokens_and_scores_as_with_transformers_cache(bf16):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir()).eval()
    if bf16:
        adapt_for_cpu(model)  # float32 attention and bf16 weight copies, as the trainers run CPU bf16
    ids, mask = _batch()
    plain_tokens, plain_scores = sample_with_scores(model, ids, mask, bf16)
    tokens, scores = sample_with_scores(model, ids, mask, bf16, **{prefix.cache_keyword(model): DecodeCache(16)})
    assert torch.equal(tokens, plain_tokens)
    torch.testing.assert_close(scores, plain_scores, rtol=0, atol=1e-5)


def test_a_prefilled_cache_continues_as_transformers_cache_does(model):
    ids, mask = _batch()
    with torch.no_grad():
        head = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True)
    layers = prefix.layered_cache(head).layers
    keyword = prefix.cache_keyword(model)

    def with_cache(cache):
        return sample_with_scores(model, ids, mask, False, **{keyword: cache})

    plain = DynamicCache()
    for i, layer in enumerate(layers):
        plain.update(layer.keys.clone(), layer.values.clone(), i)
    reserved = DecodeCache(16, [layer.keys for layer in layers], [layer.values for layer in layers])
    plain_tokens, plain_scores = with_cache(plain)
    tokens, scores = with_cache(reserved)
    assert torch.equal(tokens, plain_tokens)
    torch.testing.assert_close(scores, plain_scores, rtol=0, atol=1e-5)


def test_values_are_stored_in_the_keys_dtype_only_where_cpu_autocast_split_them():
    k32, v16 = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4).bfloat16()
    layer = ReservedLayer(reserve=3)
    keys, values = layer.update(k32, v16)
    assert values.dtype == torch.float32 and torch.equal(values, v16.float())  # bf16 -> float32 is exact
    assert torch.equal(keys, k32)
    both16 = ReservedLayer(reserve=3)
    assert both16.update(k32.bfloat16(), v16)[1].dtype == torch.bfloat16  # a bf16 model keeps bf16


def test_steps_within_the_reserve_write_into_one_buffer_and_past_it_the_buffer_grows_intact():
    layer = ReservedLayer(reserve=2)
    first = torch.arange(2 * 1 * 3 * 2, dtype=torch.float32).view(2, 1, 3, 2)
    layer.update(first, first + 100)
    buffer = layer._keys.data_ptr()
    steps = [torch.full((2, 1, 1, 2), float(t)) for t in (7, 8, 9)]
    layer.update(steps[0], steps[0])
    layer.update(steps[1], steps[1])
    assert layer._keys.data_ptr() == buffer and layer.get_seq_length() == 5  # 3 + 2 columns: within the reserve
    keys, values = layer.update(steps[2], steps[2])  # the 6th column: the buffer grows
    assert layer._keys.data_ptr() != buffer and keys.shape == (2, 1, 6, 2)
    expected = torch.cat([first, *steps], dim=2)
    assert torch.equal(keys, expected)
    assert torch.equal(values[:, :, :3], first + 100) and torch.equal(values[:, :, 3:], expected[:, :, 3:])
    layer.crop(-2)
    assert layer.get_seq_length() == 4 and torch.equal(layer.keys, expected[:, :, :4])


def test_generate_with_prefix_hands_generate_a_decode_cache_and_keeps_its_tokens(model, monkeypatch):
    ids, mask = _batch()
    kwargs = dict(max_new_tokens=8, do_sample=True, pad_token_id=0, top_k=0)
    seen = []
    real = model.generate

    def spy(**kw):
        seen.append(type(kw.get(prefix.cache_keyword(model))).__name__)
        return real(**kw)

    monkeypatch.setattr(model, "generate", spy)
    torch.manual_seed(0)
    fast = prefix.generate_with_prefix(model, ids, mask, dict(kwargs), enabled=False)
    monkeypatch.setattr(prefix, "decode_cache_kwargs", lambda m, kw, keys=None, values=None: {})
    torch.manual_seed(0)
    plain = prefix.generate_with_prefix(model, ids, mask, dict(kwargs), enabled=False)
    assert seen == ["DecodeCache", "NoneType"]
    assert torch.equal(fast, plain)


def test_models_with_sliding_window_layers_keep_transformers_cache(model):
    sliding = AutoModelForCausalLM.from_pretrained(tiny_model_dir())
    sliding.config.layer_types = ["sliding_attention"] * len(sliding.config.layer_types or [0])
    assert prefix.decode_cache_kwargs(sliding, {"max_new_tokens": 4}) == {}
    assert isinstance(
        prefix.decode_cache_kwargs(model, {"max_new_tokens": 4})[prefix.cache_keyword(model)], DecodeCache
    )
