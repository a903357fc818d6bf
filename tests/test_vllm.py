"""vLLM as the generation backend, on SmolLM2-135M-Instruct in float32 (CPU, in-process engines).

These run in the vLLM venv only (.ci/run's vLLM step, docs/generation.md); elsewhere the module is skipped, unless
TRL_COLLM_REQUIRE_VLLM=1 (that CI step sets it: the tests must not vanish there).
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

pytestmark = pytest.mark.slow  # a real model in vLLM engines (CONTRIBUTING.md: the fast suite leaves it out)

try:
    import vllm  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the venv
    if os.environ.get("TRL_COLLM_REQUIRE_VLLM") == "1":
        raise
    pytest.skip(f"vLLM is not installed ({e}); see docs/generation.md", allow_module_level=True)

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from trl_collm.generation.sampler import GenerationRequest, SamplingSettings  # noqa: E402
from trl_collm.generation.vllm_backend import VLLMBackend  # noqa: E402
from trl_collm.team.modeling import left_pad  # noqa: E402

QUESTIONS = ["What is 2 + 3?", "Name a red fruit.", "Say hello in French.", "What color is the sky?"]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    """Left-padded chat prompts (ids, mask) of different lengths."""
    rows = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        for q in QUESTIONS
    ]
    rows = [list(r["input_ids"]) if isinstance(r, dict) or hasattr(r, "keys") else list(r) for r in rows]
    return left_pad(rows, tokenizer.pad_token_id, "cpu")


@pytest.fixture(scope="module")
def plain(smollm2_path):
    """One float32 model and one vLLM backend serving it (one engine for the module's plain-model tests)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()
    backend = VLLMBackend()
    yield model, backend
    backend.close()


def _hf_greedy(model, ids, mask, settings, pad_id):
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, **settings.generate_kwargs(pad_id))
    return out[:, ids.shape[1] :]


def _same_until_stop(a: torch.Tensor, b: torch.Tensor, pad_id: int) -> None:
    """Row by row, the same tokens (right padding of different widths aside)."""
    width = max(a.shape[1], b.shape[1])
    pad = torch.nn.functional.pad
    a, b = pad(a, (0, width - a.shape[1]), value=pad_id), pad(b, (0, width - b.shape[1]), value=pad_id)
    assert torch.equal(a, b), (a.tolist(), b.tolist())


GREEDY = SamplingSettings(max_new_tokens=NEW_TOKENS, greedy=True)


def test_greedy_vllm_tokens_equal_generates(plain, prompts, tokenizer):
    model, backend = plain
    ids, mask = prompts
    out = backend.generate(GenerationRequest(model, ids, mask, GREEDY, pad_id=tokenizer.pad_token_id))
    assert out.logprobs is None  # PPO's old log-probs come from the trainer's forward
    assert out.engine_logprobs is None  # greedy: no sampling distribution to correct for
    _same_until_stop(out.tokens, _hf_greedy(model, ids, mask, GREEDY, tokenizer.pad_token_id), tokenizer.pad_token_id)


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson's chi-square p-value of `counts` against `probs` (bins expected below `min_expected` pooled)."""
    n = counts.sum()
    expected = probs * n
    big = expected >= min_expected
    obs = torch.cat([counts[big], counts[~big].sum().reshape(1)]).double()
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)]).double()
    stat = float(((obs - exp) ** 2 / exp.clamp_min(1e-12)).sum())
    df = int(big.sum())  # bins - 1, the pooled bin included
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2)))


def test_sampled_first_tokens_follow_the_models_distribution(plain, prompts, tokenizer):
    """2,000 first tokens sampled by vLLM at temperature 0.8 and top-k 50 against the model's own distribution
    under the same settings: a chi-square test that passes, and that rejects the distribution at temperature 1.2
    (so it can fail)."""
    model, backend = plain
    ids, mask = prompts
    n, temp, top_k = 2000, 0.8, 50
    settings = SamplingSettings(max_new_tokens=1, temperature=temp, top_k=top_k)
    torch.manual_seed(0)
    out = backend.generate(GenerationRequest(model, ids[:1].expand(n, -1), mask[:1].expand(n, -1), settings, pad_id=0))
    assert out.engine_logprobs is None  # top-k: vLLM's log-probs are of the truncated distribution, not comparable
    counts = torch.bincount(out.tokens[:, 0], minlength=model.config.vocab_size).double()
    with torch.no_grad():
        logits = model(input_ids=ids[:1], attention_mask=mask[:1]).logits[0, -1].double()

    def top_k_probs(t):
        kept = logits.topk(top_k).indices
        q = torch.zeros_like(logits)
        q[kept] = torch.softmax(logits[kept] / t, -1)
        return q

    assert _chi_square_p(counts, top_k_probs(temp)) > 1e-3
    assert _chi_square_p(counts, top_k_probs(1.2)) < 1e-3


