"""Generation backends (trl_collm/generation/backends.py): transformers' continuous batching against HF generate().

Greedy outputs must be identical token for token (separate models and LoRA teams, stop token, response length);
sampled outputs must follow the sampling distribution (chi-square goodness of fit on the first token, which also
rejects a wrong temperature); both trainers train on the continuous-batching backend. Also: building a trainer
does not import deepspeed.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig

from trl_collm.generation.backends import ContinuousBatchingBackend, GenerateBackend, PolicySampler, make_backend
from trl_collm.generation.sampler import GenerationRequest, SamplingSettings

from hang_guard import HANG_GUARD_S

# A small paged cache: transformers would otherwise size it from the machine's free RAM.
CB_CONFIG = {"page_size": 16}
PROMPTS = ["count one and", "two plus three is", "the team writes the plan", "def aux(x): return x", "red wool"]


def _trainer(tmp_path, qwen_path, cb: bool, lora: bool = False, trainer: str = "ppo", **overrides):
    from conftest import RUN_SETTINGS

    from trl_collm import (
        MultiAgentMCConfig,
        MultiAgentMCTrainer,
        MultiAgentPPOConfig,
        MultiAgentPPOTrainer,
    )

    settings = dict(
        RUN_SETTINGS,
        output_dir=str(tmp_path / "out"),
        num_agents=2,
        response_length=6,
        per_device_train_batch_size=4,
        total_episodes=4,
        learning_rate=1e-3,
        seed=0,
        use_transformers_continuous_batching=cb,
        transformers_continuous_batching_config=CB_CONFIG,
    )
    settings.update(overrides)
    if trainer == "mc":
        args, cls = MultiAgentMCConfig(num_generations=2, **settings), MultiAgentMCTrainer
    else:
        args, cls = MultiAgentPPOConfig(**settings), MultiAgentPPOTrainer
    peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]) if lora else None
    rows = Dataset.from_dict({"prompt": PROMPTS[:4]})

    def reward(prompts, completions, **kw):
        return [float(len(c[0]) % 3) for c in completions]

    return cls(args=args, model=qwen_path, peft_config=peft, train_dataset=rows, reward_funcs=reward)


def _distinct_lora(team):
    """LoRA B starts at zero (every adapter = the base): give the adapters different weights."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in team.shared_base.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)


@pytest.mark.parametrize("lora", [False, True], ids=["separate", "lora"])
def test_greedy_continuous_batching_equals_generate(tmp_path, qwen_path, lora):
    trainer = _trainer(tmp_path, qwen_path, cb=True, lora=lora)
    team = trainer.team
    assert isinstance(trainer.sampler.backend, ContinuousBatchingBackend)
    if lora:
        _distinct_lora(team)
    trainer.model.eval()
    observations = {a: [p + f" {a}" for p in PROMPTS] for a in team.names}
    sampler = trainer.sampler_for_step(greedy=True)
    cb = sampler(observations)
    plain_sampler = dataclasses.replace(sampler, backend=GenerateBackend())
    plain = plain_sampler(observations)
    a, b = team.names
    assert not torch.equal(plain[a].response_ids, plain[b].response_ids)  # the agents answer differently
    for name in team.names:
        assert cb[name].response_ids.shape[1] == plain[name].response_ids.shape[1] == trainer.args.response_length
        for field in ("query_ids", "query_mask", "response_ids", "response_mask", "ended"):
            assert torch.equal(getattr(cb[name], field), getattr(plain[name], field)), (name, field)
        assert cb[name].texts == plain[name].texts

    # A stop token that greedy decoding produces mid-answer: both backends stop there and mask the rest.
    response = plain[a].response_ids[0]
    stop = dataclasses.replace(sampler.settings, stop_token_ids=(int(response[2]),))
    plain = plain_sampler.with_settings(stop)(observations)
    cb = sampler.with_settings(stop)(observations)
    assert bool(plain[a].ended[0]) and int(plain[a].response_mask[0].sum()) <= 3
    for name in team.names:
        for field in ("response_ids", "response_mask", "ended"):
            assert torch.equal(getattr(cb[name], field), getattr(plain[name], field)), (name, field)


def _first_token_probs(model, ids, temperature, top_k):
    """The exact sampling distribution of the first new token: softmax(logits / T) over the top-k logits."""
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1] / temperature
    keep = logits.topk(top_k).indices
    probs = torch.zeros_like(logits)
    probs[keep] = torch.softmax(logits[keep], dim=-1)
    return probs


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    support = probs > 0
    assert int(counts[~support].sum()) == 0, "a token outside the top-k was sampled"
    observed, expected = counts[support].double(), probs[support].double() * counts.sum()
    statistic = ((observed - expected) ** 2 / expected).sum()
    dof = torch.tensor(float(int(support.sum()) - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, statistic / 2))  # the chi-square survival function


