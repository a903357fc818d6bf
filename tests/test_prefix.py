"""The shared-prefix forward (trl_collm/team/prefix.py) gives the plain forward's numbers while computing the prefix
once."""

from __future__ import annotations

import pytest
import torch
from rounding import assert_trained_weights_close, trained_weights

from trl_collm.team import prefix
from trl_collm.team.modeling import left_pad
from trl_collm.team.prefix import position_ids_from_mask
from trl_collm.trainers.console import is_wall_clock

INSTRUCTION = list(range(40, 70))  # 30 tokens every row starts with


@pytest.fixture(autouse=True)
def every_cut_pays(monkeypatch, request):
    """These tests check that a cut gives the plain forward's numbers: take every cut that saves tokens, although
    the cost model would run the tiny test models plainly. The cost model's own tests opt out."""
    if "cost_model" not in request.node.name:
        monkeypatch.setattr(prefix, "CALL_COST_TOKENS", 0)


def test_cost_model_takes_a_cut_only_when_the_saved_tokens_pay_for_the_extra_call(tiny_lm):
    from types import SimpleNamespace

    tiny = prefix.min_saved_tokens(tiny_lm)
    # tiny_lm: hidden 32, 4 heads x 8, 2 kv heads x 8, MLP 64 -> 2*32*32 + 2*32*16 + 3*32*64 = 9216 weights
    assert prefix.layer_parameters(tiny_lm) == 9216
    assert tiny == 598  # ceil(650 / (1 + 9216 / 105000)) = ceil(597.5)
    wide = SimpleNamespace(
        config=SimpleNamespace(hidden_size=1024, num_attention_heads=16, num_key_value_heads=16, intermediate_size=4096)
    )
    assert prefix.layer_parameters(wide) == 2 * 1024**2 + 2 * 1024**2 + 3 * 1024 * 4096
    assert prefix.min_saved_tokens(wide) == 5  # a big layer: nearly any saving pays
    # MC-like batch: 2 prompts of 20 tokens, 4 samples each, 6 response tokens: the G copies save 3 x 2 x 20 tokens.
    heads = torch.arange(3, 43).view(2, 20).repeat_interleave(4, 0)
    ids = torch.cat([heads, torch.arange(100, 148).view(8, 6)], 1)
    mask = torch.ones_like(ids)
    split = prefix.plan_split(ids, mask, keep=7)
    assert split is not None and split.saved_tokens == 3 * 2 * 19  # the head stops one column before the kept 7
    assert prefix.plan_split(ids, mask, keep=7, min_saved=tiny) is None  # 114 < 598: the plain forward is cheaper
    assert prefix.plan_split(ids, mask, keep=7, min_saved=114) is not None  # the boundary: exactly pays
    assert prefix.plan_split(ids, mask, keep=7, min_saved=115) is None
    calls = []
    real_forward = tiny_lm.forward

    def counting(*a, **k):
        calls.append(k["input_ids"].shape)
        return real_forward(*a, **k)

    tiny_lm.forward = counting
    try:
        prefix.forward_last(tiny_lm, ids, mask, 7, causal_lm=True)
        assert len(calls) == 1  # the cost model declined: one plain call
        calls.clear()
        prefix.forward_last(tiny_lm, ids, mask, 7, causal_lm=True, min_saved=0)
        assert len(calls) == 2  # forced: head call + rest call
    finally:
        del tiny_lm.forward


def _batch():
    rows = [INSTRUCTION + [100, 101, 102], INSTRUCTION + [110] * 7, INSTRUCTION + [120], INSTRUCTION[:24] + [130, 131]]
    return left_pad(rows, 0, "cpu")


def test_split_finds_the_common_prefix_and_keeps_every_real_token_at_its_position():
    ids, mask = _batch()  # longest row 37 tokens; the last row diverges after 24 instruction tokens
    split = prefix.split_common_prefix(ids, mask, keep=2)
    assert split.head_ids.tolist() == [INSTRUCTION[:24]] and split.index is None
    assert split.saved_tokens == 3 * 24
    assert split.attention_mask.shape[1] == 24 + split.rest_ids.shape[1]
    # Each row's real rest tokens, in order, are its tokens after the prefix; positions continue from 24.
    orig_pos = position_ids_from_mask(mask)
    for i in range(ids.shape[0]):
        real = mask[i].bool()
        rest_real = split.attention_mask[i, 24:].bool()
        assert split.rest_ids[i][rest_real].tolist() == ids[i][real].tolist()[24:]
        assert split.rest_positions[i][rest_real].tolist() == orig_pos[i][real].tolist()[24:]
    # Right ends stay aligned: the last `keep` columns are the original last columns.
    assert torch.equal(split.rest_ids[:, -2:], ids[:, -2:])