def test_engine_logprobs_are_the_trainers_up_to_rounding(plain, prompts, tokenizer):
    """Sampled without truncation, vLLM returns its log-probs of the sampled tokens: log softmax(logits / T) of the
    model, as AgentTeam.logprobs computes them in the update (the importance-sampling correction compares the two)."""
    model, backend = plain
    assert _logprob_gap(model, backend, *prompts, tokenizer) < 1e-3


def _logprob_gap(model, backend, ids, mask, tokenizer, temp: float = 0.7) -> float:
    """The largest |vLLM's - the model's own log softmax(logits / temp)| over sampled answer tokens."""
    settings = SamplingSettings(max_new_tokens=NEW_TOKENS, temperature=temp)
    torch.manual_seed(0)
    out = backend.generate(GenerationRequest(model, ids, mask, settings, pad_id=tokenizer.pad_token_id))
    full = torch.cat([ids, out.tokens], 1)
    full_mask = torch.cat([mask, torch.ones_like(out.tokens)], 1)
    with torch.no_grad():
        logits = model(input_ids=full, attention_mask=full_mask).logits[:, ids.shape[1] - 1 : -1]
    trainer = torch.log_softmax(logits / temp, -1).gather(-1, out.tokens.unsqueeze(-1)).squeeze(-1)
    stop = (out.tokens == tokenizer.eos_token_id).long().cumsum(-1)
    valid = (stop - (out.tokens == tokenizer.eos_token_id).long()) == 0  # up to and including the stop token
    return float((out.engine_logprobs - trainer).abs()[valid].max())


