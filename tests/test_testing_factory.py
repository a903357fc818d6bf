"""Tests for the offline tiny-model factory in ``trl_collm.testing``."""

import os
import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from trl_collm.testing import (
    DEFAULT_CORPUS,
    MODEL_SIZES,
    build_causal_lm,
    build_tokenizer,
    build_value_model,
    save_tiny_model,
    tiny_model_dir,
)

ARCHES = ["qwen2", "llama", "gpt2"]
CODE = "def aux(x): return x + 1"
SENTENCE = "The team works together to solve the task."
PROMPTS = ["Hello team", "def aux(x): return x + 1"]  # different lengths -> real left padding


@pytest.fixture(scope="module")
def tok_a():
    return build_tokenizer(flavor="a")


@pytest.fixture(scope="module")
def tok_b():
    return build_tokenizer(flavor="b")


def _tok(flavor, tok_a, tok_b):
    return tok_a if flavor == "a" else tok_b


# ---------------------------------------------------------------- corpus / tokenizer


def test_default_corpus_is_deterministic_and_covers_domains():
    from trl_collm.testing.text import _make_corpus

    assert _make_corpus() == DEFAULT_CORPUS
    assert 200 <= len(DEFAULT_CORPUS) <= 1000
    text = "\n".join(DEFAULT_CORPUS)
    for needle in ("ninety-nine", "team", CODE, "/setblock", "red_wool"):
        assert needle in text


@pytest.mark.parametrize("flavor", ["a", "b"])
def test_tokenizer_basics(flavor, tok_a, tok_b):
    tok = _tok(flavor, tok_a, tok_b)
    assert tok.pad_token is not None and tok.pad_token_id is not None
    assert tok.eos_token is not None and tok.eos_token_id is not None
    assert tok.pad_token_id != tok.eos_token_id
    assert tok.padding_side == "left"
    assert tok.model_max_length == 2048
    assert tok.chat_template is None
    for text in (CODE, SENTENCE, "/setblock 1 2 3 red_wool", "  spaces\tand\nnewlines  "):
        ids = tok(text)["input_ids"]
        # No automatic bos/eos: prompt token counts stay predictable.
        assert tok.bos_token_id not in ids and tok.eos_token_id not in ids
        assert tok.decode(ids) == text


def test_tokenizer_is_deterministic(tok_a):
    again = build_tokenizer(flavor="a")
    assert again.get_vocab() == tok_a.get_vocab()
    assert again(SENTENCE)["input_ids"] == tok_a(SENTENCE)["input_ids"]


def test_flavors_differ(tok_a, tok_b):
    assert tok_a.get_vocab() != tok_b.get_vocab()
    assert len(tok_a) != len(tok_b)
    assert tok_a.pad_token != tok_b.pad_token
    assert (tok_a.pad_token, tok_a.eos_token) == ("<pad>", "</s>")
    assert (tok_b.pad_token, tok_b.eos_token) == ("[PAD]", "[EOS]")
    for text in (CODE, SENTENCE):
        assert tok_a(text)["input_ids"] != tok_b(text)["input_ids"]