def test_split_declines_when_it_would_not_pay():
    ids, mask = _batch()
    assert prefix.split_common_prefix(ids, mask, keep=2, min_prefix=25) is None  # the common part is 24 tokens
    assert prefix.split_common_prefix(ids[:1], mask[:1], keep=2) is None  # one row: nothing to share
    # The kept tail may not reach into the prefix: the shortest row (26 tokens) leaves 26 - 20 = 6 < 16 prefix tokens.
    assert prefix.split_common_prefix(ids, mask, keep=20) is None
    distinct = left_pad([[5] * 20, [6] * 20], 0, "cpu")
    assert prefix.split_common_prefix(*distinct, keep=1) is None
    assert prefix.split_repeated_rows(*distinct, keep=1) is None  # no row repeats
    assert prefix.plan_split(*distinct, keep=1) is None


def _repeated_batch():
    """Two prompts with no common prefix, each repeated as for G = 3 samples, with different responses."""
    a, b = list(range(100, 130)), list(range(140, 160))
    ids, mask = left_pad([a, b, a, b, a, b], 0, "cpu")
    return ids, mask


def test_rows_with_different_keys_never_share_a_head():
    ids, mask = _repeated_batch()  # prompts a, b, a, b, a, b
    keys = torch.tensor([0, 0, 1, 1, 1, 1])  # the first a / b run with another adapter than the other four
    split = prefix.split_repeated_rows(ids, mask, keep=1, row_keys=keys)
    assert split.head_ids.shape[0] == 4 and sorted(split.head_keys.tolist()) == [0, 0, 1, 1]
    assert split.index[0] != split.index[2] and split.index[2] == split.index[4] and split.index[1] != split.index[3]
    assert (split.head_keys[split.index] == keys).all()
    ids, mask = _batch()
    split = prefix.plan_split(ids, mask, keep=1, row_keys=torch.tensor([0, 1, 0, 1]))
    assert split.head_keys.tolist() == [0, 1] and split.index.tolist() == [0, 1, 0, 1]
    assert split.saved_tokens == 2 * 24  # the 24-token prefix runs twice (once per key) instead of four times
    assert prefix.plan_split(ids, mask, keep=1, row_keys=torch.arange(4)) is None  # every row its own key


def test_repeated_rows_run_each_distinct_head_once():
    ids, mask, resp, rmask = _with_responses(*_repeated_batch())
    assert prefix.split_common_prefix(ids, mask, keep=7) is None  # the two prompts start differently
    split = prefix.plan_split(ids, mask, keep=7)
    assert split.index is not None and split.head_ids.shape[0] == 2
    # Each row's head is its own prompt's columns; the rest is the original tail, unchanged.
    torch.testing.assert_close(split.head_ids[split.index], ids[:, :-7])
    assert torch.equal(split.rest_ids, ids[:, -7:]) and torch.equal(split.attention_mask, mask)
    assert split.saved_tokens == 2 * 29 + 2 * 19  # two extra copies of each prompt but its last token (kept for logits)
    assert torch.equal(split.layout_ids, ids)


@pytest.fixture(scope="module")
def tiny_lm(model_cache):
    from transformers import AutoModelForCausalLM

    from trl_collm.testing import tiny_model_dir

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir("tiny-qwen2"))


@pytest.fixture(scope="module")
def tiny_llama(model_cache):
    from transformers import AutoModelForCausalLM

    from trl_collm.testing import tiny_model_dir

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir("tiny-llama-b", arch="llama", flavor="b"))


def _with_responses(ids, mask):
    g = torch.Generator().manual_seed(1)
    resp = torch.randint(5, 200, (ids.shape[0], 6), generator=g)
    rmask = torch.ones_like(resp)
    rmask[1, 4:] = 0  # a response that stopped early: right padding inside the kept tail
    return torch.cat([ids, resp], 1), torch.cat([mask, rmask], 1), resp, rmask