def test_sampled_first_tokens_follow_the_sampling_distribution(tiny_lm):
    """2,000 samples of the first token from each backend against the exact top-k / temperature distribution.

    A backend that ignored the temperature fails: the same test rejects the counts against the T=1 distribution.
    """
    model, tok = tiny_lm
    prompt = tok("the team writes the plan", add_special_tokens=False, return_tensors="pt")["input_ids"]
    n, temperature, top_k = 2000, 0.5, 6
    ids = prompt.expand(n, -1).contiguous()
    mask = torch.ones_like(ids)
    settings = SamplingSettings(max_new_tokens=1, temperature=temperature, top_k=top_k)
    probs = _first_token_probs(model, prompt, temperature, top_k)
    wrong = _first_token_probs(model, prompt, 1.0, top_k)
    assert float((probs - wrong).abs().sum()) > 0.2  # the two distributions are far enough apart to tell
    torch.manual_seed(0)
    for backend in (GenerateBackend(batch_size=500), ContinuousBatchingBackend(CB_CONFIG)):
        first = backend.generate(GenerationRequest(model, ids, mask, settings, pad_id=tok.pad_token_id)).tokens[:, 0]
        counts = torch.bincount(first, minlength=probs.numel())
        assert _chi_square_p(counts, probs) > 1e-3, backend.name
        assert _chi_square_p(counts, wrong) < 1e-6, backend.name


def test_the_policy_sampler_draws_from_softmax_over_the_temperature():
    """PolicySampler (one uniform per row, the inverse of the cumulative sum) against the exact distribution: 40,000
    draws at T = 0.5, a token of probability 0 never drawn, the returned scores one-hot on the drawn token (what
    generate()'s greedy step then picks), the recorded log-probs those of the drawn tokens."""
    torch.manual_seed(0)
    n = 40_000
    row = torch.tensor([2.0, 1.0, 0.5, -1.0, float("-inf"), 0.0])
    scores = row.expand(n, -1).contiguous()
    sampler = PolicySampler(0.5)
    out = sampler(torch.zeros(n, 3, dtype=torch.long), scores)
    token = out.argmax(-1)
    assert (out.gather(-1, token[:, None]) == 0).all() and int(torch.isinf(out).sum()) == n * 5
    counts = torch.bincount(token, minlength=6)
    assert int(counts[4]) == 0
    assert _chi_square_p(counts, torch.softmax(row / 0.5, -1)) > 1e-3
    assert _chi_square_p(counts, torch.softmax(row, -1)) < 1e-6  # a sampler that ignored the temperature fails
    expected = torch.log_softmax(row / 0.5, -1)[token][:, None]
    torch.testing.assert_close(sampler.finish(token[:, None]), expected)


def test_generate_samples_the_policy_without_an_exponential_per_word(tiny_lm, monkeypatch):
    """Sampling the policy itself (no filter, no penalty), the generate backend draws with PolicySampler, never
    torch.multinomial, and its first tokens follow softmax(logits / T) (chi-square over the 8 likeliest tokens and
    the rest pooled); with top-k, or with `policy_sampler=False`, generate()'s own sampler runs."""
    model, tok = tiny_lm
    prompt = tok("the team writes the plan", add_special_tokens=False, return_tensors="pt")["input_ids"]
    n, temperature = 2000, 0.5
    ids = prompt.expand(n, -1).contiguous()
    mask = torch.ones_like(ids)
    settings = SamplingSettings(max_new_tokens=1, temperature=temperature)
    vocab = model.config.vocab_size
    probs = _first_token_probs(model, prompt, temperature, vocab)
    top = probs.topk(8).indices

    def pooled(p: torch.Tensor) -> torch.Tensor:
        return torch.cat([p[top], (p.sum() - p[top].sum()).reshape(1)])

    def forbidden(*args, **kwargs):
        raise AssertionError("torch.multinomial ran")

    monkeypatch.setattr(torch, "multinomial", forbidden)
    torch.manual_seed(0)
    request = GenerationRequest(model, ids, mask, settings, pad_id=tok.pad_token_id)
    first = GenerateBackend(batch_size=500).generate(request).tokens[:, 0]
    counts = pooled(torch.bincount(first, minlength=vocab).double())
    assert _chi_square_p(counts, pooled(probs)) > 1e-3
    assert _chi_square_p(counts, pooled(_first_token_probs(model, prompt, 1.0, vocab))) < 1e-6
    few = GenerationRequest(model, ids[:2], mask[:2], settings, pad_id=tok.pad_token_id)
    with pytest.raises(AssertionError, match="multinomial"):
        GenerateBackend(policy_sampler=False).generate(few)
    with pytest.raises(AssertionError, match="multinomial"):
        GenerateBackend().generate(dataclasses.replace(few, settings=dataclasses.replace(settings, top_k=6)))


