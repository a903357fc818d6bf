"""The prompt prefill kept from sampling (trl_collm/team/prompt_cache.py): the update's log-probs and gradients from
the kept cache equal the plain forward's, sampling with it draws the same tokens, and training with it learns the same
weights, while the update really forwards only the responses."""

from __future__ import annotations

import pytest
import torch
from rounding import assert_trained_weights_close, trained_weights

from trl_collm.generation.backends import GenerateBackend
from trl_collm.generation.sampler import GenerationRequest, SamplingSettings
from trl_collm.team import prefix, prompt_cache
from trl_collm.team.modeling import left_pad

INSTRUCTION = list(range(40, 70))  # 30 tokens every row starts with


@pytest.fixture(scope="module")
def tiny_lm(model_cache):
    from transformers import AutoModelForCausalLM

    from trl_collm.testing import tiny_model_dir

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir("tiny-qwen2"))


def _prompts(kind: str):
    if kind == "common-prefix":
        rows = [INSTRUCTION + [5, 6, 7], INSTRUCTION + [8, 9], INSTRUCTION + [10, 11, 12, 13, 14], INSTRUCTION + [3]]
    elif kind == "repeated-rows":
        rows = [[7, 8, 9, 10] * 5, [7, 8, 9, 10] * 5, [11, 12, 13] * 3, [11, 12, 13] * 3]
    else:  # nothing shared: the plain prefill
        rows = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16], [17, 18, 19]]
    ids, mask = left_pad(rows, 0, "cpu")
    g = torch.Generator().manual_seed(1)
    resp = torch.randint(5, 200, (ids.shape[0], 6), generator=g)
    rmask = torch.ones_like(resp, dtype=torch.bool)
    rmask[1, 4:] = False  # a response that stopped early: right padding after it
    return ids, mask, resp, rmask


def _loss(logits, resp, rmask):
    logp = logits.float().log_softmax(-1).gather(-1, resp[..., None]).squeeze(-1)
    return (logp * rmask).sum()


