"""Non-finite numbers never reach the weights or a checkpoint (numerics.py and its callers): rewards that overflow
are refused, non-finite updates are skipped and counted, and a poisoned, truncated or mismatched checkpoint is refused
on resume naming the problem."""

from __future__ import annotations

import os
import re

import pytest
import torch

from trl_collm import MultiAgentPPOTrainer
from trl_collm.trainers import checkpoints


def ok_reward(prompts, completions, **kwargs):
    return [float(len(c[0]) % 3) - float(len(c[-1]) % 2) for c in completions]


def _all_finite(model: torch.nn.Module) -> bool:
    return all(torch.isfinite(p).all() for p in model.parameters())


# ---------------------------------------------------------------------------------------------------------------
# 2. non-finite rewards, losses and weights
# ---------------------------------------------------------------------------------------------------------------


def test_reward_that_overflows_float32_is_rejected(tmp_path, make_config, prompts_dataset, qwen_path):
    def huge(prompts, completions, **kwargs):
        return [1e39 if i == 2 else 1.0 for i in range(len(completions))]

    args = make_config(tmp_path, num_agents=2)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=huge)
    with pytest.raises(ValueError, match=r"reward function 'huge'.*1e\+39.*episode 2.*float32"):
        tr.train()
    assert not _any_checkpoint(tmp_path / "out")


def test_reward_weights_whose_product_overflows_are_rejected(tmp_path, make_config, prompts_dataset, qwen_path):
    def big(prompts, completions, **kwargs):
        return [1e30 for _ in completions]

    args = make_config(tmp_path, num_agents=2, reward_weights=[1e10])
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=big)
    with pytest.raises(ValueError, match=r"reward_weights.*'big'.*episode 0"):
        tr.train()


def _any_checkpoint(out) -> bool:
    return os.path.isdir(out) and any(n.startswith("checkpoint-") for n in os.listdir(out))


def test_exploding_updates_are_skipped_and_counted_then_stop(tmp_path, make_config, prompts_dataset, qwen_path):
    """A learning rate so large that the first update makes the next losses non-finite: the poisoned steps are
    skipped (weights stay finite, no checkpoint holds NaN) and the run stops with a clear error."""
    args = make_config(
        tmp_path,
        num_agents=2,
        learning_rate=1e30,
        total_episodes=40,
        max_nonfinite_steps=3,
        save_strategy="steps",
        save_steps=1,
        num_ppo_epochs=4,
        max_grad_norm=None,
    )
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    with pytest.raises(
        FloatingPointError, match=r"(optimizer steps in a row.*max_nonfinite_steps|weights have diverged)"
    ):
        tr.train()
    assert _all_finite(tr.model)
    skipped = [m.get("train/nonfinite_steps_skipped", 0) for m in tr._metrics_history]
    assert sum(skipped) + tr.nonfinite_steps.in_a_row >= 1
    for ck in checkpoints.complete_checkpoints(str(tmp_path / "out")):
        state = torch.load(os.path.join(ck, checkpoints.STATE_FILE), map_location="cpu", weights_only=False)
        assert all(torch.isfinite(v).all() for v in state["params"].values()), ck


def test_one_nonfinite_loss_is_skipped_and_training_continues(tmp_path, make_config, prompts_dataset, qwen_path):
    """kl_coef is fine, but a poisoned step (forced through the loss) is skipped: the weights do not change on that
    step, the counter says so, and the next steps train normally."""
    args = make_config(tmp_path, num_agents=2, total_episodes=12, num_ppo_epochs=1)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    calls = {"n": 0}
    original = tr.step_losses

    def poisoned(*a, **k):
        for loss, *rest in original(*a, **k):
            calls["n"] += 1
            if calls["n"] == 1:
                loss = loss * float("nan")
            yield (loss, *rest)

    tr.step_losses = poisoned
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters() if p.requires_grad}
    tr.train()
    hist = tr._metrics_history
    assert hist[0]["train/nonfinite_steps_skipped"] == 1
    assert all(m["train/nonfinite_steps_skipped"] == 0 for m in hist[1:])
    assert _all_finite(tr.model)
    changed = [n for n, p in tr.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert changed, "the later steps must still train"


def test_checkpoint_is_never_written_from_nonfinite_weights(tmp_path, make_config, prompts_dataset, qwen_path):
    args = make_config(tmp_path, num_agents=2)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    tr.train()
    name, param = next((n, p) for n, p in tr.model.named_parameters() if p.requires_grad)
    with torch.no_grad():
        param.view(-1)[0] = float("nan")
    with pytest.raises(FloatingPointError, match=re.escape(name)):
        checkpoints.save_checkpoint(tr, str(tmp_path / "out"))
    assert not _any_checkpoint(tmp_path / "out")
    assert not any(n.endswith(".tmp") for n in os.listdir(tmp_path / "out"))


def _trained_checkpoint(tmp_path, make_config, prompts_dataset, qwen_path, **cfg):
    args = make_config(tmp_path, num_agents=2, save_strategy="steps", save_steps=1, **cfg)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    tr.train()
    found = checkpoints.complete_checkpoints(str(tmp_path / "out"))
    assert found
    return args, found[-1]


def test_resume_refuses_a_poisoned_checkpoint(tmp_path, make_config, prompts_dataset, qwen_path):
    args, ck = _trained_checkpoint(tmp_path, make_config, prompts_dataset, qwen_path)
    path = os.path.join(ck, checkpoints.STATE_FILE)
    state = torch.load(path, map_location="cpu", weights_only=False)
    key = next(iter(state["params"]))
    state["params"][key].view(-1)[0] = float("inf")
    torch.save(state, path)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    with pytest.raises(ValueError, match=re.escape(ck) + ".*non-finite.*" + re.escape(key)):
        tr.train(resume_from_checkpoint=ck)


def test_resume_from_a_truncated_checkpoint_names_the_file(tmp_path, make_config, prompts_dataset, qwen_path):
    args, ck = _trained_checkpoint(tmp_path, make_config, prompts_dataset, qwen_path)
    path = os.path.join(ck, checkpoints.STATE_FILE)
    with open(path, "r+b") as f:
        f.truncate(100)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    with pytest.raises(ValueError, match=re.escape(path) + ".*(damaged|cannot be read)"):
        tr.train(resume_from_checkpoint=ck)


def test_resume_into_a_different_team_names_the_mismatch(tmp_path, make_config, prompts_dataset, qwen_path):
    _, ck = _trained_checkpoint(tmp_path, make_config, prompts_dataset, qwen_path)
    args = make_config(tmp_path, num_agents=3, save_strategy="no")
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    with pytest.raises(ValueError, match=re.escape(ck) + ".*does not match this team"):
        tr.train(resume_from_checkpoint=ck)