@pytest.fixture(scope="module")
def tiny_lm(model_cache):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_collm.testing import tiny_model_dir

    path = tiny_model_dir("tiny-qwen2")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():  # random init gives near-flat logits; sharpen them so temperatures differ visibly
        model.lm_head.weight.mul_(10.0)
    return model, AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("trainer_kind,lora", [("ppo", False), ("mc", True)], ids=["ppo-separate", "mc-lora"])
def test_training_runs_on_continuous_batching(tmp_path, qwen_path, trainer_kind, lora):
    from unittest import mock

    trainer = _trainer(tmp_path, qwen_path, cb=True, lora=lora, trainer=trainer_kind)
    model = trainer.team.model_of(trainer.team.names[0])
    owner = type(model.get_base_model() if lora else model)  # the transformers class that owns generate_batch
    generate_batch, calls = owner.generate_batch, []

    def counting(self, prompts, *a, **k):
        calls.append(len(prompts))
        return generate_batch(self, prompts, *a, **k)

    before = {a: [p.detach().clone() for p in trainer.team.agent_parameters(a)] for a in trainer.team.names}
    with mock.patch.object(owner, "generate_batch", counting):
        trainer.train()
    assert calls, "continuous batching never ran"
    if lora:
        assert len(calls) == 2  # one generate_batch call per adapter
    for a in trainer.team.names:
        moved = any(not torch.equal(p0, p1) for p0, p1 in zip(before[a], trainer.team.agent_parameters(a)))
        assert moved, f"agent {a} did not train"
    history = trainer._metrics_history
    assert history and all(torch.isfinite(torch.tensor(float(h["loss/policy_avg"]))) for h in history)


def test_continuous_batching_refuses_what_it_cannot_do(tiny_lm):
    model, tok = tiny_lm
    ids = tok("red wool", return_tensors="pt")["input_ids"]
    with pytest.raises(ValueError, match="transformers_continuous_batching_config has unknown keys"):
        ContinuousBatchingBackend({"pages": 3})
    # ZeRO-3 lockstep decoding (generate()'s synced_gpus=True) cannot be honoured; False is what it does anyway
    greedy = SamplingSettings(max_new_tokens=2, greedy=True)
    with pytest.raises(ValueError, match="lockstep"):
        ContinuousBatchingBackend(CB_CONFIG).generate(
            GenerationRequest(model, ids, torch.ones_like(ids), greedy, pad_id=0, lockstep=True)
        )
    out = ContinuousBatchingBackend(CB_CONFIG).generate(
        GenerationRequest(model, ids, torch.ones_like(ids), greedy, pad_id=0, lockstep=False)
    )
    assert out.tokens.shape == (1, 2) and out.logprobs is None


def test_building_a_trainer_does_not_import_deepspeed(tmp_path, qwen_path):
    code = f"""
import sys
from datasets import Dataset
from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer
args = MultiAgentPPOConfig(output_dir={str(tmp_path)!r}, num_agents=2, per_device_train_batch_size=2, response_length=4,
                           report_to=[], use_cpu=True, bf16=False, save_strategy="no", total_episodes=2)
trainer = MultiAgentPPOTrainer(args=args, model={qwen_path!r},
                               train_dataset=Dataset.from_dict({{"prompt": ["a b", "c d"]}}),
                               reward_funcs=lambda prompts, completions, **k: [0.0] * len(prompts))
built = "deepspeed" in sys.modules
trainer.train()
print({{"built": built, "trained": "deepspeed" in sys.modules}})
"""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed: nothing to keep unimported")
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD_S, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(
        proc.stdout.strip().splitlines()[-1].replace("'", '"').replace("False", "false").replace("True", "true")
    )
    assert result == {"built": False, "trained": False}