def test_after_an_optimizer_step_vllm_follows_the_new_weights(plain, prompts, tokenizer):
    """Train the model towards one answer; vLLM keeps the old weights until weights_changed(), then matches
    generate() with the new ones. (Last of the tests on the shared `plain` model: it changes the weights.)"""
    model, backend = plain
    ids, mask = prompts
    pad = tokenizer.pad_token_id
    before = _hf_greedy(model, ids, mask, GREEDY, pad)
    # the engine exists (and has synced) before the update, as in training
    _same_until_stop(backend.generate(GenerationRequest(model, ids, mask, GREEDY, pad_id=pad)).tokens, before, pad)
    target = torch.tensor(tokenizer("Bananas are blue.<|im_end|>")["input_ids"])
    full = torch.cat([ids, target.expand(len(ids), -1)], dim=1)
    full_mask = torch.cat([mask, torch.ones(len(ids), len(target), dtype=mask.dtype)], dim=1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    model.train()
    for _ in range(3):
        logits = model(input_ids=full, attention_mask=full_mask).logits[:, ids.shape[1] - 1 : -1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.repeat(len(ids)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    after = _hf_greedy(model, ids, mask, GREEDY, pad)
    assert not torch.equal(before, after), "the update did not change generate()'s answers; the test cannot tell"
    stale = backend.generate(GenerationRequest(model, ids, mask, GREEDY, pad_id=pad)).tokens
    _same_until_stop(stale, before, pad)  # no weights_changed(): the engine still holds the old weights
    backend.weights_changed()
    synced = backend.generate(GenerationRequest(model, ids, mask, GREEDY, pad_id=pad)).tokens
    _same_until_stop(synced, after, pad)
    # every weight arrived, the tied LM head too (vLLM's CPU build keeps a packed copy of it: 1.3e-2 when stale)
    assert _logprob_gap(model, backend, ids, mask, tokenizer) < 1e-3


# ------------------------------------------------------------------ LoRA: one engine, one adapter per agent
def _two_adapter_model(smollm2_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    config = dict(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    torch.manual_seed(1)
    model = get_peft_model(base, LoraConfig(**config), adapter_name="agent_0")
    model.add_adapter("agent_1", LoraConfig(**config))
    return model.eval()


def _peft_greedy(model, ids, mask, adapter, pad):
    model.set_adapter(adapter)
    return _hf_greedy(model, ids, mask, GREEDY, pad)


def test_lora_rows_are_routed_to_their_agents_adapter_and_follow_updates(smollm2_path, prompts, tokenizer):
    model = _two_adapter_model(smollm2_path)
    ids, mask = prompts
    pad = tokenizer.pad_token_id
    names = ["agent_0", "agent_1", "agent_1", "agent_0"]
    backend = VLLMBackend()
    try:
        expected = {a: _peft_greedy(model, ids, mask, a, pad) for a in ("agent_0", "agent_1")}
        assert not torch.equal(expected["agent_0"], expected["agent_1"]), "adapters agree: routing is untestable"
        out = backend.generate(GenerationRequest(model, ids, mask, GREEDY, pad_id=pad, adapter_names=names)).tokens
        for i, a in enumerate(names):
            _same_until_stop(out[i : i + 1], expected[a][i : i + 1], pad)
        # An update of agent_1's adapter reaches the engine after weights_changed()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B.agent_1" in n:
                    p.mul_(-1.0)
        new = _peft_greedy(model, ids, mask, "agent_1", pad)
        assert not torch.equal(new, expected["agent_1"])
        backend.weights_changed()
        out = backend.generate(GenerationRequest(model, ids, mask, GREEDY, pad_id=pad, adapter_names=names)).tokens
        for i, a in enumerate(names):
            _same_until_stop(out[i : i + 1], (new if a == "agent_1" else expected[a])[i : i + 1], pad)
    finally:
        backend.close()


# ------------------------------------------------------------------ training runs and eval with use_vllm=True
def _reward(prompts, completions, **kwargs):
    return [float(len(c[0]) % 5) - float(len(c[-1]) % 3) for c in completions]


def _dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": QUESTIONS})


def _run_settings(tmp_path, **kw):
    from conftest import RUN_SETTINGS

    return dict(
        RUN_SETTINGS,
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        total_episodes=4,
        response_length=8,
        learning_rate=1e-3,
        seed=0,
        use_vllm=True,
        **kw,
    )


def _lora():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def _check_trained_with_vllm(trainer, out, before):
    assert isinstance(trainer.sampler.backend, VLLMBackend) and trainer.sampler.backend._engines
    assert out.global_step == 2
    moved = [not torch.equal(b, p.detach()) for b, p in zip(before, trainer.team.parameters())]
    assert any(moved)
    for key in ("vllm/logprob_gap_mean", "vllm/is_weight_mean"):
        assert key in out.metrics and math.isfinite(out.metrics[key]), key
    # the engine's and the trainer's log-probs of the same tokens agree closely in float32
    assert out.metrics["vllm/logprob_gap_mean"] < 1e-2


def test_dc_trains_with_vllm(tmp_path, smollm2_path):
    """CoLLM-DC on a LoRA team (one engine, an adapter per agent; CC trains in the CLI test below). Separate 135M
    models with their references, critics, Adam states and one engine each need ~14 GB here; the separate-model
    weight sync is tested above."""
    from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer

    args = MultiAgentPPOConfig(**_run_settings(tmp_path, num_agents=2, critic_type="decentralized"))
    trainer = MultiAgentPPOTrainer(
        args=args, model=smollm2_path, train_dataset=_dataset(), reward_funcs=_reward, peft_config=_lora()
    )
    before = [p.detach().clone() for p in trainer.team.parameters()]
    out = trainer.train()
    _check_trained_with_vllm(trainer, out, before)
    trainer.sampler.backend.close()


def test_mc_trains_with_vllm(tmp_path, smollm2_path):
    from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer

    args = MultiAgentMCConfig(**_run_settings(tmp_path, num_agents=2, num_generations=2))
    trainer = MultiAgentMCTrainer(
        args=args, model=smollm2_path, train_dataset=_dataset(), reward_funcs=_reward, peft_config=_lora()
    )
    before = [p.detach().clone() for p in trainer.team.parameters()]
    out = trainer.train()
    _check_trained_with_vllm(trainer, out, before)
    trainer.sampler.backend.close()


def test_cli_trains_and_evals_with_vllm(tmp_path, smollm2_name, capsys):
    """`trl-collm ppo --use_vllm` (CoLLM-CC, the default critic) on a LoRA team, then `trl-collm eval --use_vllm`:
    greedy vLLM decoding scores the team exactly as generate() does."""
    from trl_collm.cli import main

    out = tmp_path / "team"
    common = ["--task", "coord-penalty", "--seed", "0"]
    argv = ["ppo", *common, "--model_name_or_path", smollm2_name, "--use_peft", "--lora_r", "4"]
    argv += ["--lora_target_modules", "q_proj", "v_proj", "--use_vllm", "--output_dir", str(out)]
    argv += ["--total_episodes", "4", "--per_device_train_batch_size", "2", "--response_length", "4"]
    argv += ["--train_limit", "4", "--eval_limit", "2", "--use_cpu", "--bf16", "false", "--report_to", "none"]
    argv += ["--save_strategy", "no", "--num_sample_generations", "0", "--disable_tqdm", "true"]
    assert main(argv) == 0
    summaries = {}
    for flags in ([], ["--use_vllm"]):
        capsys.readouterr()
        assert main(["eval", "--team_dir", str(out), *common[:2], "--limit", "4", "--max_new_tokens", "4", *flags]) == 0
        lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
        summaries[bool(flags)] = json.loads(lines[-1])
    assert summaries[True] == summaries[False]
