"""Offline factory of tiny tokenizers and random-init models.

Used by the test-suite, the quickstart and the benchmarks. Nothing here touches the
Hugging Face Hub: the tokenizer is trained in-process with the ``tokenizers`` library on a
corpus generated in code, and models are built from a config with random weights.

Models are saved to disk because TRL-style code frequently re-instantiates a model from
``config._name_or_path`` (e.g. reference models, vLLM-less generation helpers); a model
that only exists in memory would break those code paths.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
)

__all__ = [
    "DEFAULT_CORPUS",
    "TOY_PROMPTS",
    "CPU_RUN_SETTINGS",
    "MODEL_SIZES",
    "build_tokenizer",
    "build_causal_lm",
    "build_value_model",
    "save_tiny_model",
    "tiny_model_dir",
]

# Bump whenever the corpus, tokenizer recipe or model recipe changes: it is part of the cache
# stamp, so stale folders in ~/.cache get rebuilt instead of silently reused.
_FACTORY_VERSION = 1
_STAMP_FILE = "trl_collm_stamp.json"
_MAX_LEN = 2048


# --------------------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------------------

_ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def _spell(n: int) -> str:
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens] if ones == 0 else f"{_TENS[tens]}-{_ONES[ones]}"


def _make_corpus() -> list[str]:
    """Deterministic, self-written training text covering the domains the tests use
    (numbers, short prose about teams, Python-like code, Minecraft-like commands)."""
    lines: list[str] = []
    # Numbers 0-99, both spelled and as digits, so digits and number words get merges.
    for n in range(100):
        lines.append(f"{n} is {_spell(n)}.")
    for n in range(0, 100, 3):
        lines.append(f"{_spell(n)} plus one is {_spell(n + 1) if n < 99 else 'one hundred'}.")

    agents = ["the planner", "the coder", "the critic", "the writer", "the helper", "agent one", "agent two"]
    verbs = ["writes", "checks", "fixes", "reads", "builds", "tests", "shares"]
    things = ["the plan", "the code", "a short story", "the answer", "the summary", "a function", "the reward"]
    # A fixed stride walk over the product keeps the set deterministic but varied.
    for i in range(120):
        a = agents[i % len(agents)]
        v = verbs[(i * 3) % len(verbs)]
        t = things[(i * 5) % len(things)]
        lines.append(f"{a.capitalize()} {v} {t} and the team gets a reward of {i % 10}.")
    lines += [
        "The team works together to solve the task.",
        "Each agent sees the prompt and writes a reply.",
        "The critic gives a value to every turn.",
        "Two agents are better than one when they agree.",
        "A good team shares the work and checks the result.",
        "The first agent writes a helper, the second writes the main function.",
        "Question: what is two plus three? Answer: five.",
        "Write a short story about a team of robots.",
        "The reward is high when the tests pass.",
        "Hello world!",
    ]

    ops = ["+", "-", "*"]
    for i in range(60):
        k = i % 10
        op = ops[i % 3]
        lines.append(f"def aux(x): return x {op} {k}")
        lines.append(f"def main(a, b): return aux(a) {op} b")
    lines += [
        "def aux(x): return x + 1",
        "def add(a, b):\n    return a + b",
        "for i in range(10):\n    print(i)",
        "if x > 0:\n    return True\nelse:\n    return False",
        "assert main(2, 3) == 5",
        "import math",
        "result = [x * x for x in range(5)]",
    ]

    colors = ["red", "blue", "green", "white", "black", "yellow"]
    blocks = ["wool", "concrete", "stone", "planks"]
    for i in range(60):
        c = colors[i % len(colors)]
        b = blocks[(i // 2) % len(blocks)]
        block = b if b in ("stone", "planks") else f"{c}_{b}"
        lines.append(f"/setblock {i % 7} {i % 5} {i % 3} {block}")
    lines.append("/fill 0 0 0 4 4 4 red_wool")
    return lines


# Prompts the tiny models' corpus covers: the test-suite, examples/ds_train.py and tools/record_runs.py start their
# episodes from them (one list, so a recorded trajectory and a test see the same rows).
TOY_PROMPTS = (
    "count one and",
    "two plus three is",
    "the team writes the plan",
    "def aux(x): return x",
    "write a short story about",
    "the critic gives a value to",
    "agent one checks the code and",
    "red wool",
)


# Trainer settings every CPU run of the toy and test setups needs, PPO or MC: no bf16, no logging integrations, no
# checkpoints, no sample generations, a log line per iteration (the test-suite and tools/record_runs.py share them).
CPU_RUN_SETTINGS = dict(
    use_cpu=True,
    bf16=False,
    report_to=[],
    save_strategy="no",
    num_sample_generations=0,
    disable_tqdm=True,
    logging_steps=1,
)


DEFAULT_CORPUS: list[str] = _make_corpus()


# --------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------

_FLAVOR_SPECIALS = {
    # (pad, eos, unk, bos)
    "a": ("<pad>", "</s>", "<unk>", "<s>"),
    "b": ("[PAD]", "[EOS]", "[UNK]", "[BOS]"),
}


# Same split regex as Qwen2's tokenizer. On reload, ``AutoTokenizer`` ignores the saved
# ``tokenizer_class`` for ``model_type == "qwen2"`` and rebuilds a ``Qwen2Tokenizer`` from our
# vocab/merges with *its own* normalizer + pre-tokenizer. Training with exactly that pipeline
# makes the reloaded tokenizer tokenize identically for every arch.
_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def build_tokenizer(
    vocab_size: int = 512, flavor: str = "a", corpus: list[str] | None = None
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer in-process (deterministic).

    Flavor ``"b"`` is meant for heterogeneous teams and must not share token ids with flavor
    ``"a"``. Two BPE runs on the same corpus learn the same merges in the same order, so a
    smaller vocab alone would leave most ids identical. Flavor b therefore trains
    ``vocab_size - 97`` tokens *without* specials and appends its specials after the trained
    vocab: every byte/merge id is shifted by 4 relative to flavor a, and the largest merges
    of flavor a do not exist in b. (The pre-tokenizer cannot differ between flavors, see
    ``_SPLIT_REGEX``.)
    """
    if flavor not in _FLAVOR_SPECIALS:
        raise ValueError(f"unknown tokenizer flavor {flavor!r}; expected one of {sorted(_FLAVOR_SPECIALS)}")
    pad, eos, unk, bos = _FLAVOR_SPECIALS[flavor]
    specials = [pad, eos, unk, bos]
    corpus = DEFAULT_CORPUS if corpus is None else corpus

    if flavor == "a":
        target_vocab, trainer_specials = vocab_size, specials
    else:
        target_vocab, trainer_specials = vocab_size - 97, []  # specials added after training
    # 256 byte symbols (+ in-vocab specials) is the floor for a byte-level vocabulary.
    floor = 256 + len(trainer_specials)
    if target_vocab < floor:
        need = floor + (97 if flavor == "b" else 0)
        raise ValueError(f"vocab_size={vocab_size} too small for byte-level BPE flavor {flavor!r} (need >= {need})")

    tok = Tokenizer(models.BPE(unk_token=unk))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=target_vocab,
        min_frequency=2,
        special_tokens=trainer_specials,
        # Full byte alphabet so any ASCII/UTF-8 input is encodable without <unk>.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    if not trainer_specials:
        tok.add_special_tokens(specials)

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=pad,
        eos_token=eos,
        unk_token=unk,
        bos_token=bos,
        padding_side="left",  # decoder-only generation needs left padding
        model_max_length=_MAX_LEN,
        # No automatic bos/eos: prompt token counts stay exactly len(encode(text)).
        add_bos_token=False,
        add_eos_token=False,
        # Cleanup would e.g. turn "a ." into "a." and break encode/decode round trips.
        clean_up_tokenization_spaces=False,
    )
    return hf_tok


