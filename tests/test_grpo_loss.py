"""With one agent, MC's GRPO loss types are TRL's GRPOTrainer: on the same samples, with the same advantages, old and
reference log-probs, TRL's own `_compute_loss` and our update give the same loss and the same gradients (up to
rounding), for each loss_type. And the normalisers by hand: what each loss type divides the token losses by."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
import torch

from trl_collm import algorithms as alg
from trl_collm.testing import CPU_RUN_SETTINGS

PROMPT = "The team works together"
G = 4
LENGTH = 6
ADVANTAGES = torch.tensor([1.0, -0.5, 0.3, -0.8])


def _reward(prompts, completions, **kw):
    return [float(len(c)) for c in completions]


def _shared(loss_type: str, beta: float) -> dict:
    """The settings both sides run with (each side's own batch size and run settings apart)."""
    return dict(
        loss_type=loss_type,
        beta=beta,
        epsilon=0.2,
        epsilon_high=0.28,
        max_completion_length=LENGTH,
        num_generations=G,
        temperature=0.9,
    )


def _trl_trainer(path, tmp_path, loss_type, beta):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        use_cpu=True,
        bf16=False,
        report_to=[],
        per_device_train_batch_size=G,
        **_shared(loss_type, beta),
    )
    trainer = GRPOTrainer(
        model=path, reward_funcs=_reward, args=args, train_dataset=Dataset.from_dict({"prompt": [PROMPT] * 4})
    )
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def _our_trainer(path, tmp_path, loss_type, beta):
    from datasets import Dataset

    from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer

    args = MultiAgentMCConfig(
        **dict(CPU_RUN_SETTINGS, output_dir=str(tmp_path / "ours")),
        per_device_train_batch_size=1,
        **_shared(loss_type, beta),
        reuse_rollout_prefill=False,
        seed=0,
    )
    return MultiAgentMCTrainer(
        args=args, model=path, reward_funcs=_reward, train_dataset=Dataset.from_dict({"prompt": [PROMPT] * 4})
    )


