"""Honest flags: every TrainingArguments field the CLI exposes is in trainers/supported_args.py's table; a rejected
field set to anything but its default is refused naming it; the honoured ones a user reaches for first really change
what the trainer does (max_steps, optim, gradient_accumulation_steps, data_seed, resume_from_checkpoint on the
CLI, push_to_hub through save_model)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from transformers import HfArgumentParser, TrainingArguments

from trl_collm import MultiAgentMCConfig, MultiAgentPPOConfig, MultiAgentPPOTrainer, TeamConfig
from trl_collm.trainers.backend_fields import GenerationBackendFields
from trl_collm.trainers.grpo_fields import GRPORefusedFields
from trl_collm.trainers.supported_args import (
    HONOURED,
    NOT_APPLICABLE,
    REJECTED,
    SUPPORT,
    field_default,
    markdown_table,
)

ROOT = Path(__file__).resolve().parents[1]
BASE = dict(output_dir="/tmp/unused-supported-args", use_cpu=True, bf16=False, report_to=[])
OWN = set()
for _cls in (TeamConfig, GenerationBackendFields, MultiAgentPPOConfig, MultiAgentMCConfig):
    OWN |= set(_cls.__dict__["__annotations__"])
# GRPOConfig's fields MultiAgentMCConfig parses and refuses have their own table (tests/test_grpo_config.py)
OWN |= set(GRPORefusedFields.__dataclass_fields__)
TRAINING_ARGUMENTS = {f.name for f in dataclasses.fields(TrainingArguments)}


def _reward(prompts, completions, **kw):
    return [1.0] * len(prompts)


def _non_default(cls, name):
    """A value other than the field's default, from the table's example or from the default's type."""
    support, default = SUPPORT[name], field_default(cls, name)
    if support.example is not None:
        value = support.example
    elif isinstance(default, bool):
        value = not default
    elif isinstance(default, int):
        value = default + 1
    elif isinstance(default, float):
        value = default + 0.5
    elif default is None:  # an unset optional: a value of its declared type
        declared = str({f.name: f for f in dataclasses.fields(cls)}[name].type)
        value = True if "bool" in declared else 2 if "int" in declared else 0.5 if "float" in declared else None
        assert value is not None, f"give `{name}` an example value in SUPPORT (declared {declared})"
    else:
        raise AssertionError(f"give `{name}` an example value in SUPPORT (default {default!r})")
    assert value != default, name
    return value


@pytest.mark.parametrize("cls", [MultiAgentPPOConfig, MultiAgentMCConfig])
def test_every_flag_the_cli_exposes_is_in_the_table_or_our_own(cls):
    flags = {a.dest for a in HfArgumentParser(cls)._actions if a.dest != "help"}
    assert TRAINING_ARGUMENTS <= flags  # the CLI really exposes every TrainingArguments field
    missing = sorted(f for f in flags if f not in SUPPORT and (f not in OWN or f in TRAINING_ARGUMENTS))
    assert not missing, f"flags with no entry in trainers/supported_args.py: {missing}"
    assert set(SUPPORT) <= flags | OWN
    assert {s.status for s in SUPPORT.values()} == {HONOURED, REJECTED, NOT_APPLICABLE}


@pytest.mark.parametrize("cls", [MultiAgentPPOConfig, MultiAgentMCConfig])
def test_every_rejected_field_is_refused_naming_it(cls):
    cls(**BASE)  # every default is accepted
    checked = []
    for name, support in SUPPORT.items():
        if name not in {f.name for f in dataclasses.fields(cls)}:
            continue
        if support.status == REJECTED or support.allowed is not None:
            value = _non_default(cls, name)
            if support.allowed is not None and str(value) in support.allowed:
                continue
            with pytest.raises(ValueError, match=re.escape(f"`{name}`")) as info:
                cls(**BASE, **{name: value})
            assert "team trainers" in str(info.value), (name, str(info.value))
            checked.append(name)
    assert len(checked) >= 40, checked


