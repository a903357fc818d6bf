"""The tiny random-init models (`build_causal_lm`, `build_value_model`, `MODEL_SIZES`) and their on-disk cache
(`save_tiny_model`, `tiny_model_dir`): saved because TRL-style code re-instantiates a model from
``config._name_or_path``, stamped so that a stale folder is rebuilt.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import (
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
)

from .text import _MAX_LEN, TOKENIZER_FAMILIES, build_family_tokenizer, build_tokenizer

# Bump whenever the corpus, tokenizer recipe or model recipe changes: it is part of the cache
# stamp, so stale folders in ~/.cache get rebuilt instead of silently reused.
_FACTORY_VERSION = 1
_STAMP_FILE = "trl_collm_stamp.json"


# --------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------

MODEL_SIZES = {
    "tiny": dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64
    ),
    "small": dict(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, intermediate_size=688
    ),
    # About 45M parameters: big enough that model memory dominates the process (memory benchmark).
    "medium": dict(
        hidden_size=768, num_hidden_layers=6, num_attention_heads=12, num_key_value_heads=4, intermediate_size=2048
    ),
    # About 0.48B parameters (most in the 24 blocks; the vocabulary is tiny): the GPU throughput figure's size.
    "0.5b": dict(
        hidden_size=1152, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=8, intermediate_size=4608
    ),
}

_ARCHES = {
    # arch: (config class, causal LM class, sequence-classification class)
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification),
    "llama": (LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification),
    "gpt2": (GPT2Config, GPT2LMHeadModel, GPT2ForSequenceClassification),
}


def _make_config(tokenizer, arch: str, size: str, **overrides):
    if arch not in _ARCHES:
        raise ValueError(f"unknown arch {arch!r}; expected one of {sorted(_ARCHES)}")
    if size not in MODEL_SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {sorted(MODEL_SIZES)}")
    dims = MODEL_SIZES[size]
    ids = dict(
        vocab_size=len(tokenizer),  # len() includes added special tokens (flavor b)
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    config_cls = _ARCHES[arch][0]
    if arch == "gpt2":
        kwargs = dict(
            n_embd=dims["hidden_size"],
            n_layer=dims["num_hidden_layers"],
            n_head=dims["num_attention_heads"],
            # Keep the MLP as small as for the other arches (GPT-2 default is 4 * n_embd).
            n_inner=dims["intermediate_size"],
            n_positions=_MAX_LEN,
            **ids,
        )
    else:
        kwargs = dict(
            **dims,
            max_position_embeddings=_MAX_LEN,
            # Untied so that lm_head and embeddings can be trained/adapted independently,
            # like the real Qwen2/Llama checkpoints the tiny models stand in for.
            tie_word_embeddings=False,
            **ids,
        )
    kwargs.update(overrides)
    return config_cls(**kwargs)


def _init_model(model_cls, config, seed: int) -> PreTrainedModel:
    # fork_rng keeps the caller's global RNG stream untouched while making init reproducible.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    return model.eval()


def _set_generation_config(model: PreTrainedModel, tokenizer) -> None:
    gc = model.generation_config
    gc.pad_token_id = tokenizer.pad_token_id
    gc.eos_token_id = tokenizer.eos_token_id
    gc.bos_token_id = tokenizer.bos_token_id
    gc.do_sample = True


def build_causal_lm(tokenizer, arch: str = "qwen2", size: str = "tiny", seed: int = 0, **overrides) -> PreTrainedModel:
    """Random-init causal LM matching ``tokenizer``; ``overrides`` go into the config."""
    config = _make_config(tokenizer, arch, size, **overrides)
    model = _init_model(_ARCHES[arch][1], config, seed)
    _set_generation_config(model, tokenizer)
    return model


def build_value_model(
    tokenizer, arch: str = "qwen2", size: str = "tiny", seed: int = 1, num_labels: int = 1, **overrides
) -> PreTrainedModel:
    """Random-init ``<Arch>ForSequenceClassification``; pad_token_id is set in the config so
    HF pools the hidden state of the last non-pad token."""
    config = _make_config(tokenizer, arch, size, num_labels=num_labels, **overrides)
    return _init_model(_ARCHES[arch][2], config, seed)


# --------------------------------------------------------------------------------------
# On-disk cache
# --------------------------------------------------------------------------------------

_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _stamp_matches(path: Path, stamp: dict) -> bool:
    try:
        with open(path / _STAMP_FILE) as f:
            on_disk = json.load(f)
    except (OSError, ValueError):
        return False
    return on_disk == stamp and all((path / name).is_file() for name in _REQUIRED_FILES)


def save_tiny_model(
    root: str | os.PathLike,
    name: str = "tiny-qwen2",
    arch: str = "qwen2",
    size: str = "tiny",
    flavor: str = "a",
    kind: str = "causal_lm",
    seed: int = 0,
    num_labels: int = 1,
    family: str | None = None,
) -> str:
    """Build tokenizer + model and save both into ``root/name``; return that path.

    Idempotent: a folder whose stamp matches the arguments is returned untouched. The build
    goes to a temp folder inside ``root`` and is renamed into place, so concurrent callers
    never see a half-written model; the loser of a rename race just discards its copy.
    """
    if kind not in ("causal_lm", "value"):
        raise ValueError(f"unknown kind {kind!r}; expected 'causal_lm' or 'value'")
    root = Path(root).expanduser()
    target = root / name
    stamp = dict(
        factory_version=_FACTORY_VERSION,
        arch=arch,
        size=size,
        flavor=flavor,
        kind=kind,
        seed=seed,
        num_labels=num_labels if kind == "value" else None,
    )
    if family is not None:  # a tokenizer family decides the arch and the spare embedding rows
        arch = TOKENIZER_FAMILIES[family][0]
        stamp.update(arch=arch, family=family)
    if _stamp_matches(target, stamp):
        return str(target)

    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
    try:
        tokenizer = build_tokenizer(flavor=flavor) if family is None else build_family_tokenizer(family)
        extra = {} if family is None else {"vocab_size": len(tokenizer) + TOKENIZER_FAMILIES[family][1]}
        if kind == "causal_lm":
            model = build_causal_lm(tokenizer, arch=arch, size=size, seed=seed, **extra)
        else:
            model = build_value_model(tokenizer, arch=arch, size=size, seed=seed, num_labels=num_labels, **extra)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # Stamp last: its presence certifies a complete folder.
        with open(tmp / _STAMP_FILE, "w") as f:
            json.dump(stamp, f, indent=2, sort_keys=True)

        if target.exists() and not _stamp_matches(target, stamp):
            # Stale folder (other args / older factory): move it aside before replacing, since
            # os.replace cannot overwrite a non-empty directory.
            trash = Path(tempfile.mkdtemp(prefix=f".{name}.old-", dir=root))
            try:
                os.replace(target, trash / "old")
            except OSError:
                pass  # someone else moved/replaced it concurrently
            shutil.rmtree(trash, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            # Lost the race: another process put a folder there first. Accept it if it is the
            # same build; otherwise surface the problem.
            if not _stamp_matches(target, stamp):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def _cache_root() -> Path:
    env = os.environ.get("TRL_COLLM_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "trl_collm" / "tiny-models"


def tiny_model_dir(name: str = "tiny-qwen2", **kwargs) -> str:
    """``save_tiny_model`` into the per-user cache (``$TRL_COLLM_CACHE`` or
    ``~/.cache/trl_collm/tiny-models``); returns the model folder."""
    return save_tiny_model(_cache_root(), name=name, **kwargs)