def _grads(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("beta", [0.0, 0.04], ids=["no-kl", "kl"])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_one_agent_loss_and_gradients_equal_grpo_trainers(qwen_path, tmp_path, loss_type, beta):
    torch.manual_seed(0)
    ours = _our_trainer(qwen_path, tmp_path, loss_type, beta)
    (a,) = ours.team.names
    tree = ours.sample([{"prompt": PROMPT}])
    scored = ours.score_tree(tree)
    st = scored.turns[0][a]
    # completions of 6, 5, 4 and 2 tokens (the tiny model seldom stops by itself): the tokens after each end are
    # padding, on both sides
    lengths = torch.tensor([6, 5, 4, 2])
    mask = torch.arange(LENGTH).expand(G, LENGTH) < lengths.unsqueeze(-1)
    g = dataclasses.replace(
        st.gen, response_mask=mask, response_ids=st.gen.response_ids.masked_fill(~mask, ours.team.pad_id(a))
    )
    st.turn = dataclasses.replace(st.turn, gen=g)
    # the same old and reference log-probs on both sides, away from the current ones so that the ratio clips
    new = ours.chunked_logprobs(a, g).detach()
    noise = torch.Generator().manual_seed(1)
    old = (new + 0.3 * torch.randn(new.shape, generator=noise)).masked_fill(~mask, 0.0)
    ref = (new + 0.2 * torch.randn(new.shape, generator=noise)).masked_fill(~mask, 0.0)
    st.advantages, st.old_logprobs, st.ref_logprobs = ADVANTAGES.clone(), old, ref

    ours.model.train()
    ours.optimizer = torch.optim.SGD(ours.model.parameters(), lr=0.0)
    logs = defaultdict(list)
    ours.model.zero_grad(set_to_none=True)
    pairs = torch.stack([torch.arange(G), torch.zeros(G, dtype=torch.long)], -1)
    ours._accumulate(scored, pairs, [a], logs, ours.micro_batch_rows())
    (our_loss,) = logs["loss/policy_avg"]
    our_grads = _grads(ours.team.model_of(a))

    trl = _trl_trainer(qwen_path, tmp_path, loss_type, beta)
    trl.model.train()
    inputs = {
        "prompt_ids": g.query_ids,
        "prompt_mask": g.query_mask.long(),
        "completion_ids": g.response_ids,
        "completion_mask": mask.long(),
        "advantages": ADVANTAGES.clone(),
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    assert bool(g.query_mask.all()), "one prompt, no padding: both forwards see the same positions"
    trl.model.zero_grad(set_to_none=True)
    loss = trl._compute_loss(trl.model, inputs)
    loss.backward()
    trl_grads = _grads(trl.model)

    assert our_loss == pytest.approx(float(loss), rel=1e-5, abs=1e-7)
    assert set(our_grads) == set(trl_grads) and our_grads
    for name, grad in trl_grads.items():
        torch.testing.assert_close(our_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert any(float(v.abs().max()) > 0 for v in trl_grads.values())
    clipped = logs["clip_ratio/region_mean"][0]
    assert 0 < clipped < 1, "the noise should clip some tokens and not others"


def test_normalisers_by_hand():
    # two rows, lengths 2 and 1 (of max 4); token losses 1, 2 | 3
    per_token = torch.tensor([[1.0, 2.0, 9.0, 9.0], [3.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    assert float(alg.normalised_token_loss(per_token, mask, "grpo")) == pytest.approx((1.5 + 3.0) / 2)
    assert float(alg.normalised_token_loss(per_token, mask, "bnpo")) == pytest.approx(6.0 / 3)
    assert float(alg.normalised_token_loss(per_token, mask, "dr_grpo", max_completion_length=4)) == pytest.approx(
        6.0 / 8
    )
    assert float(alg.normalised_token_loss(per_token, mask, "dapo", num_tokens=12)) == pytest.approx(6.0 / 12)
    assert float(alg.normalised_token_loss(per_token, mask, "dapo")) == pytest.approx(6.0 / 3)


def test_grpo_scaled_advantages_by_hand():
    returns = torch.tensor([1.0, 3.0, 0.0, 0.0, 4.0, 8.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    group = alg.grpo_scaled_advantages(returns, groups, None, "mean", "group")
    # group std (unbiased) of (1, 3) is sqrt(2); of (0, 0) is 0; of (4, 8) is sqrt(8)
    s2, s8 = 2**0.5, 8**0.5
    expected = [-1 / (s2 + 1e-4), 1 / (s2 + 1e-4), 0.0, 0.0, -2 / (s8 + 1e-4), 2 / (s8 + 1e-4)]
    torch.testing.assert_close(group, torch.tensor(expected))
    batch = alg.grpo_scaled_advantages(returns, groups, None, "mean", "batch")
    std = float(returns.std())  # unbiased over the six returns
    torch.testing.assert_close(batch, torch.tensor([-1.0, 1.0, 0.0, 0.0, -2.0, 2.0]) / (std + 1e-4))
    none = alg.grpo_scaled_advantages(returns, groups, None, "mean", "none")
    torch.testing.assert_close(none, torch.tensor([-1.0, 1.0, 0.0, 0.0, -2.0, 2.0]))


def test_grpo_token_loss_clips_and_caps_by_hand():
    new = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))  # ratios 1.5, 0.5, 1.0 against old = 0
    old = torch.zeros(1, 3)
    mask = torch.ones(1, 3, dtype=torch.bool)
    pos, st = alg.grpo_token_loss(new, old, torch.tensor([2.0]), mask, 0.2, 0.28)
    # A > 0: -min(r A, clip(r, 0.8, 1.28) A) = -(1.28, 0.5, 1.0) x 2
    torch.testing.assert_close(pos, torch.tensor([[-2.56, -1.0, -2.0]]))
    assert st["high"].tolist() == [[True, False, False]] and not st["low"].any()
    neg, st = alg.grpo_token_loss(new, old, torch.tensor([-1.0]), mask, 0.2, 0.28, delta=1.4)
    # A < 0: -min(min(r, 1.4) A, clip(r, 0.8, 1.28) A) = (1.4, 0.8, 1.0)
    torch.testing.assert_close(neg, torch.tensor([[1.4, 0.8, 1.0]]))
    assert st["low"].tolist() == [[False, True, False]]