def _logprob_loss(model, ids, mask, resp, rmask, enabled):
    logits = prefix.forward_last(model, ids, mask, resp.shape[1] + 1, causal_lm=True, enabled=enabled)
    logp = logits[:, :-1].log_softmax(-1).gather(-1, resp[..., None]).squeeze(-1)
    return logits, (logp * rmask).sum()


@pytest.mark.parametrize("batch", [_batch, _repeated_batch], ids=["common-prefix", "repeated-rows"])
def test_causal_lm_logits_and_gradients_match_the_plain_forward(tiny_lm, monkeypatch, batch):
    ids, mask, resp, rmask = _with_responses(*batch())
    results = {}
    for enabled in (False, True):
        tiny_lm.zero_grad()
        logits, loss = _logprob_loss(tiny_lm, ids, mask, resp, rmask, enabled)
        loss.backward()
        results[enabled] = (
            logits.detach(),
            {n: p.grad.clone() for n, p in tiny_lm.named_parameters() if p.grad is not None},
        )
    plain, shared = results[False], results[True]
    assert shared[0].shape == plain[0].shape == (ids.shape[0], 7, tiny_lm.config.vocab_size)
    torch.testing.assert_close(shared[0], plain[0], rtol=1e-5, atol=1e-5)
    assert plain[1].keys() == shared[1].keys() and len(plain[1]) > 10
    for name, grad in plain[1].items():
        torch.testing.assert_close(shared[1][name], grad, rtol=1e-4, atol=1e-5, msg=name)
    assert any(g.abs().sum() > 0 for g in plain[1].values())

    # And the shared path really ran: one call for the head(s), one for the rest.
    calls = []
    monkeypatch.setattr(
        tiny_lm, "forward", lambda *a, _f=tiny_lm.forward, **k: calls.append(k["input_ids"].shape) or _f(*a, **k)
    )
    _logprob_loss(tiny_lm, ids, mask, resp, rmask, True)
    if batch is _batch:  # the prefix once (batch 1), then each row's rest (the longest row has no left padding)
        assert calls == [torch.Size([1, 24]), torch.Size([4, ids.shape[1] - 24])]
    else:  # the two distinct prompts but their last token, then every row's last prompt token and response
        assert calls == [torch.Size([2, ids.shape[1] - 7]), torch.Size([6, 7])]


@pytest.mark.parametrize("batch", [_batch, _repeated_batch], ids=["common-prefix", "repeated-rows"])
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_backbone_hidden_states_match(tiny_lm, tiny_llama, batch, arch):
    lm = tiny_lm if arch == "qwen2" else tiny_llama
    ids, mask = batch()
    body = lm.model
    plain = prefix.forward_last(body, ids, mask, 3, causal_lm=False, enabled=False)
    shared = prefix.forward_last(body, ids, mask, 3, causal_lm=False, enabled=True)
    assert shared.shape == plain.shape == (ids.shape[0], 3, lm.config.hidden_size)
    torch.testing.assert_close(shared, plain, rtol=1e-5, atol=1e-5)


def test_activation_checkpointing_falls_back_to_the_plain_forward(tiny_lm):
    ids, mask = _batch()
    assert prefix.supports_prefix_cache(tiny_lm)
    tiny_lm.activation_checkpointing_enable()
    try:
        assert not prefix.supports_prefix_cache(tiny_lm)
    finally:
        tiny_lm.activation_checkpointing_disable()
    assert prefix.supports_prefix_cache(tiny_lm)


@pytest.mark.parametrize("batch", [_batch, _repeated_batch], ids=["common-prefix", "repeated-rows"])
def test_generate_with_prefix_returns_the_plain_layout_and_tokens(tiny_lm, batch):
    ids, mask = batch()
    kwargs = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, pad_token_id=0)
    plain = prefix.generate_with_prefix(tiny_lm, ids, mask, kwargs, enabled=False)
    shared = prefix.generate_with_prefix(tiny_lm, ids, mask, kwargs, enabled=True)
    assert shared.shape == plain.shape == (ids.shape[0], ids.shape[1] + 5)
    assert torch.equal(shared[:, : ids.shape[1]], ids)
    assert torch.equal(shared, plain)