def test_eval_and_play_flags_select_the_backend():
    from trl_collm.cli.evaluate import _eval_parser

    parser = _eval_parser("trl-collm play", play=True)
    base = ["--team_dir", "t", "--task", "coord-penalty"]
    assert isinstance(make_backend(parser.parse_args(base)), GenerateBackend)
    backend = make_backend(
        parser.parse_args(
            [
                *base,
                "--use_transformers_continuous_batching",
                "--transformers_continuous_batching_config",
                '{"page_size": 16}',
            ]
        )
    )
    assert isinstance(backend, ContinuousBatchingBackend) and backend.config == {"page_size": 16}


def test_continuous_batching_keeps_its_manager_between_calls(tiny_lm, monkeypatch):
    """The manager (paged cache, warm-up) is built once and reused while the settings and sizes allow, rebuilt when
    they do not; a reused manager gives the same greedy tokens as generate()."""
    from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager

    model, tok = tiny_lm
    built = []
    original_init = ContinuousBatchingManager.__init__

    def counting_init(self, *a, **k):
        built.append(self)
        original_init(self, *a, **k)

    monkeypatch.setattr(ContinuousBatchingManager, "__init__", counting_init)
    backend = ContinuousBatchingBackend(CB_CONFIG)
    short = tok(["red wool", "blue wool"], return_tensors="pt", padding=True)
    pad = dict(pad_id=tok.pad_token_id)

    def call(backend, settings):
        return backend.generate(
            GenerationRequest(model, short["input_ids"], short["attention_mask"], settings, **pad)
        ).tokens

    greedy = SamplingSettings(max_new_tokens=4, greedy=True)
    first = call(backend, greedy)
    second = call(backend, greedy)
    assert len(built) == 1 and torch.equal(first, second)
    assert torch.equal(second, call(GenerateBackend(), greedy))
    # other settings: a new manager (the old one is freed)
    call(backend, SamplingSettings(max_new_tokens=4, top_k=5))
    assert len(built) == 2
    # a longer answer than the manager was built for: rebuilt; then the same call again reuses it
    longer = SamplingSettings(max_new_tokens=12, top_k=5)
    call(backend, longer)
    call(backend, longer)
    assert len(built) == 3
    assert len(backend._managers) == 1
    backend.close()
    assert not backend._managers and not hasattr(model, "_cached_continuous_batching_manager")


def _scoring_policy_forwards(trainer, roll):
    """Run PPO's scoring pass and count the policy log-prob forwards it made (reference forwards not counted)."""
    calls = []
    team = trainer.team
    original = team.logprobs

    def counting(*a, **k):
        if not k.get("reference", False):
            calls.append(a[0])
        return original(*a, **k)

    team.logprobs = counting
    try:
        scored = trainer.score_rollout(roll)
    finally:
        del team.logprobs
    return calls, scored


@pytest.mark.parametrize("lora", [False, True], ids=["separate", "lora"])
def test_old_logprobs_come_from_the_sampler(tmp_path, qwen_path, lora):
    """With several PPO epochs the old log-probs are the sampler's (no scoring forward), equal to a fresh forward's
    up to float rounding, in chunks and for LoRA adapters routed per row; a logits-changing generation setting or
    the continuous-batching backend falls back to the forward."""
    trainer = _trainer(
        tmp_path, qwen_path, cb=False, lora=lora, num_ppo_epochs=2, temperature=0.7, local_rollout_forward_batch_size=3
    )
    team = trainer.team
    if lora:
        _distinct_lora(team)
    assert trainer.sampler.logprob_temperature == 0.7
    trainer.model.eval()
    roll = trainer.rollout([{"prompt": p} for p in PROMPTS[:4]])
    calls, scored = _scoring_policy_forwards(trainer, roll)
    assert calls == []  # no policy forward in scoring
    for t, turn in enumerate(roll.turns):
        for a, at in turn.items():
            g = at.gen
            assert g.sampled_logprobs is not None and g.sampled_logprobs.shape == g.response_ids.shape
            fresh = team.logprobs(a, g.query_ids, g.query_mask, g.response_ids, g.response_mask, 0.7)[0].detach()
            torch.testing.assert_close(scored.turns[t][a].old_logprobs, fresh.masked_fill(~g.response_mask, 0.0))
            assert (g.sampled_logprobs[~g.response_mask] == 0).all()

    # a repetition penalty changes the logits before the recorder sees them: the forward computes them instead
    for a in team.names:
        model = team.model_of(a)
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        inner.generation_config.repetition_penalty = 1.3
    assert not trainer.plan_iteration(4).old_logprobs_from_sampler.on
    trainer.sampler = trainer.build_sampler()  # what the trainer builds for such a team
    assert trainer.sampler.logprob_temperature is None
    roll = trainer.rollout([{"prompt": p} for p in PROMPTS[:4]])
    calls, _ = _scoring_policy_forwards(trainer, roll)
    assert len(calls) == len(team.names) * roll.num_turns * 2  # 4 rows in chunks of 3


