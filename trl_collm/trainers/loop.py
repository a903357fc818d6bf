"""The training loop of the team trainers (`TrainingLoop`, mixed into `TeamTrainerBase`): `train` reads as CleanRL's
loop does (begin, one rollout + update per batch, record, after-step, end), and the helpers around it keep
transformers' callback contract (TrainerState, on_* events, log / evaluate / save as the control asks), resume from a
checkpoint and the data position. The trainer supplies `training_iteration` (rollout + score + update) and
`optimizer_steps_per_iteration`.
"""

from __future__ import annotations

import logging
import math
import os
import time

from transformers import TrainerState
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import TrainOutput

from ..quiet import library_quiet
from . import checkpoints, distributed, resume
from .batches import DataPasses
from .output_dir import claim_output_dir
from .progress import keep_samples, sample_due

logger = logging.getLogger(__name__)


class TrainingLoop:
    """The loop and transformers' callback contract, for `TeamTrainerBase` (which it is mixed into)."""

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """Iterations of rollout + update, with transformers' callback contract: on_train_begin, on_epoch_begin /
        on_epoch_end (an epoch is one pass of the rollout loader over train_dataset), on_step_begin / on_step_end
        (a step is one iteration), on_pre_optimizer_step / on_optimizer_step / on_substep_end, on_log, on_evaluate,
        on_save, on_train_end. What happens after a step or an epoch is decided by `control.should_log /
        should_evaluate / should_save / should_epoch_stop / should_training_stop`, which transformers'
        DefaultFlowCallback sets from the logging / eval / save strategies and any callback may set too."""
        if resume_from_checkpoint is None:  # TrainingArguments carries it (the CLI's --resume_from_checkpoint)
            resume_from_checkpoint = self.args.resume_from_checkpoint
        checkpoint = checkpoints.resolve(resume_from_checkpoint, self.args.output_dir)
        lock = claim_output_dir(self)
        try:
            batches = self._begin_training(checkpoint)
            for rows in batches:
                with self.accelerator.autocast():  # bf16 / fp16 mixed precision, as transformers.Trainer does
                    metrics = self.training_iteration(rows)
                metrics = self._record(metrics)
                if self._after_step(metrics):
                    break
            return self._end_training()
        finally:
            lock.release()

    def _begin_training(self, checkpoint: str | None):
        """Once the output_dir is this run's: checks, sizes, optimizer (and DeepSpeed engine), then (with
        overwrite_output_dir) the old checkpoints' deletion, trainer state, on_train_begin and, when resuming, the
        checkpoint's weights, counters and data position. Returns the iterator of rollout batches."""
        args = self.args
        if checkpoint is None:  # only checked here: nothing is deleted before every check below has passed
            checkpoints.refuse_to_clobber(args.output_dir, args.overwrite_output_dir, delete=False)
        if args.load_best_model_at_end and self.is_deepspeed_enabled:
            raise ValueError(
                "`load_best_model_at_end` is not supported under DeepSpeed (ZeRO partitions the "
                "parameters); load the best checkpoint's team from state.best_model_checkpoint instead."
            )
        if args.run_name is None:  # TRL's PPO named its runs so
            args.run_name = f"{args.exp_name}__{args.seed}__{int(time.time())}"
        self._batch_sizes()
        loader = self._rollout_loader()
        self._passes = DataPasses(loader)
        steps_per_iteration = self.optimizer_steps_per_iteration()
        self.create_optimizer_and_scheduler(num_training_steps=args.num_total_batches * steps_per_iteration)
        if self.is_deepspeed_enabled and self.model_wrapped is self.model:
            distributed.prepare_model_and_optimizer(self)  # TeamModel + optimizer -> one DeepSpeed engine
        if checkpoint is None and self.is_world_process_zero():  # every check passed: now the old run may go
            checkpoints.refuse_to_clobber(args.output_dir, args.overwrite_output_dir, delete=True)
        self.accelerator.wait_for_everyone()
        self._new_trainer_state(loader)
        if checkpoint is not None:  # best metric and callback states first, so callbacks start from them
            resume.load_trainer_state(self.state, checkpoint)
            self._load_callback_state()
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        saved = self._resume(checkpoint) if checkpoint is not None else None
        if args.eval_on_start:
            self._evaluate_in_training()
        if saved is not None:
            checkpoints.set_rng_state(saved["rng"])  # after skipping (and evaluating), so sampling continues exactly
        self._started_at, self._loss_sum = time.time(), 0.0
        self._last_logged_step = self.state.global_step
        self._passes.resume_at(self.state.global_step)  # a resumed run starts (the rest of) an epoch too
        return self._batches()

    def _new_trainer_state(self, loader) -> None:
        """transformers' TrainerState for this run (max steps, epochs, logging / eval / save steps), and the
        callback handler pointed at the model, optimizer, scheduler and loader."""
        args = self.args
        self.state = TrainerState(
            is_local_process_zero=self.is_local_process_zero(),
            is_world_process_zero=self.is_world_process_zero(),
            stateful_callbacks=self._exportable_callbacks(),
        )
        self.state.max_steps = args.num_total_batches
        self.state.num_train_epochs = math.ceil(args.num_total_batches / self._passes.steps_per_epoch)
        self.state.train_batch_size = args.batch_size
        self.state.compute_steps(args, args.num_total_batches)  # logging / eval / save steps (fractions of max)
        self.state.episode = 0
        handler = self.callback_handler
        handler.model, handler.optimizer, handler.lr_scheduler = self.model, self.optimizer, self.lr_scheduler
        handler.train_dataloader = loader

    def _resume(self, checkpoint: str) -> dict:
        """Weights, optimizer, counters and metrics from `checkpoint`, and the data stream fast-forwarded to the
        same shuffled position. Returns what was loaded (its RNG state is restored later)."""
        saved = resume.load_checkpoint(self, checkpoint)
        if not self.args.ignore_data_skip:
            self._passes.skip(saved["global_step"])
        self.state.global_step, self.state.episode = saved["global_step"], saved["episode"]
        self.state.log_history = saved["log_history"]
        self._metrics_history = list(saved["metrics_history"])
        if self.is_world_process_zero():  # warning level: seen without any logging set up, as a run's start is
            step, episode = saved["global_step"], saved["episode"]
            logger.warning("resumed from %s at step %d (episode %d)", checkpoint, step, episode)
        return saved

    def _batches(self):
        """The rollout batches until num_total_batches iterations are done, with on_epoch_begin at the start of a
        pass and on_step_begin before each batch."""
        handler, passes = self.callback_handler, self._passes
        while self.state.global_step < self.args.num_total_batches:
            if not passes.started:
                self.control = handler.on_epoch_begin(self.args, self.state, self.control)
                passes.started = True
            self.control = handler.on_step_begin(self.args, self.state, self.control)
            rows = passes.next_batch()
            self._iteration_started = time.time()
            self.phase_clock.reset()
            yield rows

    def _record(self, metrics: dict) -> dict:
        """Count the iteration (global_step, episodes, epoch) and complete its metrics (time, skipped steps,
        throughput, learning rate); appended to the metrics history. Returns the metrics as logged."""
        args, state = self.args, self.state
        metrics["time/iteration_s"] = time.time() - self._iteration_started
        metrics.update(self.phase_clock.metrics(metrics["time/iteration_s"], args.batch_size))
        metrics["train/nonfinite_steps_skipped"] = self.nonfinite_steps.take_iteration_count()
        state.episode += args.batch_size
        state.global_step += 1
        state.epoch = self._passes.advance()
        metrics["eps"] = int(state.episode / max(time.time() - self._started_at, 1e-9))
        metrics["episode"] = state.episode
        metrics["lr"] = self.lr_scheduler.get_last_lr()[0] if self.lr_scheduler is not None else args.learning_rate
        if self._single_agent():
            metrics = _fold_single_agent_metrics(metrics, self.team.names[0])
        self._loss_sum += float(metrics.get("loss/policy_avg", 0.0))
        self._metrics_history.append(dict(metrics))
        if args.torch_empty_cache_steps and state.global_step % args.torch_empty_cache_steps == 0:
            from accelerate.utils.memory import clear_device_cache

            clear_device_cache()
        return metrics

    def _after_step(self, metrics: dict) -> bool:
        """on_step_end, then log / evaluate / save as the control asks; at the end of a pass (or when a callback
        stops it) on_epoch_end and the same again; the periodic sample printout. Returns whether to stop."""
        args, passes = self.args, self._passes
        self.control = self.callback_handler.on_step_end(args, self.state, self.control)
        last = self.state.global_step >= args.num_total_batches
        if last and args.logging_strategy != "no":
            self.control.should_log = True  # the last iteration is always logged (as before this contract)
        self._log_save_evaluate(metrics)
        stop = self.control.should_training_stop
        if passes.pass_over() or last or stop or self.control.should_epoch_stop:
            if not (passes.pass_over() or last or stop):
                passes.skip_rest_of_pass()  # should_epoch_stop: the rest of this pass is not trained on
            self.control = self.callback_handler.on_epoch_end(args, self.state, self.control)
            self._log_save_evaluate(metrics)
            self.state.epoch = passes.next_pass()
        if sample_due(self):  # num_sample_generations: kept in output_dir/samples.jsonl, not printed (progress.py)
            keep_samples(self, self.generate_completions(sampling=True, show=False))
        return self.control.should_training_stop

    def _end_training(self) -> TrainOutput:
        """load_best_model_at_end, on_train_end, and transformers' TrainOutput."""
        args = self.args
        if args.load_best_model_at_end and self.state.best_model_checkpoint is not None:
            logger.info(
                "loading the best checkpoint %s (%s=%s)",
                self.state.best_model_checkpoint,
                args.metric_for_best_model,
                self.state.best_metric,
            )
            resume.load_parameters(self, self.state.best_model_checkpoint)
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        return TrainOutput(
            self.state.global_step,
            self._loss_sum / max(1, self.state.global_step),
            self._metrics_history[-1] if self._metrics_history else {},
        )

    def _exportable_callbacks(self) -> list:
        return [cb for cb in self.callback_handler.callbacks + [self.control] if isinstance(cb, ExportableState)]

    def _log_save_evaluate(self, metrics: dict) -> None:
        """Act on the control flags after an iteration or an epoch, as transformers.Trainer does: log the
        iteration's metrics, evaluate (best metric; save_strategy='best' saves on a new best), save a checkpoint."""
        if self.control.should_log and self.state.global_step > self._last_logged_step:
            self._last_logged_step = self.state.global_step
            self.log(metrics)
        if self.control.should_evaluate:
            self._evaluate_in_training()
        if self.control.should_save:
            self._save_checkpoint()

    def _evaluate_in_training(self) -> dict:
        if self.eval_dataset is None:
            raise ValueError(
                "an evaluation was asked for (eval_strategy, eval_on_start or a callback's "
                "control.should_evaluate) but the trainer has no `eval_dataset`; pass one."
            )
        metrics = self.evaluate()
        new_best = self._determine_best_metric(metrics=metrics, trial=None)
        if self.args.save_strategy == "best":
            self.control.should_save = new_best
        return metrics

    def _save_checkpoint(self, model=None, trial=None) -> str:
        """A resumable checkpoint-<iteration> (trainers/checkpoints.py), then on_save; with push_to_hub and
        hub_strategy='every_save' the team is pushed too."""
        args, state = self.args, self.state
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if args.metric_for_best_model is not None and state.best_global_step == state.global_step:
            state.best_model_checkpoint = path
        # trainer_state.json records each stateful callback (e.g. EarlyStoppingCallback's patience) as transformers
        states: dict[str, list] = {}
        for cb in self._exportable_callbacks():
            states.setdefault(type(cb).__name__, []).append(cb.state())
        state.stateful_callbacks = {k: v[0] if len(v) == 1 else v for k, v in states.items()}
        with library_quiet():
            path = checkpoints.save_checkpoint(self, args.output_dir)
        self.control = self.callback_handler.on_save(args, state, self.control)
        if args.push_to_hub and args.hub_strategy == "every_save":
            self.push_to_hub(commit_message=f"Training in progress, iteration {state.global_step}")
        return path


def _fold_single_agent_metrics(metrics: dict, name: str) -> dict:
    """With one agent, `<name>/x` repeats the team key `x`: drop the copies, keep agent-only keys under their
    own name."""
    prefix = f"{name}/"
    out = {k: v for k, v in metrics.items() if not k.startswith(prefix)}
    for k, v in metrics.items():
        if k.startswith(prefix) and k[len(prefix) :] not in out:
            out[k[len(prefix) :]] = v
    return out
