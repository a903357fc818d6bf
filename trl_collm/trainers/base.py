"""Shared trainer base: builds the team, the critic and the environment, owns the accelerator, optimizer, logging,
checkpoints, saving and the Hub push. The PPO and MC trainers only say how advantages and losses are made.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time

import torch
from transformers import TrainerState, set_seed
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import TrainOutput
from trl.trainer.base_trainer import _BaseTrainer
from trl.trainer.utils import disable_dropout_in_model

from ..cpu import adapt_for_cpu
from ..envs.reward_functions import build_env
from ..generation.backends import make_backend
from ..generation.prompts import PromptSettings
from ..generation.sampler import Sampler, SamplingSettings
from ..numerics import NonFiniteSteps
from ..quiet import library_quiet
from ..rollout import Rollout, run_episodes
from ..team import saved
from ..team.assembly import TeamModel, build_team, resolve_agent_names
from . import checkpoints, distributed, evaluation, hub
from .batches import DataPasses, rollout_loader, set_batch_sizes
from .console import PhaseClock, TimedSampler
from .output_dir import check_writable, claim_output_dir
from .progress import install_console, keep_samples, sample_due, threads_and_quiet
from .updates import TeamUpdates

logger = logging.getLogger(__name__)


class TeamTrainerBase(TeamUpdates, _BaseTrainer):
    _tag_names = ["trl", "trl-collm", "multi-agent"]
    _name = "TeamTrainer"

    def __init__(
        self,
        args,
        processing_class=None,
        model=None,
        ref_model=None,
        reward_model=None,
        train_dataset=None,
        value_model=None,
        data_collator=None,
        eval_dataset=None,
        optimizers=(None, None),
        callbacks=None,
        peft_config=None,
        reward_funcs=None,
        env=None,
        critic_processing_class=None,
        prompt_formatters=None,
    ):
        if model is None:
            raise ValueError("`model` is required: a model, a path, a list, or a dict name -> model.")
        if train_dataset is None or len(train_dataset) == 0:
            raise ValueError("`train_dataset` is empty; pass a dataset with at least one row per rollout batch.")
        # Seed before building anything: fresh heads (value heads, a new `score` layer) must initialise the same way
        # in every run, or a resumed or repeated run cannot match (transformers.Trainer seeds only later).
        set_seed(args.seed)
        threads_and_quiet(args)  # torch's threads as the CLI picks them; no DeepSpeed accelerator line (progress.py)
        names = resolve_agent_names(model, args)
        if args.should_save:  # a folder no save can write to fails here, not at the first save hours later
            check_writable(args.output_dir)
        args.resolve_for_team(len(names))
        distributed.prepare_args_for_deepspeed(args)  # before the accelerator exists (CPU backend, use_cpu, clipping)
        with library_quiet():  # transformers' weight-loading bars, its and PEFT's FutureWarnings (trl_collm/quiet.py)
            team = build_team(model, processing_class, ref_model, peft_config, args, names)
            # What the team is built from, before DeepSpeed can partition it (team.json; a resume compares it)
            self.base_identity = saved.base_identity(team)
            critic = self.build_critic(team, value_model, args, peft_config, critic_processing_class)
        self.env = build_env(env, reward_funcs, reward_model, prompt_formatters, args, team)
        self.reward_model = reward_model
        team_model = TeamModel(team, critic)
        for module in [team_model] + [r for r in team._refs.values() if r is not None]:
            disable_dropout_in_model(module)
        if args.activation_checkpointing:
            kwargs = args.activation_checkpointing_kwargs or {"use_reentrant": False}
            for a in names:
                team.model_of(a).gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        super().__init__(
            model=team_model,
            args=args,
            data_collator=data_collator or (lambda rows: rows),
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=team.tokenizers[names[0]],
            callbacks=callbacks,
            optimizers=optimizers,
        )
        self.team, self.critic = team, critic
        if self.accelerator.device.type == "cpu":  # the CPU adaptations, switched on in one place (trl_collm/cpu/)
            for module in (team, critic, *(r for r in team._refs.values() if r is not None)):
                if isinstance(module, torch.nn.Module):
                    adapt_for_cpu(module, bf16=bool(args.bf16))
        install_console(self)  # one line of a few numbers per log, a progress bar with its ETA (progress.py)
        self.phase_clock = PhaseClock()
        self.sampler = self.build_sampler()
        self._last_loaded_step = None  # the global_step whose weights the backend has seen (TRL's pattern)
        for ref in team._refs.values():
            if ref is not None:
                ref.to(self.accelerator.device)
        if reward_model is not None:
            reward_model.to(self.accelerator.device).eval()
        self._metrics_history: list[dict] = []
        # What the team was trained for, recorded in team.json under "task" so `trl-collm eval` / `play` default to
        # it and refuse another task: {"name", "ref" (registry name or import path), "options", "dataset_source"}.
        # The CLI sets it (cli.task_record); Python users may too.
        self.task_record: dict | None = None
        self.nonfinite_steps = NonFiniteSteps(args.max_nonfinite_steps)

    def build_critic(self, team, value_model, args, peft_config, critic_processing_class):
        """The run's critic (`trl_collm.critics.TeamCritic`), or None for a critic-free trainer."""
        return None

    def create_accelerator_and_postprocess(self):
        super().create_accelerator_and_postprocess()
        distributed.keep_deepspeed_unimported(self.accelerator)  # deepspeed is imported only by a DeepSpeed run

    def _send_telemetry(self):
        # TRL's usage ping is for TRL's own trainers; a plugin should not report on their behalf.
        return

    # ------------------------------------------------------------------ batches (trainers/batches.py)
    def _batch_sizes(self):
        set_batch_sizes(self.args, self.accelerator.num_processes, len(self.train_dataset))

    def _rollout_loader(self):
        loader = rollout_loader(self.train_dataset, self.args)
        return self.accelerator.prepare(loader) if self.accelerator.num_processes > 1 else loader

    # ------------------------------------------------------------------ generation
    def build_sampler(self) -> Sampler:
        """The run's sampler: the team, the backend the arguments ask for (trl_collm/generation/sampler.py), the
        config's sampling and prompt settings (both saved in team.json), and the DeepSpeed gathering and lockstep for
        generation; its calls are timed on the phase clock (trainers/console.py)."""
        return TimedSampler(
            self.team,
            make_backend(self.args),
            SamplingSettings.from_config(self.args),
            self.accelerator.device,
            unwrap=self._unwrap_for_generation(),
            logprob_temperature=self.sampler_logprob_temperature(),
            lockstep=lambda: distributed.generation_in_lockstep(self),
            prompts=PromptSettings.from_config(self.args, self.team),
            clock=self.phase_clock,
        )

    def run_updates(self, scored, pairs, epochs: int, per_agent: bool) -> dict:
        with self.phase_clock.phase("update"):  # the iteration's "update" time (trainers/console.py)
            return super().run_updates(scored, pairs, epochs, per_agent)

    def sampler_logprob_temperature(self) -> float | None:
        """The temperature at which the sampler records the sampled tokens' log-probs (None: not needed)."""
        return None

    def _unwrap_for_generation(self):
        """A context-manager factory (module -> module) for generation under DeepSpeed, or None without it."""
        if not self.is_deepspeed_enabled:
            return None
        return lambda module: distributed.generation_context(self, module)

    def sampler_for_step(self, greedy: bool = False) -> Sampler:
        """The sampler, told first when the weights moved since it last generated. `global_step` moves once per
        iteration, after all of the iteration's optimizer steps (plain or DeepSpeed), so checking it here, before
        every generation, is the one spot that covers both (TRL's `_last_loaded_step`)."""
        if self._last_loaded_step != self.state.global_step:
            self.sampler.backend.weights_changed()
            self._last_loaded_step = self.state.global_step
        if not greedy:
            return self.sampler
        return self.sampler.with_settings(dataclasses.replace(self.sampler.settings, greedy=True))

    def rollout(self, rows: list[dict], greedy: bool = False, keep_prompt_graph: bool = False) -> Rollout:
        """Episodes for `rows`; `keep_prompt_graph`: every generation keeps its prompt prefill with gradients for
        the update (`prompt_cache_rows`), where the caller's plan allows it (trainers/plan.py)."""
        args = self.args
        self.model.eval()
        sampler = self.sampler_for_step(greedy)
        if keep_prompt_graph:
            sampler = dataclasses.replace(sampler, keep_prompt_graph=True)
        try:
            return run_episodes(
                sampler,
                self.env,
                rows,
                args.num_turns,
                early_termination_threshold=args.early_termination_threshold,
            )
        except RuntimeError as e:
            if "probability tensor contains" not in str(e):
                raise
            # torch.multinomial's words for NaN/inf logits: the weights are finite (the step guard saw to that)
            # but so large that a forward overflows.
            raise FloatingPointError(
                "an agent's next-token probabilities are NaN/inf while sampling: its weights have diverged "
                f"({self.nonfinite_steps.in_a_row} update(s) in a row were already skipped as non-finite). Lower the "
                "learning rate (or raise max_grad_norm clipping) and resume from the last checkpoint."
            ) from e

    # ------------------------------------------------------------------ scoring helpers (shared by the trainers)
    def loss_temperature(self) -> float:
        """The temperature the loss's log-probs divide the logits by: the sampling temperature, or 1 when
        `scale_logits_by_temperature` is off."""
        return self.args.temperature if self.args.scale_logits_by_temperature else 1.0

    def chunked_logprobs(self, a: str, g, reference: bool = False) -> torch.Tensor:
        """Agent `a`'s (or its reference's) log-probs of the generation `g`'s response tokens, (B, Lr), without
        gradients' memory: in chunks of local_rollout_forward_batch_size rows."""
        return _chunked(
            lambda s: self.team.logprobs(
                a,
                g.query_ids[s],
                g.query_mask[s],
                g.response_ids[s],
                g.response_mask[s],
                self.loss_temperature(),
                reference=reference,
            )[0],
            len(g.query_ids),
            self.args.local_rollout_forward_batch_size,
        )

    def _episode_metrics(self, agent_scores: torch.Tensor, turns_played: float, turns, length_turns=None) -> dict:
        """What every trainer logs about a batch's episodes: the turns played, the EOS count over `turns`
        (`turns[t][agent]` with a `.gen`), each agent's score (`agent_scores`, (E, n)) and mean response length
        (over `length_turns`, default all turns), and the env's reward components."""
        names = self.team.names
        length_turns = turns if length_turns is None else length_turns
        eos = sum(float(turn[a].gen.ended.float().sum()) for turn in turns for a in names)
        metrics = {"objective/turns": turns_played, "val/num_eos_tokens": float(eos)}
        for i, a in enumerate(names):
            lengths = [float(turn[a].gen.response_mask.float().sum(-1).mean()) for turn in length_turns]
            metrics[f"{a}/objective/scores"] = float(agent_scores[:, i].mean())
            metrics[f"{a}/response_length"] = sum(lengths) / len(lengths)
        for name, value in (getattr(self.env, "last_reward_components", None) or {}).items():
            metrics[f"rewards/{name}"] = float(value.float().mean())
        return metrics

    # ------------------------------------------------------------------ the loop
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
            checkpoints.load_trainer_state(self.state, checkpoint)
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
        saved = checkpoints.load_checkpoint(self, checkpoint)
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
            checkpoints.load_parameters(self, self.state.best_model_checkpoint)
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

    def optimizer_steps_per_iteration(self) -> int:
        raise NotImplementedError

    def training_iteration(self, rows: list[dict]) -> dict:
        raise NotImplementedError

    # ------------------------------------------------------------------ evaluation (trainers/evaluation.py)
    @torch.no_grad()
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval", greedy: bool = False):
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None or len(dataset) == 0:
            raise ValueError(
                "`evaluate` needs an `eval_dataset` (at construction or as argument) with at least one row."
            )
        metrics = evaluation.mean_returns(self, dataset, metric_key_prefix, greedy)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics=metrics)
        return metrics

    @torch.no_grad()
    def generate_completions(self, sampling: bool = False, num_rows: int = 4, show: bool = True) -> list[dict]:
        """Run a few episodes (eval set, else train set) and return (`show`: and print) each agent's completions."""
        dataset = self.eval_dataset if self.eval_dataset is not None else self.train_dataset
        rows = [dataset[i] for i in range(min(num_rows, len(dataset)))]
        table = evaluation.completion_table(self, rows, greedy=not sampling)
        if show and self.is_world_process_zero():
            evaluation.print_table(table, self.team.names)
        return table

    # ------------------------------------------------------------------ saving
    def team_description(self) -> dict:
        """The saved team's team.json (see `trl_collm.team.saved`)."""
        args = self.args
        # The sampling and prompt settings, so `trl-collm eval` / `play` (and the card) run the team as it was trained.
        desc = saved.describe_team(
            self.team,
            type(self).__name__,
            args.num_turns,
            args.preset,
            self.critic,
            generation=self.sampler.settings.to_team_json(),
            prompts=self.sampler.prompts.to_team_json(),
            base=self.base_identity,
        )
        if self.task_record is not None:
            desc["task"] = dict(self.task_record)
        return desc

    def create_model_card(self, model_name=None, dataset_name=None, tags=None, task=None, output_dir=None):
        """The team card (README.md in output_dir, built by trl_collm.team.card in place of TRL's single-model card):
        each agent's base model, the task (`task`: a registry name or import path; default: the one `task_record`
        holds, as the CLI sets it), algorithm and critic, the last metrics, how to load and run the team."""
        from ..team.card import write_team_card

        task = task if task is not None else (self.task_record or {}).get("ref")
        if self.is_world_process_zero():
            write_team_card(
                self, model_name=model_name, dataset_name=dataset_name, tags=tags, task=task, output_dir=output_dir
            )

    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        include_critic: bool = True,
        **kwargs,
    ):
        """Publish the whole team: every agent folder, team.json, the team card and (unless include_critic=False)
        the critic. Extra keyword arguments (e.g. dataset_name) go to the model card."""
        return hub.push_team(self, commit_message, blocking, token, revision, include_critic, kwargs)

    def _single_agent(self) -> bool:
        return len(self.team.names) == 1

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        output_dir = output_dir or self.args.output_dir
        # ZeRO-3: parameters are partitioned; gather a full state dict (collective, every rank) and write from it.
        full = distributed.full_state_dict(self)
        self.accelerator.wait_for_everyone()
        if self.is_world_process_zero():
            with library_quiet():  # transformers' "Writing model shards" bars
                saved.write_team(output_dir, self.team, self.critic, self.team_description(), full)
            torch.save(self.args, os.path.join(output_dir, "training_args.bin"))
            # The card beside the team, from Python as from the CLI (which calls save_model too)
            self.create_model_card(model_name=os.path.basename(os.path.normpath(output_dir)), output_dir=output_dir)
        if self.args.push_to_hub and not _internal_call:  # as transformers: a user's save_model() also pushes
            self.push_to_hub(commit_message="Model save")  # every rank: it saves again (a collective under ZeRO-3)

    # ------------------------------------------------------------------ checkpoints
    @property
    def metrics_history(self) -> list[dict]:
        """The metrics of every iteration so far."""
        return self._metrics_history

    def checkpoint_state(self) -> dict:
        """Trainer state a checkpoint keeps besides parameters, optimizer, scheduler and RNG (see checkpoints.py)."""
        return {}

    def load_checkpoint_state(self, state: dict) -> None:
        """Restore what `checkpoint_state` returned."""


def _fold_single_agent_metrics(metrics: dict, name: str) -> dict:
    """With one agent, `<name>/x` repeats the team key `x`: drop the copies, keep agent-only keys under their
    own name."""
    prefix = f"{name}/"
    out = {k: v for k, v in metrics.items() if not k.startswith(prefix)}
    for k, v in metrics.items():
        if k.startswith(prefix) and k[len(prefix) :] not in out:
            out[k[len(prefix) :]] = v
    return out


def _chunked(fn, total: int, size: int) -> torch.Tensor:
    """fn(slice) over [0, total) in chunks of `size`, concatenated along dim 0 (right-padding a ragged last dim)."""
    outs = [fn(slice(s, s + size)) for s in range(0, total, size)]
    if not outs:
        return torch.zeros(0)
    if outs[0].dim() > 1:
        width = max(o.shape[-1] for o in outs)
        outs = [torch.nn.functional.pad(o, (0, width - o.shape[-1])) for o in outs]
    return torch.cat(outs, dim=0)
