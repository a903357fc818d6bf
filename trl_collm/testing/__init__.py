"""Offline factory of tiny tokenizers and random-init models.

Used by the test-suite, the quickstart and the benchmarks. Nothing here touches the
Hugging Face Hub: the tokenizer is trained in-process with the ``tokenizers`` library on a
corpus generated in code, and models are built from a config with random weights.

Models are saved to disk because TRL-style code frequently re-instantiates a model from
``config._name_or_path`` (e.g. reference models, vLLM-less generation helpers); a model
that only exists in memory would break those code paths.

This face re-exports the package's names: `text.py` (the corpus, `TOY_PROMPTS`, the tokenizers), `models.py` (the
models and their on-disk cache, `tiny_model_dir`), `runs.py` (`CPU_RUN_SETTINGS`, `local_launch_command`).
"""

from .models import MODEL_SIZES, build_causal_lm, build_value_model, save_tiny_model, tiny_model_dir
from .runs import CPU_RUN_SETTINGS, local_launch_command
from .text import DEFAULT_CORPUS, TOY_PROMPTS, build_tokenizer

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
    "local_launch_command",
]