@pytest.mark.parametrize("kind", ["common-prefix", "repeated-rows", "plain"])
def test_logits_and_gradients_from_the_kept_prefill_match_the_plain_forward(tiny_lm, monkeypatch, kind):
    monkeypatch.setattr(prefix, "CALL_COST_TOKENS", 0)  # take every cut that saves tokens (the tiny model's calls)
    ids, mask, resp, rmask = _prompts(kind)
    results = []
    for kept in (False, True):
        tiny_lm.zero_grad()
        if kept:
            cache = prompt_cache.prefill(tiny_lm, ids, mask)
            assert cache is not None and all(k.requires_grad for k in cache.keys)
            logits = prompt_cache.response_logits(tiny_lm, cache, resp, rmask)
        else:
            full_ids, full_mask = torch.cat([ids, resp], 1), torch.cat([mask, rmask.long()], 1)
            logits = prefix.forward_last(tiny_lm, full_ids, full_mask, resp.shape[1] + 1, causal_lm=True)[:, :-1]
        _loss(logits, resp, rmask).backward()
        grads = {n: p.grad.clone() for n, p in tiny_lm.named_parameters() if p.grad is not None}
        results.append((logits.detach(), grads))
    (plain, plain_grads), (kept, kept_grads) = results
    assert kept.shape == plain.shape == (4, 6, tiny_lm.config.vocab_size)
    real = rmask  # logits at right padding predict nothing: compared where the loss reads them
    torch.testing.assert_close(kept[real], plain[real], rtol=1e-5, atol=1e-5)
    assert kept_grads.keys() == plain_grads.keys() and len(plain_grads) > 10
    for name, grad in plain_grads.items():
        torch.testing.assert_close(kept_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    # the embedding's gradient reaches prompt tokens through the kept graph: the prompt really is differentiated
    emb = kept_grads["model.embed_tokens.weight"]
    assert emb[INSTRUCTION[0] if kind == "common-prefix" else int(ids[0, -1])].abs().sum() > 0


def test_a_cache_with_its_rows_reordered_and_left_padded_gives_the_same_logits(tiny_lm):
    ids, mask, resp, rmask = _prompts("plain")
    cache = prompt_cache.prefill(tiny_lm, ids, mask)
    with torch.no_grad():
        want = prompt_cache.response_logits(tiny_lm, cache, resp, rmask)
        order = torch.tensor([2, 0, 3, 1])
        moved = prompt_cache.PromptCache.cat([cache.rows(order[:2]), cache.rows(order[2:]).left_padded(9)])
        assert moved.length == 9 and len(moved) == 4
        got = prompt_cache.response_logits(tiny_lm, moved, resp[order], rmask[order])
    torch.testing.assert_close(got[rmask[order]], want[order][rmask[order]], rtol=1e-5, atol=1e-5)


def test_a_model_that_cannot_run_on_a_cache_with_gradients_gets_no_prefill(tiny_lm):
    ids, mask, _, _ = _prompts("plain")
    tiny_lm.gradient_checkpointing_enable()
    try:
        assert prompt_cache.prefill(tiny_lm, ids, mask) is None
    finally:
        tiny_lm.gradient_checkpointing_disable()
    assert prompt_cache.prefill(tiny_lm, ids[:, -1:], mask[:, -1:]) is None  # one-token prompts: nothing to keep


def _request(model, ids, mask, keep, adapters=None, use_adapter=None):
    settings = SamplingSettings(max_new_tokens=5, temperature=1.0, top_k=0, top_p=1.0)
    return GenerationRequest(
        model, ids, mask, settings, pad_id=0, adapter_names=adapters, use_adapter=use_adapter, keep_prompt_graph=keep
    )


def test_sampling_with_a_kept_prefill_draws_the_same_tokens(tiny_lm):
    ids, mask, _, _ = _prompts("common-prefix")
    out = {}
    for keep in (False, True):
        torch.manual_seed(3)
        out[keep] = GenerateBackend(share_prefix=True).generate(_request(tiny_lm, ids, mask, keep))
    assert torch.equal(out[True].tokens, out[False].tokens)
    torch.testing.assert_close(out[True].logprobs, out[False].logprobs, rtol=1e-5, atol=1e-5)
    assert out[False].prompt_caches is None
    (cache,) = out[True].prompt_caches.values()
    assert len(cache) == 4 and torch.equal(cache.last_ids, ids[:, -1])
    assert all(k.requires_grad and k.grad_fn is not None for k in cache.keys)


def test_mixed_adapter_sampling_keeps_one_prefill_per_adapter(tmp_path, qwen_path, prompts_dataset, make_config):
    team = _ppo(tmp_path, qwen_path, prompts_dataset, make_config, True).team
    assert team.layout == "shared_base"
    team.shared_base.eval()  # as while sampling (PEFT routes rows to adapters only in eval mode)
    for i, name in enumerate(team.names):  # adapters that differ, so a row routed to the wrong one would show
        with team.active(name) as m, torch.no_grad():
            for n, p in m.named_parameters():
                if "lora_B" in n and f".{name}." in n:
                    p.add_(0.05 * (i + 1))
    ids, mask, resp, rmask = _prompts("plain")
    adapters = [team.names[0], team.names[1], team.names[0], team.names[1]]
    out = {}
    for keep in (False, True):
        torch.manual_seed(3)
        request = _request(team.shared_base, ids, mask, keep, adapters, team.active)
        out[keep] = GenerateBackend().generate(request)
    assert torch.equal(out[True].tokens, out[False].tokens)
    caches = out[True].prompt_caches
    assert sorted(caches) == sorted(team.names)
    for name, rows in ((team.names[0], [0, 2]), (team.names[1], [1, 3])):
        rows = torch.tensor(rows)
        cache = caches[name]
        assert torch.equal(cache.last_ids, ids[rows, -1])
        with team.active(name) as m:
            got = prompt_cache.response_logits(m, cache, resp[rows], rmask[rows])
            full = torch.cat([ids[rows], resp[rows]], 1), torch.cat([mask[rows], rmask[rows].long()], 1)
            want = prefix.forward_last(m, *full, resp.shape[1] + 1, causal_lm=True)[:, :-1]
        torch.testing.assert_close(got[rmask[rows]], want[rmask[rows]], rtol=1e-5, atol=1e-5)
        # each agent's prefill is its own graph: one agent's backward leaves the other's intact
        _loss(got, resp[rows], rmask[rows]).backward()


def _reward(prompts, completions, **kw):
    return [float(len(c[0]) % 3) for c in completions]


def _lora():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


def _ppo(tmp_path, qwen_path, prompts_dataset, make_config, keep: bool, **overrides):

    from trl_collm import MultiAgentPPOTrainer

    settings = dict(num_agents=2, learning_rate=1e-2, num_ppo_epochs=1, kl_coef=0.0, reuse_rollout_prefill=keep)
    if overrides.get("preset"):
        settings = dict(num_agents=2, kl_coef=0.0, reuse_rollout_prefill=keep)  # the preset's own update rule
    args = make_config(tmp_path / f"keep-{keep}", **{**settings, **overrides})
    reward = dict(reward_funcs=_reward)
    if args.num_turns == 2:
        from test_trainer_e2e import TwoTurnEnv

        reward = dict(env=TwoTurnEnv())
    trainer = MultiAgentPPOTrainer(
        args=args,
        model=qwen_path,
        peft_config=_lora(),
        train_dataset=prompts_dataset,
        **reward,
    )
    return trainer


@pytest.mark.parametrize("critic_type", ["centralized", "decentralized"])
def test_ppo_training_with_the_kept_prefill_matches_training_without(
    tmp_path, qwen_path, prompts_dataset, make_config, monkeypatch, critic_type
):
    """The same weights and logged metrics; with the prefill kept, every policy forward of the update ran on it
    (response tokens only) and the plain prompt + response forward ran with gradients only for the critic."""
    calls = []
    plain_forward, on_cache = prefix.forward_last, prompt_cache.response_logits

    def counting_plain(model, ids, *a, **k):
        calls.append(("plain", torch.is_grad_enabled(), ids.shape[1]))
        return plain_forward(model, ids, *a, **k)

    def counting_cache(model, cache, resp, *a, **k):
        calls.append(("cache", torch.is_grad_enabled(), resp.shape[1]))
        return on_cache(model, cache, resp, *a, **k)

    monkeypatch.setattr(prefix, "forward_last", counting_plain)
    monkeypatch.setattr(prompt_cache, "response_logits", counting_cache)
    runs = {}
    for keep in (False, True):
        calls.clear()
        trainer = _ppo(tmp_path, qwen_path, prompts_dataset, make_config, keep, critic_type=critic_type)
        assert trainer.plan_iteration(4).reuse_rollout_prefill.on is keep
        trainer.train()
        weights = trained_weights(trainer)
        runs[keep] = (weights, trainer._metrics_history, list(calls))
    (w_off, hist_off, calls_off), (w_on, hist_on, calls_on) = runs[False], runs[True]
    n_policy_forwards = 2 * 2  # 2 iterations x 2 agents
    assert [c[:2] for c in calls_on if c[0] == "cache"] == [("cache", True)] * n_policy_forwards
    assert not [c for c in calls_off if c[0] == "cache"]
    assert sum(c[0] == "plain" and c[1] for c in calls_off) - sum(c[0] == "plain" and c[1] for c in calls_on) == (
        n_policy_forwards
    )
    for a in w_off:
        assert_trained_weights_close(w_on[a], w_off[a], lr=1e-2)
    assert len(hist_on) == len(hist_off) == 2
    for h_on, h_off in zip(hist_on, hist_off):
        for key in ("loss/policy_avg", "loss/value_avg", "objective/scores", "objective/entropy", "val/ratio"):
            assert h_on[key] == pytest.approx(h_off[key], rel=1e-4, abs=1e-6), key


def test_mc_training_with_the_kept_prefill_matches_training_without(tmp_path, qwen_path, prompts_dataset):
    from conftest import RUN_SETTINGS

    from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer

    runs = {}
    for keep in (False, True):
        args = MultiAgentMCConfig(
            **dict(RUN_SETTINGS, output_dir=str(tmp_path / f"mc-{keep}")),
            num_agents=2,
            num_generations=2,
            per_device_train_batch_size=2,
            total_episodes=4,
            response_length=5,
            learning_rate=1e-2,
            seed=0,
            reuse_rollout_prefill=keep,
        )
        trainer = MultiAgentMCTrainer(
            args=args,
            model=qwen_path,
            peft_config=_lora(),
            train_dataset=prompts_dataset,
            reward_funcs=lambda prompts, completions, **kw: [float(len(c[0]) % 3) for c in completions],
        )
        kept = []
        real = trainer.prompt_cache_rows
        trainer.prompt_cache_rows = lambda g, rows: kept.append(g.prompt_cache is not None) or real(g, rows)
        trainer.train()
        weights = trained_weights(trainer)
        runs[keep] = weights, trainer._metrics_history, kept
    (w_off, hist_off, kept_off), (w_on, hist_on, kept_on) = runs[False], runs[True]
    assert kept_on == [True] * 4 and kept_off == [False] * 4  # 2 iterations x 2 agents
    for a in w_off:
        assert_trained_weights_close(w_on[a], w_off[a], lr=1e-2)
    for h_on, h_off in zip(hist_on, hist_off):
        assert h_on["loss/policy_avg"] == pytest.approx(h_off["loss/policy_avg"], rel=1e-4, abs=1e-6)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(reuse_rollout_prefill=False),  # the user's switch (memory)
        dict(num_ppo_epochs=2),
        dict(num_mini_batches=2),
        dict(activation_checkpointing=True),
        dict(per_device_train_batch_size=2),  # 4 episodes in two micro-batches: each prefill would back two losses
        dict(preset="collm", num_turns=2),  # per-agent steps: turn 0's step moves the weights turn 1 sampled with
    ],
)
def test_the_prefill_is_not_kept_when_the_update_would_not_see_the_sampling_weights_once(
    tmp_path, qwen_path, prompts_dataset, make_config, overrides
):
    trainer = _ppo(tmp_path, qwen_path, prompts_dataset, make_config, True, **overrides)
    assert trainer.plan_iteration(4 * trainer.args.num_turns).reuse_rollout_prefill.on is False
    roll = trainer.rollout(list(prompts_dataset)[:4], keep_prompt_graph=False)
    assert all(at.gen.prompt_cache is None for turn in roll.turns for at in turn.values())