# Tokenizers shaped like the real model families a TRL script meets (their specials and how many spare embedding rows
# the models carry); used to test the drop-in with scripts that add a pad token themselves.
#   qwen:  byte-level BPE, pad == eos, embedding rows > vocabulary (Qwen2: 151936 rows for 151665 tokens)
#   neox:  byte-level BPE, no pad token, embedding rows > vocabulary (Pythia: 50304 rows for 50277 tokens)
#   llama: sentencepiece-like (words marked with "▁", <s> </s> <unk>), no pad token, rows == vocabulary, so a
#          pad token added by a script has no embedding row
TOKENIZER_FAMILIES = {"qwen": ("qwen2", 64), "neox": ("qwen2", 27), "llama": ("llama", 0)}  # arch, spare rows


def build_family_tokenizer(family: str, vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A tokenizer shaped like `family`'s (see TOKENIZER_FAMILIES)."""
    if family not in TOKENIZER_FAMILIES:
        raise ValueError(f"unknown tokenizer family {family!r}; expected one of {sorted(TOKENIZER_FAMILIES)}")
    if family in ("qwen", "neox"):
        tok = build_tokenizer(vocab_size=vocab_size)
        tok.pad_token = tok.eos_token if family == "qwen" else None
        return tok
    unk, bos, eos = "<unk>", "<s>", "</s>"
    raw = Tokenizer(models.BPE(unk_token=unk))
    raw.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    raw.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=[unk, bos, eos], show_progress=False
    )
    raw.train_from_iterator(DEFAULT_CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=raw,
        unk_token=unk,
        bos_token=bos,
        eos_token=eos,
        padding_side="left",
        model_max_length=_MAX_LEN,
        clean_up_tokenization_spaces=False,
    )


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


def local_launch_command(script: str, config_file: str | None = None, num_processes: int = 2) -> list[str]:
    """The command that runs `script` in `num_processes` local processes, on a fresh rendezvous port (no reuse of an
    earlier run's): `accelerate launch --config_file` with a DeepSpeed config, or `torch.distributed.run` (plain data
    parallel; the caller sets ACCELERATE_USE_CPU=true for accelerate's multi-CPU state) without one. Arguments for
    the script go after it."""
    import socket
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    if config_file is None:
        launcher = ["torch.distributed.run", "--nproc_per_node", str(num_processes), "--master_port", port]
    else:
        launcher = ["accelerate.commands.launch", "--num_processes", str(num_processes), "--num_machines", "1"]
        launcher += ["--mixed_precision", "no", "--main_process_port", port, "--config_file", str(config_file)]
    return [sys.executable, "-m", *launcher, str(script)]
