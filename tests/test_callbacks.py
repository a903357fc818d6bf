"""transformers' callback contract with real transformers callbacks: the exact event sequence of a 2-epoch run,
EarlyStoppingCallback stopping a run, a callback's control.should_save making a checkpoint, save_strategy='best' with
load_best_model_at_end, and trainer_state.json (log_history, best metric, callback states) in every checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import EarlyStoppingCallback, TrainerCallback

from trl_collm import MultiAgentPPOTrainer
from trl_collm.trainers import checkpoints, resume

EVENTS = (
    "on_init_end",
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_step_begin",
    "on_step_end",
    "on_substep_end",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_log",
    "on_evaluate",
    "on_save",
)


class Recorder(TrainerCallback):
    """Records (event, global_step) for every event, and what on_evaluate / on_log received."""

    def __init__(self):
        self.events, self.eval_metrics, self.logs = [], [], []

    def __getattribute__(self, name):
        if name in EVENTS:

            def record(args, state, control, **kwargs):
                self.events.append((name, state.global_step))
                if name == "on_evaluate":
                    self.eval_metrics.append(dict(kwargs["metrics"]))
                if name == "on_log":
                    self.logs.append(dict(kwargs["logs"]))

            return record
        return super().__getattribute__(name)


def _constant(prompts, completions, **kw):
    return [1.0] * len(prompts)


def _trainer(tmp_path, make_config, qwen_path, dataset, reward=_constant, callbacks=None, **overrides):
    kwargs = dict(agent_names=["a", "b"], num_ppo_epochs=1, total_episodes=None)
    kwargs.update(overrides)
    args = make_config(tmp_path, **kwargs)
    return MultiAgentPPOTrainer(
        args=args,
        model=qwen_path,
        train_dataset=dataset,
        eval_dataset=dataset.select(range(2)),
        reward_funcs=reward,
        callbacks=callbacks,
    )


def test_two_epoch_run_fires_the_trainer_events_in_order(tmp_path, qwen_path, prompts_dataset, make_config):
    rec = Recorder()
    # 8 rows, 4 per rollout batch: 2 iterations per epoch; one optimizer step per iteration
    trainer = _trainer(
        tmp_path,
        make_config,
        qwen_path,
        prompts_dataset,
        callbacks=[rec],
        num_train_epochs=2,
        eval_strategy="epoch",
        save_strategy="epoch",
        logging_steps=1,
    )
    trainer.train()

    def iteration(step):  # step = global_step before the iteration
        return [
            ("on_step_begin", step),
            ("on_pre_optimizer_step", step),
            ("on_optimizer_step", step),
            ("on_step_end", step + 1),
            ("on_log", step + 1),
        ]

    def epoch(first):
        return (
            [("on_epoch_begin", first)]
            + iteration(first)
            + iteration(first + 1)
            + [("on_epoch_end", first + 2), ("on_log", first + 2), ("on_evaluate", first + 2), ("on_save", first + 2)]
        )

    expected = [("on_init_end", 0), ("on_train_begin", 0)] + epoch(0) + epoch(2) + [("on_train_end", 4)]
    assert rec.events == expected
    keys = ["epoch", "eval_a/return", "eval_b/return", "eval_return", "eval_turns"]  # as logged (Trainer.log)
    assert [sorted(m) for m in rec.eval_metrics] == [keys] * 2
    assert all(m["eval_return"] == 1.0 for m in rec.eval_metrics)
    assert [log.get("epoch") for log in rec.logs if "eval_return" in log] == [1.0, 2.0]
    out = Path(trainer.args.output_dir)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and state["epoch"] == 2.0 and state["max_steps"] == 4
    assert state["num_train_epochs"] == 2
    assert [h["step"] for h in state["log_history"]] == [1, 2, 2, 3, 4, 4]
    assert [h["eval_return"] for h in state["log_history"] if "eval_return" in h] == [1.0, 1.0]
    assert "TrainerControl" in state["stateful_callbacks"]


def test_early_stopping_callback_stops_the_run(tmp_path, qwen_path, prompts_dataset, make_config):
    stopper = EarlyStoppingCallback(early_stopping_patience=1)
    trainer = _trainer(
        tmp_path,
        make_config,
        qwen_path,
        prompts_dataset,
        callbacks=[stopper],
        max_steps=6,
        eval_strategy="steps",
        eval_steps=1,
        metric_for_best_model="return",
        save_strategy="steps",
        save_steps=1,
    )
    trainer.train()
    # eval 1 sets the best (1.0); eval 2 does not improve on a constant reward: patience 1 is spent
    assert trainer.state.global_step == 2 and len(trainer.metrics_history) == 2
    assert trainer.state.best_metric == 1.0 and trainer.state.best_global_step == 1
    assert trainer.state.best_model_checkpoint.endswith("checkpoint-1")
    state = json.loads((Path(trainer.args.output_dir) / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["best_metric"] == 1.0
    assert state["stateful_callbacks"]["EarlyStoppingCallback"]["attributes"] == {"early_stopping_patience_counter": 1}


class SaveAt(TrainerCallback):
    def __init__(self, step):
        self.step, self.saved_at = step, []

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_save = True

    def on_save(self, args, state, control, **kwargs):
        self.saved_at.append(state.global_step)


def test_a_callback_asking_to_save_makes_a_checkpoint_there(tmp_path, qwen_path, prompts_dataset, make_config):
    saver = SaveAt(2)
    trainer = _trainer(
        tmp_path, make_config, qwen_path, prompts_dataset, callbacks=[saver], max_steps=3, save_strategy="no"
    )
    trainer.train()
    out = Path(trainer.args.output_dir)
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-2"]
    assert (out / "checkpoint-2" / checkpoints.MARKER).exists() and saver.saved_at == [2]
    assert json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2


class StopAt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            control.should_training_stop = True


def test_best_checkpoint_is_kept_and_loaded_at_the_end(tmp_path, qwen_path, prompts_dataset, make_config):
    calls = {"n": 0}

    def worse_every_call(prompts, completions, **kw):  # each later evaluation scores lower: the first is best
        calls["n"] += 1
        return [-float(calls["n"])] * len(prompts)

    trainer = _trainer(
        tmp_path,
        make_config,
        qwen_path,
        prompts_dataset,
        reward=worse_every_call,
        max_steps=3,
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="steps",
        save_steps=1,
        save_total_limit=1,
        metric_for_best_model="return",
        load_best_model_at_end=True,
    )
    trainer.train()
    out = Path(trainer.args.output_dir)
    # save_total_limit=1 keeps the newest checkpoint and, besides it, the best one
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-3"]
    assert trainer.state.best_model_checkpoint == str(out / "checkpoint-1")
    best = resume.read_state(str(out / "checkpoint-1"))["params"]
    last = resume.read_state(str(out / "checkpoint-3"))["params"]
    params = dict(trainer.model.named_parameters())
    assert any(not torch.equal(best[n], last[n]) for n in best)
    assert all(torch.equal(params[n].detach().cpu(), best[n]) for n in best)


def test_save_strategy_best_saves_only_on_a_new_best(tmp_path, qwen_path, prompts_dataset, make_config):
    calls = {"n": 0}

    def better_then_worse(prompts, completions, **kw):
        calls["n"] += 1
        return [1.0 if calls["n"] <= 3 else -1.0] * len(prompts)

    # rollouts and evaluations both call the reward: 1 (iteration 1), 2 (eval 1), 3 (iteration 2), 4 (eval 2), ...
    trainer = _trainer(
        tmp_path,
        make_config,
        qwen_path,
        prompts_dataset,
        reward=better_then_worse,
        max_steps=3,
        callbacks=[StopAt()],
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="best",
        metric_for_best_model="return",
    )
    trainer.train()
    assert trainer.state.global_step == 2  # a callback's should_training_stop ends the run
    assert [p.name for p in Path(trainer.args.output_dir).glob("checkpoint-*")] == ["checkpoint-1"]


@pytest.mark.parametrize("strategy, logged_steps", [("no", []), ("steps", [2, 3]), ("epoch", [2, 3])])
def test_logging_strategy(tmp_path, qwen_path, prompts_dataset, make_config, strategy, logged_steps):
    rec = Recorder()
    trainer = _trainer(
        tmp_path,
        make_config,
        qwen_path,
        prompts_dataset,
        callbacks=[rec],
        max_steps=3,
        logging_strategy=strategy,
        logging_steps=2,
    )
    trainer.train()
    # steps: every 2nd iteration and the last; epoch: each epoch's end (2 iterations) and the last
    assert [step for event, step in rec.events if event == "on_log"] == logged_steps


@pytest.mark.parametrize("restore, stopped_at", [(True, 3), (False, 4)])
def test_resume_restores_callback_states_when_asked(
    tmp_path, qwen_path, prompts_dataset, make_config, restore, stopped_at
):
    common = dict(
        eval_strategy="steps", eval_steps=1, metric_for_best_model="return", save_strategy="steps", save_steps=1
    )
    first = _trainer(
        tmp_path,
        make_config,
        qwen_path,
        prompts_dataset,
        max_steps=2,
        callbacks=[EarlyStoppingCallback(early_stopping_patience=2)],
        **common,
    )
    first.train()  # eval 1 sets the best, eval 2 does not improve: patience counter 1, saved in checkpoint-2
    second = _trainer(
        tmp_path,
        make_config,
        qwen_path,
        prompts_dataset,
        max_steps=6,
        callbacks=[EarlyStoppingCallback(early_stopping_patience=2)],
        restore_callback_states_from_checkpoint=restore,
        **common,
    )
    second.train(resume_from_checkpoint=True)
    # the best metric comes back from trainer_state.json either way; the counter only when restored
    assert second.state.best_metric == 1.0
    assert second.state.global_step == stopped_at


def test_the_mc_trainer_keeps_the_same_contract(tmp_path, qwen_path, prompts_dataset):
    from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer

    rec = Recorder()
    args = MultiAgentMCConfig(
        output_dir=str(tmp_path / "mc"),
        use_cpu=True,
        bf16=False,
        report_to=[],
        disable_tqdm=True,
        num_sample_generations=0,
        agent_names=["a", "b"],
        per_device_train_batch_size=2,
        num_generations=2,
        response_length=4,
        max_steps=2,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="steps",
        save_steps=1,
        seed=0,
    )
    trainer = MultiAgentMCTrainer(
        args=args,
        model=qwen_path,
        train_dataset=prompts_dataset,
        eval_dataset=prompts_dataset.select(range(2)),
        reward_funcs=_constant,
        callbacks=[rec],
    )
    trainer.train()
    after_steps = [e for e in rec.events if e[0] in ("on_step_end", "on_log", "on_evaluate", "on_save")]
    assert after_steps == [
        ("on_step_end", 1),
        ("on_log", 1),
        ("on_log", 1),
        ("on_evaluate", 1),
        ("on_save", 1),
        ("on_step_end", 2),
        ("on_log", 2),
        ("on_log", 2),
        ("on_evaluate", 2),
        ("on_save", 2),
    ]
    assert sorted(p.name for p in (tmp_path / "mc").glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]


def test_data_passes_resume_skip_and_epoch_count():
    """The loop's data position (trainers/batches.py): a run resumed at iteration 4 of 3-batch passes is one batch
    into its second pass; should_epoch_stop skips the rest of the pass; the next pass starts at the first batch."""
    from trl_collm.trainers.batches import DataPasses

    passes = DataPasses(["b0", "b1", "b2"])
    passes.skip(4)  # the checkpoint's data position: b0 b1 b2 b0 consumed
    passes.resume_at(4)
    assert (passes.position, passes.epoch) == (1, 1)
    assert passes.next_batch() == "b1"
    assert passes.advance() == 1 + 2 / 3 and not passes.pass_over()
    passes.skip_rest_of_pass()  # b2 is not trained on
    assert passes.next_pass() == 2.0 and not passes.started
    assert passes.next_batch() == "b0"
    assert passes.advance() == 2 + 1 / 3
