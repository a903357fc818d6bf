"""The tiny models' text: the corpus generated in code (`DEFAULT_CORPUS`), the prompts it covers (`TOY_PROMPTS`), and
the tokenizers trained on it in-process (`build_tokenizer`, and `build_family_tokenizer` for tokenizers shaped like
real model families). Nothing here touches the Hugging Face Hub.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    PreTrainedTokenizerFast,
)

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