# ---------------------------------------------------------------- through the trainers
LONG = "the team writes the plan and the critic gives a value to the plan of the team: "


PROMPTS = ("count one and", "red wool", "two plus three is", "the agents agree on")


def _train(tmp_path, path, trainer_kind, layout, share, monkeypatch, prompts):
    from conftest import RUN_SETTINGS
    from datasets import Dataset

    from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer, MultiAgentPPOConfig, MultiAgentPPOTrainer

    used = []
    plain_split = prefix.plan_split

    def counting(*a, **k):
        split = plain_split(*a, **k)
        used.append(split is not None and (split.index is not None) == (prompts is REPEATED))  # the cut expected
        return split

    monkeypatch.setattr(prefix, "plan_split", counting)
    data = Dataset.from_dict({"prompt": prompts})
    common = dict(
        RUN_SETTINGS,
        output_dir=str(tmp_path / f"{trainer_kind}-{layout}-{share}"),
        num_agents=2,
        response_length=5,
        total_episodes=8,
        learning_rate=1e-3,
        seed=0,
        share_prompt_prefix=share,
    )
    peft_config = None
    if layout == "shared_base":
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    if trainer_kind == "mc":
        args = MultiAgentMCConfig(
            num_generations=2,
            per_device_train_batch_size=2,
            total_episodes=4,
            **{k: v for k, v in common.items() if k != "total_episodes"},
        )
        trainer = MultiAgentMCTrainer(
            args=args,
            model=path,
            peft_config=peft_config,
            train_dataset=data,
            reward_funcs=lambda prompts, completions, **kw: [float(len(c[0]) % 3) for c in completions],
        )
    else:
        args = MultiAgentPPOConfig(
            critic_type=trainer_kind, per_device_train_batch_size=4, num_ppo_epochs=2, kl_coef=0.05, **common
        )
        trainer = MultiAgentPPOTrainer(
            args=args,
            model=path,
            peft_config=peft_config,
            train_dataset=data,
            reward_funcs=lambda prompts, completions, **kw: [float(len(c[0]) % 3) for c in completions],
        )
    trainer.train()
    weights = trained_weights(trainer)
    return trainer._metrics_history, weights, sum(used)


INSTRUCTED = [LONG + p for p in PROMPTS]  # one long common prefix
REPEATED = [" ".join([p] * 4) for p in PROMPTS]  # no common prefix; MC's G copies of a prompt repeat rows


@pytest.mark.parametrize(
    "trainer_kind,layout,prompts",
    [
        ("centralized", "separate", INSTRUCTED),
        ("decentralized", "shared_base", INSTRUCTED),
        ("mc", "separate", INSTRUCTED),
        ("mc", "shared_base", REPEATED),
    ],
    ids=["cc-separate", "dc-lora", "mc-separate", "mc-lora-repeated-rows"],
)
def test_training_with_a_shared_prefix_matches_training_without(
    tmp_path, qwen_path, trainer_kind, layout, prompts, monkeypatch
):
    hist_off, w_off, used_off = _train(tmp_path, qwen_path, trainer_kind, layout, False, monkeypatch, prompts)
    hist_on, w_on, used_on = _train(tmp_path, qwen_path, trainer_kind, layout, True, monkeypatch, prompts)
    assert used_off == 0 and used_on > 0
    assert len(hist_on) == len(hist_off) == 2
    for h_on, h_off in zip(hist_on, hist_off):
        numeric = [k for k, v in h_off.items() if isinstance(v, float) and not is_wall_clock(k)]
        assert len(numeric) > 5
        for k in numeric:
            if "clipfrac" in k:
                # A clip fraction is a step function of the ratio: an element a rounding error away from the clip
                # edge moves it by a whole 1/N. Compared structurally: a fraction on both paths, within a few
                # elements; the weights compared below are the continuous check of the same steps.
                assert 0.0 <= h_on[k] <= 1.0 and 0.0 <= h_off[k] <= 1.0, k
                assert h_on[k] == pytest.approx(h_off[k], abs=0.25), k
            else:
                assert h_on[k] == pytest.approx(h_off[k], rel=1e-3, abs=1e-5), k
    for a in w_off:
        assert_trained_weights_close(w_on[a], w_off[a], lr=1e-3)


