"""Checkpoints laid out as transformers lays them out, and what a resume does with fields that changed.

One process, the tiny model, in-process. Expected learning rates are worked by hand from the linear schedule:
lr(k) = learning_rate x (1 - k / N) before optimizer step k (0-based) of N; one iteration here is 2 optimizer steps
(num_ppo_epochs=2, one minibatch, joint critic update), so 8 episodes of 4 per iteration give N = 4.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch
from transformers import TrainerCallback

from trl_collm.trainers import checkpoints, resume

LR = 1e-3


def _reward(prompts, completions, **kwargs):
    return [float(len(c[0]) % 3) for c in completions]


class StepRates(TrainerCallback):
    """The learning rate of the first parameter group at every optimizer step (read just before it)."""

    def __init__(self):
        self.rates = []

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.rates.append(float(optimizer.param_groups[0]["lr"]))


def _trainer(tmp_path, qwen_path, prompts_dataset, make_config, **overrides):
    from trl_collm import MultiAgentPPOTrainer

    fields = dict(
        agent_names=["a", "b"],
        save_strategy="steps",
        save_steps=1,
        lr_scheduler_type="linear",
        learning_rate=LR,
        total_episodes=8,
    )
    fields.update(overrides)
    args = make_config(tmp_path, **fields)
    rates = StepRates()
    trainer = MultiAgentPPOTrainer(
        args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=_reward, callbacks=[rates]
    )
    return trainer, rates


def test_checkpoint_holds_the_transformers_files(tmp_path, qwen_path, prompts_dataset, make_config):
    trainer, rates = _trainer(tmp_path, qwen_path, prompts_dataset, make_config)
    trainer.train()
    folder = os.path.join(trainer.args.output_dir, "checkpoint-2")
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "resume_state.pt"):
        assert os.path.isfile(os.path.join(folder, name)), name
    # optimizer.pt is the optimizer's own state dict (plus the names of each group's parameters): it loads into a
    # torch optimizer as transformers' Trainer loads it, and equals the state the run ended with.
    saved = torch.load(os.path.join(folder, "optimizer.pt"), weights_only=False)
    live = trainer.optimizer.state_dict()
    assert len(saved["param_groups"]) == len(live["param_groups"]) and saved["state"].keys() == live["state"].keys()
    for i, slot in live["state"].items():
        assert torch.equal(saved["state"][i]["exp_avg"], slot["exp_avg"])
        assert torch.equal(saved["state"][i]["exp_avg_sq"], slot["exp_avg_sq"])
    names = dict(trainer.model.named_parameters())
    first = saved["param_names"][0][0]
    assert names[first] is trainer.optimizer.param_groups[0]["params"][0]
    trainer.optimizer.load_state_dict({k: saved[k] for k in ("state", "param_groups")})
    scheduler = torch.load(os.path.join(folder, "scheduler.pt"), weights_only=False)
    assert scheduler["last_epoch"] == 4 and rates.rates == pytest.approx([LR, 0.75 * LR, 0.5 * LR, 0.25 * LR])
    rng = torch.load(os.path.join(folder, "rng_state.pth"), weights_only=False)
    assert {"python", "numpy", "cpu"} <= rng.keys() and torch.is_tensor(rng["cpu"])


def test_resume_says_where_from_and_keeps_the_checkpoint_learning_rate(
    tmp_path, qwen_path, prompts_dataset, make_config, caplog
):
    """A changed learning_rate: the checkpoint's optimizer and scheduler win (transformers' rule), in one warning
    naming the field; the resumed step trains at the rate the unbroken run had."""
    first, rates = _trainer(tmp_path, qwen_path, prompts_dataset, make_config)
    first.train()
    checkpoint = os.path.join(first.args.output_dir, "checkpoint-1")
    resumed, resumed_rates = _trainer(tmp_path, qwen_path, prompts_dataset, make_config, learning_rate=5 * LR)
    with caplog.at_level(logging.WARNING):
        resumed.train(resume_from_checkpoint=checkpoint)
    lines = [r.getMessage() for r in caplog.records]
    assert f"resumed from {checkpoint} at step 1 (episode 4)" in lines
    assert not any("re-partitioned" in line for line in lines)  # the same single process: nothing moved
    changed = [line for line in lines if "differ from the checkpoint" in line]
    assert len(changed) == 1 and "learning_rate (checkpoint 0.001, this run 0.005)" in changed[0], lines
    assert resumed_rates.rates == pytest.approx(rates.rates[2:])  # steps 2 and 3 of 4: 0.5 and 0.25 x 1e-3


def test_finished_run_extended_with_more_episodes_never_steps_at_lr_zero(
    tmp_path, qwen_path, prompts_dataset, make_config, caplog
):
    """The finished run ended at lr 0 (step 4 of 4). Resumed with twice the episodes (N = 8), the schedule is
    stretched over the new length from step 4: 1e-3 x (1 - k/8) for k = 4..7, never 0 for a whole step."""
    first, _ = _trainer(tmp_path, qwen_path, prompts_dataset, make_config)
    first.train()
    assert set(first.lr_scheduler.get_last_lr()) == {0.0}  # every group: agents a, b and the critic
    longer, rates = _trainer(tmp_path, qwen_path, prompts_dataset, make_config, total_episodes=16)
    with caplog.at_level(logging.WARNING):
        longer.train(resume_from_checkpoint=True)
    assert rates.rates == pytest.approx([0.5 * LR, 0.375 * LR, 0.25 * LR, 0.125 * LR])
    assert longer.state.global_step == 4
    stretched = [r.getMessage() for r in caplog.records if "iterations (the checkpoint's had 2" in r.getMessage()]
    assert len(stretched) == 1 and "the run now has 4 iterations" in stretched[0] and "0.0005" in stretched[0]


def test_resume_with_another_global_batch_is_refused_in_one_line(tmp_path, qwen_path, prompts_dataset, make_config):
    first, _ = _trainer(tmp_path, qwen_path, prompts_dataset, make_config)
    first.train()
    other, _ = _trainer(tmp_path, qwen_path, prompts_dataset, make_config, per_device_train_batch_size=2)
    with pytest.raises(ValueError, match=r"trained on 4 episodes per iteration and this run has 2") as info:
        other.train(resume_from_checkpoint=True)
    assert "per_device_train_batch_size=4" in str(info.value) and "\n" not in str(info.value)


def test_checkpoint_of_the_older_layout_still_resumes(tmp_path, qwen_path, prompts_dataset, make_config):
    """Optimizer, scheduler and RNG inside resume_state.pt (as written before optimizer.pt existed)."""
    first, rates = _trainer(tmp_path, qwen_path, prompts_dataset, make_config)
    first.train()
    folder = os.path.join(first.args.output_dir, "checkpoint-1")
    state = torch.load(os.path.join(folder, checkpoints.STATE_FILE), weights_only=False)
    state.update(
        layout=1,
        optimizer={k: v for k, v in torch.load(os.path.join(folder, "optimizer.pt"), weights_only=False).items()},
        scheduler=torch.load(os.path.join(folder, "scheduler.pt"), weights_only=False),
        rng=torch.load(os.path.join(folder, "rng_state.pth"), weights_only=False),
    )
    for key in ("layout", "batch_size", "num_total_batches"):
        state.pop(key)
    torch.save(state, os.path.join(folder, checkpoints.STATE_FILE))
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        os.remove(os.path.join(folder, name))
    resumed, resumed_rates = _trainer(tmp_path, qwen_path, prompts_dataset, make_config)
    resumed.train(resume_from_checkpoint=folder)
    assert resumed_rates.rates == pytest.approx(rates.rates[2:])
    for (name, p), q in zip(first.model.named_parameters(), resumed.model.parameters()):
        if p.requires_grad:
            assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), name


@pytest.mark.parametrize(
    "deepspeed_now,world_now,saved_optimizer,engine_dir,expected",
    [
        (True, 1, None, True, r"written by 2 DeepSpeed processes and this run has 1: it is of the older layout"),
        (False, 1, None, True, r"written under DeepSpeed by an older trl-collm \(no optimizer.pt\)"),
        (True, 2, {"state": {}}, False, r"holds no DeepSpeed state"),
    ],
)
def test_older_layout_combinations_that_cannot_resume_are_one_line(
    tmp_path, deepspeed_now, world_now, saved_optimizer, engine_dir, expected
):
    """A checkpoint of the older layout (no optimizer.pt) keeps ZeRO's optimizer state only per process: it cannot
    move to another world size or out of DeepSpeed. The current layout resumes in every one of these cases."""
    from types import SimpleNamespace

    if engine_dir:
        (tmp_path / checkpoints.ENGINE_DIR).mkdir()
    trainer = SimpleNamespace(is_deepspeed_enabled=deepspeed_now, accelerator=SimpleNamespace(num_processes=world_now))
    old = {"world_size": 2, "optimizer": saved_optimizer}
    with pytest.raises(ValueError, match=expected) as info:
        resume._resume_mode(trainer, old, str(tmp_path))
    assert "\n" not in str(info.value)
    assert resume._resume_mode(trainer, {**old, "layout": checkpoints.LAYOUT}, str(tmp_path)) == "full"