def test_length_settings_that_contradict_each_other_are_refused():
    with pytest.raises(ValueError, match="`num_train_epochs`"):
        MultiAgentPPOConfig(**BASE, num_train_epochs=2, total_episodes=8)
    with pytest.raises(ValueError, match="metric_for_best_model"):
        MultiAgentPPOConfig(**BASE, load_best_model_at_end=True, eval_strategy="steps", save_strategy="steps")


def test_the_cli_refuses_an_ignored_flag_in_one_line(capsys):
    from trl_collm.cli import main

    config = str(ROOT / "examples/configs/coord-penalty/cc-cpu.yaml")
    code = main(["ppo", "--config", config, "--torch_compile", "true"])
    err = capsys.readouterr().err
    assert code == 2 and "`torch_compile`=True is not supported" in err and len(err.strip().splitlines()) == 1


def test_the_docs_carry_the_table():
    doc = (ROOT / "docs" / "trl-ppo-differences.md").read_text()
    assert markdown_table() in doc
    for name, support in SUPPORT.items():
        if support.status == REJECTED:
            assert f"| `{name}` | {REJECTED} |" in doc, name


# ---------------------------------------------------------------------------------------------- behaviour


def test_max_steps_caps_the_iterations(tmp_path, qwen_path, prompts_dataset, make_config):
    args = make_config(
        tmp_path, agent_names=["a", "b"], total_episodes=None, max_steps=1, num_ppo_epochs=1, exp_name="exp"
    )
    trainer = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=_reward)
    out = trainer.train()
    assert out.global_step == 1 and len(trainer.metrics_history) == 1  # 3 epochs of 2 iterations without it
    assert trainer.state.max_steps == 1
    assert args.run_name.startswith("exp__0__")  # TRL PPO's run name from exp_name and seed


@pytest.mark.parametrize(
    "optim, cls_name", [("adamw_torch", "AdamW"), ("sgd", "SGD"), ("adafactor", "Adafactor"), ("adagrad", "Adagrad")]
)
def test_optim_picks_the_optimizer(tmp_path, qwen_path, prompts_dataset, make_config, optim, cls_name):
    args = make_config(tmp_path, agent_names=["a", "b"], optim=optim, critic_learning_rate=5e-4)
    trainer = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=_reward)
    opt = trainer.create_optimizer()
    assert type(opt).__name__ == cls_name
    assert [g["name"] for g in opt.param_groups] == ["a", "b", "critic/central"]
    assert [g["lr"] for g in opt.param_groups] == [1e-3, 1e-3, 5e-4]


@pytest.mark.parametrize("optim, fused", [(None, None), ("adamw_torch_fused", True)])
def test_default_optim_is_plain_adamw(tmp_path, qwen_path, prompts_dataset, make_config, optim, fused):
    extra = {} if optim is None else {"optim": optim}
    trainer = MultiAgentPPOTrainer(
        args=make_config(tmp_path, agent_names=["a", "b"], **extra),
        model=qwen_path,
        train_dataset=prompts_dataset,
        reward_funcs=_reward,
    )
    opt = trainer.create_optimizer()
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["fused"] is fused
    assert opt.defaults["betas"] == (0.9, 0.999) and opt.defaults["eps"] == 1e-8


def _by_length(prompts, completions, **kw):
    return [float(len(a) % 3) for a, _ in completions]


def _one_sgd_update(tmp_path, qwen_path, dataset, make_config, **kw):
    args = make_config(
        tmp_path,
        agent_names=["a", "b"],
        optim="sgd",
        learning_rate=0.5,
        num_ppo_epochs=1,
        total_episodes=4,
        max_grad_norm=None,
        kl_coef=0.0,
        **kw,
    )
    trainer = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=dataset, reward_funcs=_by_length)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    return {n: p.detach() - before[n] for n, p in trainer.model.named_parameters() if n in before}