def test_left_padding(tok_a):
    batch = tok_a(PROMPTS, padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert ids.shape[0] == 2
    short = int(mask.sum(1).argmin())
    assert mask[short, 0] == 0 and mask[short, -1] == 1
    assert ids[short, 0] == tok_a.pad_token_id


# ---------------------------------------------------------------- models


@pytest.mark.parametrize("flavor", ["a", "b"])
@pytest.mark.parametrize("arch", ARCHES)
def test_causal_lm_forward_and_generate(arch, flavor, tok_a, tok_b):
    tok = _tok(flavor, tok_a, tok_b)
    model = build_causal_lm(tok, arch=arch)
    assert model.config.vocab_size == len(tok)
    assert model.config.pad_token_id == tok.pad_token_id
    assert model.config.eos_token_id == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.generation_config.do_sample is True
    if arch != "gpt2":
        assert model.config.tie_word_embeddings is False
        assert model.config.hidden_size == MODEL_SIZES["tiny"]["hidden_size"]
    else:
        assert model.config.n_embd == MODEL_SIZES["tiny"]["hidden_size"]

    batch = tok(PROMPTS, padding=True, return_tensors="pt")
    B, L = batch["input_ids"].shape
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (B, L, len(tok))

    out = model.generate(**batch, max_new_tokens=5)
    assert out.shape[0] == B and L < out.shape[1] <= L + 5
    assert torch.equal(out[:, :L], batch["input_ids"])


def test_overrides_reach_config(tok_a):
    model = build_causal_lm(tok_a, arch="llama", num_hidden_layers=1)
    assert model.config.num_hidden_layers == 1


def test_seed_reproducibility(tok_a):
    m0 = build_causal_lm(tok_a, seed=0)
    m0_again = build_causal_lm(tok_a, seed=0)
    m1 = build_causal_lm(tok_a, seed=1)
    s0, s0b, s1 = m0.state_dict(), m0_again.state_dict(), m1.state_dict()
    assert all(torch.equal(s0[k], s0b[k]) for k in s0)
    assert any(not torch.equal(s0[k], s1[k]) for k in s0)


def test_build_does_not_disturb_global_rng(tok_a):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_causal_lm(tok_a)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("arch", ARCHES)
def test_value_model(arch, tok_b):
    model = build_value_model(tok_b, arch=arch, num_labels=3)
    assert model.config.pad_token_id == tok_b.pad_token_id
    batch = tok_b(PROMPTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (2, 3)
    assert torch.isfinite(logits).all()


# ---------------------------------------------------------------- save / cache


def _param(model):
    return next(iter(model.state_dict().values()))


@pytest.mark.parametrize("arch,flavor", [("qwen2", "a"), ("qwen2", "b"), ("llama", "b"), ("gpt2", "a")])
def test_save_tiny_causal_lm_roundtrip(tmp_path, arch, flavor):
    path = save_tiny_model(tmp_path, name=f"tiny-{arch}-{flavor}", arch=arch, flavor=flavor, seed=3)
    assert Path(path) == tmp_path / f"tiny-{arch}-{flavor}"

    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    ref_tok = build_tokenizer(flavor=flavor)
    ref_model = build_causal_lm(ref_tok, arch=arch, seed=3)

    ref_sd = ref_model.state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(v, ref_sd[k]), k
    # Reloaded tokenizer (Qwen2Tokenizer for qwen2, generic backend otherwise) must agree.
    for text in (CODE, SENTENCE, "It's (x) don't!!\n\n  42"):
        assert tok(text)["input_ids"] == ref_tok(text)["input_ids"]
        assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.pad_token == ref_tok.pad_token and tok.padding_side == "left"
    assert model.config._name_or_path == path
    assert model.generation_config.pad_token_id == tok.pad_token_id

    batch = tok(PROMPTS, padding=True, return_tensors="pt")
    out = model.generate(**batch, max_new_tokens=3)
    assert out.shape[0] == 2


def test_save_tiny_value_model_roundtrip(tmp_path):
    path = save_tiny_model(tmp_path, name="tiny-value", kind="value", num_labels=2, seed=5)
    model = AutoModelForSequenceClassification.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.pad_token_id == tok.pad_token_id
    ref = build_value_model(build_tokenizer(), seed=5, num_labels=2)
    assert torch.equal(_param(model), _param(ref))
    batch = tok(PROMPTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        assert model(**batch).logits.shape == (2, 2)


def test_save_tiny_model_cache_hit_and_rebuild(tmp_path):
    path = save_tiny_model(tmp_path, name="m")
    weights = Path(path) / "model.safetensors"
    mtime = weights.stat().st_mtime_ns

    again = save_tiny_model(tmp_path, name="m")
    assert again == path
    assert weights.stat().st_mtime_ns == mtime  # not rewritten

    # Different arguments under the same name -> stale folder is replaced.
    save_tiny_model(tmp_path, name="m", seed=7)
    ref = build_causal_lm(build_tokenizer(), seed=7)
    assert torch.equal(_param(AutoModelForCausalLM.from_pretrained(path)), _param(ref))
    # No temp folders left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_save_tiny_model_concurrent(tmp_path):
    paths, errors = [], []

    def worker():
        try:
            paths.append(save_tiny_model(tmp_path, name="race", arch="llama"))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(paths)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["race"]
    AutoModelForCausalLM.from_pretrained(paths[0])


def test_save_tiny_model_rejects_bad_kind(tmp_path):
    with pytest.raises(ValueError):
        save_tiny_model(tmp_path, kind="reward")


def test_tiny_model_dir_uses_env_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRL_COLLM_CACHE", str(cache))
    path = tiny_model_dir("tiny-gpt2", arch="gpt2")
    assert Path(path) == cache / "tiny-gpt2"
    assert os.path.isfile(os.path.join(path, "config.json"))
    assert AutoModelForCausalLM.from_pretrained(path).config.model_type == "gpt2"
    assert tiny_model_dir("tiny-gpt2", arch="gpt2") == path


def test_importing_the_library_leaves_the_environment_alone():
    # A library import must not change the user's environment (the test-suite's conftest sets HF_HUB_OFFLINE itself).
    import subprocess
    import sys

    code = (
        "import os; before = dict(os.environ); "
        "import trl_collm, trl_collm.testing, trl_collm.warmstart, trl_collm.cli, trl_collm.team.pretrained; "
        "changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)); "
        "print(changed)"
    )
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