def test_continuous_batching_leaves_old_logprobs_to_the_forward(tmp_path, qwen_path):
    trainer = _trainer(tmp_path, qwen_path, cb=True, num_ppo_epochs=2)
    trainer.model.eval()
    roll = trainer.rollout([{"prompt": p} for p in PROMPTS[:4]])
    assert all(at.gen.sampled_logprobs is None for turn in roll.turns for at in turn.values())
    calls, _ = _scoring_policy_forwards(trainer, roll)
    assert len(calls) == len(trainer.team.names) * roll.num_turns


def test_grpo_sampling_settings_reach_generate_and_the_recorder_knows_its_place(tmp_path, qwen_path):
    """GRPO's `repetition_penalty` changes what generate() decodes and the logits the recorder sees: the sampler then
    records no log-probs (the forward computes the policy's); `min_p` filters after the recorder: the recorded
    log-probs are still the policy's, over the whole vocabulary."""
    from trl_collm.generation.backends import sampler_logits_are_the_models

    trainer = _trainer(tmp_path, qwen_path, cb=False, num_ppo_epochs=2, temperature=0.7)
    team, sampler = trainer.team, trainer.sampler
    trainer.model.eval()
    observations = {a: PROMPTS[:4] for a in team.names}
    greedy = dataclasses.replace(sampler.settings, greedy=True)
    plain = sampler.with_settings(greedy)(observations)
    penalised = sampler.with_settings(dataclasses.replace(greedy, repetition_penalty=0.2))(observations)
    # below 1 the penalty favours tokens already there: the tiny model then repeats itself
    assert any(not torch.equal(plain[a].response_ids, penalised[a].response_ids) for a in team.names)
    assert all(plain[a].sampled_logprobs is not None and penalised[a].sampled_logprobs is None for a in team.names)
    model = team.model_of(team.names[0])
    penalty = dataclasses.replace(greedy, repetition_penalty=0.2)
    assert sampler_logits_are_the_models(model, greedy) and not sampler_logits_are_the_models(model, penalty)

    torch.manual_seed(0)
    filtered = sampler.with_settings(dataclasses.replace(sampler.settings, min_p=0.3))(observations)
    for a in team.names:
        g = filtered[a]
        fresh = team.logprobs(a, g.query_ids, g.query_mask, g.response_ids, g.response_mask, 0.7)[0].detach()
        torch.testing.assert_close(g.sampled_logprobs, fresh.masked_fill(~g.response_mask, 0.0))


def test_vllm_sampling_params_carry_grpos_settings():
    """vLLM's SamplingParams get min_p / repetition_penalty under their names (vLLM's are GRPO's) and
    generation_kwargs as they are; a name SamplingParams does not take is one line."""
    from trl_collm.generation.vllm_backend import _sampling_params

    class FakeParams:  # SamplingParams' keyword-only constructor, without vLLM installed
        def __init__(self, *, n, max_tokens, temperature, top_p, top_k, min_p, repetition_penalty, stop_token_ids,
                     ignore_eos, logprobs, detokenize, seed, presence_penalty=0.0):  # fmt: skip
            self.__dict__.update(locals())

    settings = SamplingSettings(5, temperature=0.7, min_p=0.1, repetition_penalty=1.2)
    settings = dataclasses.replace(settings, generation_kwargs={"presence_penalty": 0.5})
    p = _sampling_params(FakeParams, settings, [2], seed=3)
    assert (p.min_p, p.repetition_penalty, p.presence_penalty, p.temperature) == (0.1, 1.2, 0.5, 0.7)
    greedy = _sampling_params(FakeParams, dataclasses.replace(settings, greedy=True), [2], seed=3)
    assert (greedy.temperature, greedy.min_p, greedy.repetition_penalty) == (0.0, 0.0, 1.2)
    bad = dataclasses.replace(settings, generation_kwargs={"no_repeat_ngram_size": 2})
    with pytest.raises(ValueError, match=r"^`generation_kwargs` \['no_repeat_ngram_size'\] with use_vllm: vLLM's"):
        _sampling_params(FakeParams, bad, [2], seed=3)