def test_gradient_accumulation_makes_the_same_minibatch_mean(tmp_path, qwen_path, prompts_dataset, make_config):
    """4 rows in one micro-batch, or 2 micro-batches of 2 accumulated: the same rollout batch and the same SGD step
    (TRL PPO's batch math: ignoring gradient_accumulation_steps would halve the batch and change the step)."""
    whole = _one_sgd_update(tmp_path / "ga1", qwen_path, prompts_dataset, make_config, per_device_train_batch_size=4)
    parts = _one_sgd_update(
        tmp_path / "ga2",
        qwen_path,
        prompts_dataset,
        make_config,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
    )
    moved = [n for n, d in whole.items() if d.abs().max() > 1e-6]
    assert moved
    for n in moved:
        torch.testing.assert_close(parts[n], whole[n], rtol=1e-3, atol=1e-6)


def test_data_seed_changes_the_order_of_the_rows(tmp_path, qwen_path, prompts_dataset, make_config):
    orders = []
    for data_seed in (None, 1):
        trainer = MultiAgentPPOTrainer(
            args=make_config(tmp_path, agent_names=["a", "b"], data_seed=data_seed),
            model=qwen_path,
            train_dataset=prompts_dataset,
            reward_funcs=_reward,
        )
        trainer._batch_sizes()
        orders.append([r["prompt"] for batch in trainer._rollout_loader() for r in batch])
    assert sorted(orders[0]) == sorted(orders[1]) and orders[0] != orders[1]


def test_save_model_pushes_when_push_to_hub(tmp_path, qwen_path, prompts_dataset, make_config, monkeypatch):
    from trl_collm.trainers import checkpoints

    trainer = MultiAgentPPOTrainer(
        args=make_config(tmp_path, agent_names=["a", "b"]),
        model=qwen_path,
        train_dataset=prompts_dataset,
        reward_funcs=_reward,
    )
    pushes = []
    monkeypatch.setattr(trainer, "push_to_hub", lambda commit_message=None, **kw: pushes.append(commit_message))
    trainer.save_model()
    assert pushes == []
    trainer.args.push_to_hub = True
    trainer.save_model()
    assert pushes == ["Model save"]
    trainer.create_optimizer()
    trainer.state.episode = 0  # a checkpoint outside train(): the counters train() keeps
    trainer._save_checkpoint()  # hub_strategy='every_save' (the default): a checkpoint save pushes too
    assert len(pushes) == 2 and (Path(trainer.args.output_dir) / "checkpoint-0" / checkpoints.MARKER).exists()
    trainer.args.hub_strategy = "end"
    checkpoints.save_checkpoint(trainer, trainer.args.output_dir)
    trainer._save_checkpoint()
    assert len(pushes) == 2


def test_cli_resume_from_checkpoint_continues_the_run(tmp_path, model_cache, qwen_path, capsys):
    from trl_collm.cli import main

    out = tmp_path / "run"
    common = [
        "ppo",
        "--config",
        str(ROOT / "examples/configs/coord-penalty/cc-cpu.yaml"),
        "--output_dir",
        str(out),
        "--per_device_train_batch_size",
        "8",
        "--train_limit",
        "16",
        "--eval_limit",
        "4",
        "--save_strategy",
        "steps",
        "--save_steps",
        "1",
        "--logging_steps",
        "1",
        "--disable_tqdm",
        "true",
        "--plot",
        "false",
    ]
    assert main(common + ["--max_steps", "1"]) == 0  # --max_steps overrides the config's total_episodes
    first = json.loads((out / "checkpoint-1" / "trainer_state.json").read_text())
    assert first["global_step"] == 1 and first["max_steps"] == 1
    capsys.readouterr()
    assert main(common + ["--max_steps", "2"]) == 2  # the old run's checkpoints, neither resumed nor overwritten
    assert "--resume_from_checkpoint true" in capsys.readouterr().err
    assert main(common + ["--max_steps", "2", "--resume_from_checkpoint", "true"]) == 0
    second = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert second["global_step"] == 2
    # the first iteration's log entry is the first run's, wall-clock figures included: continued, not restarted
    assert second["log_history"][0] == first["log_history"][0]
    assert [h["step"] for h in second["log_history"]] == [1, 2]