def test_a_model_that_returns_no_cache_gets_the_plain_forward(tiny_lm):
    class NoCache(torch.nn.Module):
        """A causal LM wrapper whose outputs carry no KV cache (as some custom models do)."""

        def __init__(self, lm):
            super().__init__()
            self.lm, self.config = lm, lm.config
            self.calls = []

        def forward(self, **kwargs):
            self.calls.append(kwargs["input_ids"].shape)
            out = self.lm(**kwargs)
            for key in ("cache", "past_key_values"):
                if key in out:
                    out[key] = None
            return out

    ids, mask, resp, rmask = _with_responses(*_batch())
    wrapped = NoCache(tiny_lm)
    logits = prefix.forward_last(wrapped, ids, mask, 7, causal_lm=True)
    assert wrapped.calls[0] == torch.Size([1, 24]) and wrapped.calls[-1] == ids.shape  # tried the prefix, fell back
    torch.testing.assert_close(logits, prefix.forward_last(tiny_lm, ids, mask, 7, causal_lm=True, enabled=False))


@pytest.mark.parametrize(
    "leads",
    [("", ""), ("alice, you write the plan. ", "bob, you check the plan. ")],
    ids=["same-instructions", "own-instructions"],
)
def test_mixed_adapter_generation_shares_a_head_only_within_an_adapter(tmp_path, qwen_path, monkeypatch, leads):
    from conftest import RUN_SETTINGS
    from datasets import Dataset
    from peft import LoraConfig

    from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer
    from trl_collm.generation.backends import GenerateBackend
    from trl_collm.generation.sampler import Sampler, SamplingSettings

    args = MultiAgentPPOConfig(
        output_dir=str(tmp_path / "o"), num_agents=2, response_length=5, per_device_train_batch_size=4, **RUN_SETTINGS
    )
    trainer = MultiAgentPPOTrainer(
        args=args,
        model=qwen_path,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj"]),
        train_dataset=Dataset.from_dict({"prompt": INSTRUCTED}),
        reward_funcs=lambda prompts, completions, **kw: [0.0] * len(completions),
    )
    team = trainer.team
    assert team.layout == "shared_base"
    trainer.model.eval()  # as the rollout does (PEFT refuses adapter_names in training mode)
    torch.manual_seed(0)
    with torch.no_grad():  # LoRA B starts at zero (adapter = base): make the two agents' keys really differ
        for name, param in team.shared_base.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    # Every agent sees the same 8 prompts (each one twice), after its own lead when `leads` gives one: then the
    # agents' prompts part at their first tokens and only each agent's own rows share a prefix (lead + LONG).
    observations = {a: [lead + LONG + p for p in PROMPTS] * 2 for a, lead in zip(team.names, leads)}
    settings = SamplingSettings(max_new_tokens=5, greedy=True)

    plain = Sampler(team, GenerateBackend(share_prefix=False), settings)(observations)
    splits = []
    plain_split = prefix.plan_split
    monkeypatch.setattr(prefix, "plan_split", lambda *a, **k: splits.append(plain_split(*a, **k)) or splits[-1])
    shared = Sampler(team, GenerateBackend(share_prefix=True), settings)(observations)

    a, b = team.names
    assert not torch.equal(plain[a].response_ids, plain[b].response_ids)  # the adapters answer differently
    for name in team.names:
        assert torch.equal(shared[name].response_ids, plain[name].response_ids), name
    # One generate() over both agents' 16 rows: the common instruction runs once per adapter (it saves more than the
    # 8 distinct (prompt, adapter) heads would), and each row reads its own adapter's.
    (split,) = [s for s in splits if s is not None]
    assert split.head_keys.tolist() == [0, 1] and split.index.tolist() == [0] * 8 + [1] * 8
    tok = team.tokenizers[a]
    shared_text = [tok.decode(row) for row in split.head_ids]
    if leads[0]:
        # Each adapter's head is its own lead and the instruction, not the few tokens the two leads share.
        assert shared_text[0] != shared_text[1]
        for lead, text in zip(leads, shared_text):
            assert text.startswith(lead + LONG[:40]), text
    else:
        assert shared_text[0] == shared_text[1] and shared_text[0].startswith(LONG[:40])
