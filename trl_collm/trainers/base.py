"""Shared trainer base: builds the team, the critic and the environment, owns the accelerator, optimizer, logging,
checkpoints, saving and the Hub push. The PPO and MC trainers only say how advantages and losses are made.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import os
import time
from collections import defaultdict

import torch
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerState, set_seed
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import TrainOutput
from trl.trainer.base_trainer import _BaseTrainer
from trl.trainer.utils import disable_dropout_in_model

from .. import algorithms as alg
from .. import saved_team
from ..assembly import TeamModel, build_team, resolve_agent_names
from ..chat import agent_prompt
from ..envs import MultiAgentEnv, RewardFunctionEnv, RewardModelFunction, check_agent_names
from ..generation import make_backend
from ..numerics import NonFiniteSteps, gradients_finite
from ..rollout import Rollout, run_episodes
from ..sampling import Sampler, SamplingSettings
from . import checkpoints, distributed
from .output_dir import LOCK_FILE, OutputDirLock, check_writable

logger = logging.getLogger(__name__)


def build_env(env, reward_funcs, reward_model, prompt_formatters, args, team) -> MultiAgentEnv:
    names = team.names
    if env is not None:
        if reward_funcs is not None or reward_model is not None:
            raise ValueError("Pass either `env` (which computes rewards) or `reward_funcs`/`reward_model`, not both.")
        if not isinstance(env, MultiAgentEnv):
            raise TypeError(f"`env` must be a trl_collm.MultiAgentEnv, got {type(env).__name__}.")
        if getattr(env, "agent_names", None):
            check_agent_names(env, names)
        return env
    funcs = (
        []
        if reward_funcs is None
        else (list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs])
    )
    if reward_model is not None:
        # A TRL-PPO reward model scores each agent's prompt + completion with the first agent's tokenizer.
        funcs.append(
            RewardModelFunction(
                reward_model, team.tokenizers[names[0]], batch_size=args.local_rollout_forward_batch_size
            )
        )
    if not funcs:
        raise ValueError("No reward: pass `reward_funcs` (GRPO-style functions), `reward_model`, or an `env`.")
    if args.num_turns > 1:
        raise ValueError(
            f"`num_turns`={args.num_turns} needs an `env` that produces the next observations; reward functions "
            "are single-turn."
        )
    weights = args.reward_weights
    if weights is not None and len(weights) != len(funcs):
        raise ValueError(
            f"`reward_weights` has {len(weights)} entries for {len(funcs)} reward functions; give one weight per "
            "function."
        )
    return RewardFunctionEnv(
        funcs, formatters=prompt_formatters, reward_weights=weights, agent_names=names, reward_type=args.reward_type
    )


class TeamTrainerBase(_BaseTrainer):
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
        names = resolve_agent_names(model, args)
        if args.should_save:  # a folder no save can write to fails here, not at the first save hours later
            check_writable(args.output_dir)
        args.resolve_for_team(len(names))
        distributed.prepare_args_for_deepspeed(args)  # before the accelerator exists (CPU backend, use_cpu, clipping)
        team = build_team(model, processing_class, ref_model, peft_config, args, names)
        # What the team is built from, before DeepSpeed can partition it (team.json; a resume compares it)
        self.base_identity = saved_team.base_identity(team)
        critic = self.build_critic(team, value_model, args, peft_config, critic_processing_class)
        self.env = build_env(env, reward_funcs, reward_model, prompt_formatters, args, team)
        _set_prompt_limits(team, args)
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

    # ------------------------------------------------------------------ batch sizes (TRL PPO semantics)
    def _batch_sizes(self):
        args = self.args
        world = self.accelerator.num_processes
        args.local_batch_size = (
            args.per_device_train_batch_size * args.gradient_accumulation_steps * args.num_mini_batches
        )
        args.micro_batch_size = args.per_device_train_batch_size * world
        args.batch_size = args.local_batch_size * world
        args.mini_batch_size = max(1, args.batch_size // args.num_mini_batches)
        args.local_mini_batch_size = max(1, args.local_batch_size // args.num_mini_batches)
        if args.max_steps is not None and args.max_steps > 0:  # as transformers: max_steps overrides the epochs
            args.num_total_batches = args.max_steps
            args.total_episodes = args.max_steps * args.batch_size
            return
        if args.total_episodes is None:
            args.total_episodes = int(args.num_train_epochs * len(self.train_dataset))
        args.num_total_batches = max(1, math.ceil(args.total_episodes / args.batch_size))

    def _rollout_loader(self):
        args = self.args
        if len(self.train_dataset) < args.local_batch_size:
            raise ValueError(
                f"`train_dataset` has {len(self.train_dataset)} rows but one rollout batch takes local_batch_size="
                f"{args.local_batch_size} (per_device_train_batch_size * gradient_accumulation_steps * "
                "num_mini_batches); "
                "lower per_device_train_batch_size or add rows."
            )
        generator = torch.Generator().manual_seed(args.data_seed if args.data_seed is not None else args.seed)
        loader = DataLoader(
            self.train_dataset,
            batch_size=args.local_batch_size,
            shuffle=True,
            drop_last=True,
            collate_fn=lambda rows: rows,
            generator=generator,
        )
        return self.accelerator.prepare(loader) if self.accelerator.num_processes > 1 else loader

    # ------------------------------------------------------------------ optimizer
    def param_groups(self) -> list[dict]:
        """One group per agent and per critic, so learning rates (and clipping) can differ by module."""
        args = self.args
        seen, groups = set(), []

        def add(name, params, lr):
            params = [p for p in params if p.requires_grad and id(p) not in seen]
            seen.update(id(p) for p in params)
            if params:
                groups.append({"params": params, "lr": lr, "name": name})

        for a in self.team.names:
            add(a, self.team.agent_parameters(a), args.learning_rate)
        if self.critic is not None:
            for key, params in self.critic.unit_parameters().items():
                add(f"critic/{key}", params, args.critic_learning_rate or args.learning_rate)
        return groups

    def create_optimizer(self, model=None):
        """`optim` through transformers' optimizer factory (its class and keyword arguments: lr, betas, eps,
        optim_args), over `param_groups()`; `weight_decay` applies to every trained parameter."""
        if self.optimizer is None:
            args = self.args
            optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
            kwargs = dict(kwargs)
            if "weight_decay" in inspect.signature(optimizer_cls).parameters:
                kwargs.setdefault("weight_decay", args.weight_decay)
            self.optimizer = optimizer_cls(self.param_groups(), **kwargs)
        return self.optimizer

    def _clip_gradients(self, agents: list[str]):
        args = self.args
        if args.max_grad_norm is None or args.max_grad_norm <= 0:
            return
        if args.grad_clip_scope == "global":
            params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
            self.accelerator.clip_grad_norm_(params, args.max_grad_norm)
            return
        modules = [self.team.agent_parameters(a) for a in agents]
        if self.critic is not None:
            modules += self.critic.parameters_for(agents)
        for params in modules:
            params = [p for p in params if p.grad is not None]
            if params:
                torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)

    # ------------------------------------------------------------------ update schedule (shared by the trainers)
    def run_updates(self, scored, pairs: torch.Tensor, epochs: int, per_agent: bool) -> dict:
        """Optimizer steps over the played (episode, turn) `pairs` of `scored` (a trainer's scored batch, whose
        `turns[t][agent]` are `ScoredTurn`s).

        joint: per epoch, shuffle the pairs, split them into `num_mini_batches`, one step each for every agent.
        per_agent: the reference codes' schedule: for each agent, for each turn, for each minibatch, one step.
        """
        args, names = self.args, self.team.names
        logs = defaultdict(list)
        for _ in range(epochs):
            if not per_agent:
                for mb in _split(pairs[torch.randperm(len(pairs))], args.num_mini_batches):
                    self._step(scored, mb, names, logs)
                continue
            for a in names:
                for t in range(len(scored.turns)):
                    sel = pairs[pairs[:, 1] == t]
                    for mb in _split(sel[torch.randperm(len(sel))], args.num_mini_batches):
                        self._step(scored, mb, [a], logs)
        return logs

    def _step(self, scored, pairs: torch.Tensor, agents: list[str], logs):
        """One optimizer step on a minibatch of (episode, turn) pairs, micro-batched by per_device_train_batch_size."""
        micro = self.micro_batch_rows()
        if self.is_deepspeed_enabled:
            # One engine.step() per minibatch: every backward below only accumulates (distributed.engine_backward);
            # DeepSpeed reduces the gradients across ranks and clips the global norm (max_grad_norm) in step().
            # ZeRO checks the reduced gradients for NaN/inf itself and skips such a step (engine.skipped_steps);
            # `_accumulate` turns a non-finite loss into NaN gradients so that it is skipped the same way.
            with distributed.engine_backward(self) as engine:
                losses_finite = self._accumulate(scored, pairs, agents, logs, micro)
                distributed.release_gathered(self)  # no gathered copy may outlive the step that updates the shards
                skipped_before = engine.skipped_steps
                self.control = self.callback_handler.on_pre_optimizer_step(self.args, self.state, self.control)
                engine.step()
            if engine.skipped_steps > skipped_before:
                self.nonfinite_steps.skipped("loss" if not losses_finite else "gradients")
                return
            self.nonfinite_steps.stepped()
            self.control = self.callback_handler.on_optimizer_step(self.args, self.state, self.control)
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
            return
        self.optimizer.zero_grad(set_to_none=True)
        losses_finite = self._accumulate(scored, pairs, agents, logs, micro)
        distributed.average_gradients(self)  # several processes without DeepSpeed; no-op in one process
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        # After averaging every rank holds the same gradients; only the loss flag is local, so ranks agree on it.
        if distributed.on_any_rank(self, not losses_finite) or not gradients_finite(params):
            # A non-finite number never reaches the weights: drop this step's gradients, keep the optimizer state.
            self.optimizer.zero_grad(set_to_none=True)
            self.nonfinite_steps.skipped("loss" if not losses_finite else "gradients")
            return
        self.nonfinite_steps.stepped()
        self._clip_gradients(agents)
        self.control = self.callback_handler.on_pre_optimizer_step(self.args, self.state, self.control)
        self.optimizer.step()
        self.control = self.callback_handler.on_optimizer_step(self.args, self.state, self.control)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()

    def micro_batch_rows(self) -> int:
        """(row, turn) pairs per forward/backward part of an optimizer step: PPO's rows are episodes, so
        `per_device_train_batch_size` of them (TRL's PPO micro-batch)."""
        return max(1, self.args.per_device_train_batch_size)

    def _accumulate(self, scored, pairs: torch.Tensor, agents: list[str], logs, micro: int):
        """The backward passes of one `_step` (gradients accumulate; no optimizer step here); returns whether every
        loss was finite.

        Each loss `step_losses` yields is backpropagated before the next is computed: with LoRA agents on one base
        the active adapter changes between losses, and activation checkpointing must recompute with the adapter that
        was active."""
        finite = True
        # (transformers' Trainer leaves accelerate's gradient_accumulation_steps at 1, so `accelerator.backward` does
        # not divide: the weights below alone make the minibatch mean over all its micro-batches.)
        parts = pairs.split(micro)
        for k, mpairs in enumerate(parts):
            weight = len(mpairs) / len(pairs)  # micro losses are means; weight them to the minibatch mean
            for loss, rows in self.step_losses(scored, mpairs, agents, logs):
                # Backpropagated even when non-finite, so that every rank runs the same collectives; the step is
                # then dropped by `_step`.
                finite_here = bool(torch.isfinite(loss.detach()).all())
                finite = finite and finite_here
                scale = weight * rows / len(mpairs)
                if not finite_here and self.is_deepspeed_enabled:
                    # ZeRO skips a step only for non-finite gradients, and an infinite loss can have finite ones:
                    # NaN gradients here make every rank's ZeRO skip this step (the reduced gradients carry them).
                    scale = float("nan")
                self.accelerator.backward(loss * scale)
                distributed.release_gathered(self)  # ZeRO-3: the models this loss gathered, now that it is done
            if k < len(parts) - 1:  # transformers' event for an accumulation step that is not an optimizer step
                self.control = self.callback_handler.on_substep_end(self.args, self.state, self.control)
        return finite

    def step_losses(self, scored, mpairs: torch.Tensor, agents: list[str], logs):
        """The losses of one micro-batch of (episode, turn) pairs for the `agents` being updated: yields
        (loss, rows), a mean over `rows` of the micro-batch's pairs (the base weights it by rows / len(mpairs)).
        Append what to log to `logs[key]`. The one hook a trainer implements for its update."""
        raise NotImplementedError

    @staticmethod
    def agent_rows(turns, mpairs: torch.Tensor, agents: list[str]):
        """Yields (agent, scored turn, local rows) for every agent and turn that `mpairs` touches."""
        for a in agents:
            for t in mpairs[:, 1].unique().tolist():
                st = turns[t][a]
                rows = _rows_of(st.episode_ids, mpairs[mpairs[:, 1] == t][:, 0])
                if len(rows):
                    yield a, st, rows

    # ------------------------------------------------------------------ generation
    def build_sampler(self) -> Sampler:
        """The run's sampler: the team, the backend the arguments ask for (trl_collm/sampling.py), the config's
        sampling settings, and the DeepSpeed gathering and lockstep for generation."""
        return Sampler(
            self.team,
            make_backend(self.args),
            SamplingSettings.from_config(self.args),
            self.accelerator.device,
            unwrap=self._unwrap_for_generation(),
            logprob_temperature=self.sampler_logprob_temperature(),
            lockstep=lambda: distributed.generation_in_lockstep(self),
        )

    def importance_weights(self, agent: str, gen, rows, trainer_logprobs, mask, logs):
        """The importance-sampling correction's (B, L) weights for rows sampled by vLLM (`vllm_importance_sampling_*`,
        algorithms.importance_sampling_weights), or None when it does not apply. `trainer_logprobs`: the trainer's
        log-probs of the sampled tokens under the weights that sampled them (PPO's old log-probs). Logs the
        engine-vs-trainer log-prob gap and the mean weight."""
        args = self.args
        if not getattr(args, "use_vllm", False) or gen.engine_logprobs is None:
            return None
        engine = gen.engine_logprobs[rows].to(trainer_logprobs.device)
        m = mask.bool()
        gap = (trainer_logprobs.detach() - engine).abs()
        logs["vllm/logprob_gap_mean"].append(float(alg.masked_mean(gap, m)))
        logs["vllm/logprob_gap_max"].append(float(gap.masked_fill(~m, 0).max()) if m.any() else 0.0)
        if not args.vllm_importance_sampling_correction:
            return None
        weights = alg.importance_sampling_weights(
            trainer_logprobs.detach(),
            engine,
            m,
            args.vllm_importance_sampling_mode,
            args.vllm_importance_sampling_clip_min,
            args.vllm_importance_sampling_clip_max,
        )
        logs["vllm/is_weight_mean"].append(float(alg.masked_mean(weights, m)))
        logs[f"{agent}/vllm/is_weight_mean"].append(logs["vllm/is_weight_mean"][-1])
        return weights

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

    def rollout(self, rows: list[dict], greedy: bool = False) -> Rollout:
        args = self.args
        self.model.eval()
        try:
            return run_episodes(
                self.sampler_for_step(greedy),
                self.env,
                rows,
                args.num_turns,
                agent_context=args.agent_context,
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

    # ------------------------------------------------------------------ the loop
    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """Iterations of rollout + update, with transformers' callback contract: on_train_begin, on_epoch_begin /
        on_epoch_end (an epoch is one pass of the rollout loader over train_dataset), on_step_begin / on_step_end
        (a step is one iteration), on_pre_optimizer_step / on_optimizer_step / on_substep_end, on_log, on_evaluate,
        on_save, on_train_end. What happens after a step or an epoch is decided by `control.should_log /
        should_evaluate / should_save / should_epoch_stop / should_training_stop`, which transformers'
        DefaultFlowCallback sets from the logging / eval / save strategies and any callback may set too."""
        args = self.args
        if resume_from_checkpoint is None:  # TrainingArguments carries it (the CLI's --resume_from_checkpoint)
            resume_from_checkpoint = args.resume_from_checkpoint
        checkpoint = checkpoints.resolve(resume_from_checkpoint, args.output_dir)
        lock = self._claim_output_dir()
        try:
            return self._train(checkpoint)
        finally:
            lock.release()

    def _claim_output_dir(self) -> OutputDirLock:
        """Before anything is trained: output_dir must be writable (every process checks; a failure at the first
        save would come after hours), and this run alone may use it (the main process takes the lock). Every
        process raises together, so none waits in a collective for the others."""
        folder = self.args.output_dir
        lock = OutputDirLock(folder)
        problem = None
        try:
            check_writable(folder)
            if self.is_world_process_zero():
                lock.acquire()
        except (OSError, RuntimeError) as e:
            problem = e
        if distributed.on_any_rank(self, problem is not None):
            lock.release()
            if problem is not None:
                raise problem
            raise RuntimeError(f"another process of this run could not use output_dir {folder!r}; see its error.")
        return lock

    def _train(self, checkpoint: str | None):
        """`train` once the output_dir is this run's: checks first, then (overwrite_output_dir) the old checkpoints'
        deletion, then the loop."""
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
        steps_per_epoch = len(loader)  # iterations in one pass over train_dataset
        steps_per_iteration = self.optimizer_steps_per_iteration()
        self.create_optimizer_and_scheduler(num_training_steps=args.num_total_batches * steps_per_iteration)
        if self.is_deepspeed_enabled and self.model_wrapped is self.model:
            distributed.prepare_model_and_optimizer(self)  # TeamModel + optimizer -> one DeepSpeed engine
        if checkpoint is None and self.is_world_process_zero():  # every check passed: now the old run may go
            checkpoints.refuse_to_clobber(args.output_dir, args.overwrite_output_dir, delete=True)
        self.accelerator.wait_for_everyone()
        self.state = TrainerState(
            is_local_process_zero=self.is_local_process_zero(),
            is_world_process_zero=self.is_world_process_zero(),
            stateful_callbacks=self._exportable_callbacks(),
        )
        self.state.max_steps = args.num_total_batches
        self.state.num_train_epochs = math.ceil(args.num_total_batches / steps_per_epoch)
        self.state.train_batch_size = args.batch_size
        self.state.compute_steps(args, args.num_total_batches)  # logging / eval / save steps (fractions of max)
        self.state.episode = 0
        handler = self.callback_handler
        handler.model, handler.optimizer, handler.lr_scheduler = self.model, self.optimizer, self.lr_scheduler
        handler.train_dataloader = loader
        if checkpoint is not None:  # best metric and callback states first, so callbacks start from them
            checkpoints.load_trainer_state(self.state, checkpoint)
            self._load_callback_state()
        self.control = handler.on_train_begin(args, self.state, self.control)
        sample_every = (
            max(1, args.num_total_batches // args.num_sample_generations) if args.num_sample_generations > 0 else None
        )

        def batches():
            while True:
                yield from loader

        iterator = batches()
        saved = None
        if checkpoint is not None:
            saved = checkpoints.load_checkpoint(self, checkpoint)
            if not args.ignore_data_skip:
                for _ in range(saved["global_step"]):  # the data position: the same shuffled order, fast-forwarded
                    next(iterator)
            self.state.global_step, self.state.episode = saved["global_step"], saved["episode"]
            self.state.log_history = saved["log_history"]
            self._metrics_history = list(saved["metrics_history"])
            logger.info("resumed from %s at iteration %d", checkpoint, saved["global_step"])
        if args.eval_on_start:
            self._evaluate_in_training()
        if saved is not None:
            checkpoints.set_rng_state(saved["rng"])  # after skipping (and evaluating), so sampling continues exactly
        start = time.time()
        loss_sum = 0.0
        self._last_logged_step = self.state.global_step
        position = self.state.global_step % steps_per_epoch  # iterations done in the current pass
        epoch = self.state.global_step // steps_per_epoch
        epoch_started = False  # a resumed run starts (the rest of) an epoch too, as transformers
        while self.state.global_step < args.num_total_batches:
            if not epoch_started:
                self.control = handler.on_epoch_begin(args, self.state, self.control)
                epoch_started = True
            self.control = handler.on_step_begin(args, self.state, self.control)
            rows = next(iterator)
            t0 = time.time()
            with self.accelerator.autocast():  # bf16 / fp16 mixed precision, as transformers.Trainer does
                metrics = self.training_iteration(rows)
            metrics["time/iteration_s"] = time.time() - t0
            metrics["train/nonfinite_steps_skipped"] = self.nonfinite_steps.take_iteration_count()
            self.state.episode += args.batch_size
            self.state.global_step += 1
            position += 1
            self.state.epoch = epoch + position / steps_per_epoch
            metrics["eps"] = int(self.state.episode / max(time.time() - start, 1e-9))
            metrics["episode"] = self.state.episode
            metrics["lr"] = self.lr_scheduler.get_last_lr()[0] if self.lr_scheduler is not None else args.learning_rate
            if self._single_agent():
                metrics = _fold_single_agent_metrics(metrics, self.team.names[0])
            loss_sum += float(metrics.get("loss/policy_avg", 0.0))
            self._metrics_history.append(dict(metrics))
            if args.torch_empty_cache_steps and self.state.global_step % args.torch_empty_cache_steps == 0:
                from accelerate.utils.memory import clear_device_cache

                clear_device_cache()
            self.control = handler.on_step_end(args, self.state, self.control)
            last = self.state.global_step >= args.num_total_batches
            if last and args.logging_strategy != "no":
                self.control.should_log = True  # the last iteration is always logged (as before this contract)
            self._log_save_evaluate(metrics)
            stop = self.control.should_training_stop
            if position == steps_per_epoch or last or stop or self.control.should_epoch_stop:
                if position < steps_per_epoch and not (last or stop):
                    for _ in range(steps_per_epoch - position):  # should_epoch_stop: skip the rest of this pass
                        next(iterator)
                self.control = handler.on_epoch_end(args, self.state, self.control)
                self._log_save_evaluate(metrics)
                position, epoch, epoch_started = 0, epoch + 1, False
                self.state.epoch = float(epoch)
            if sample_every and self.state.global_step % sample_every == 0 and self.eval_dataset is not None:
                self.generate_completions(sampling=True)
            if self.control.should_training_stop:
                break
        if args.load_best_model_at_end and self.state.best_model_checkpoint is not None:
            logger.info(
                "loading the best checkpoint %s (%s=%s)",
                self.state.best_model_checkpoint,
                args.metric_for_best_model,
                self.state.best_metric,
            )
            checkpoints.load_parameters(self, self.state.best_model_checkpoint)
        self.control = handler.on_train_end(args, self.state, self.control)
        return TrainOutput(
            self.state.global_step,
            loss_sum / max(1, self.state.global_step),
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
        path = checkpoints.save_checkpoint(self, args.output_dir)
        self.control = self.callback_handler.on_save(args, state, self.control)
        if args.push_to_hub and args.hub_strategy == "every_save":
            self.push_to_hub(commit_message=f"Training in progress, iteration {state.global_step}")
        return path

    def optimizer_steps_per_iteration(self) -> int:
        raise NotImplementedError

    def training_iteration(self, rows: list[dict]) -> dict:
        raise NotImplementedError

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval", greedy: bool = False):
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None or len(dataset) == 0:
            raise ValueError(
                "`evaluate` needs an `eval_dataset` (at construction or as argument) with at least one row."
            )
        totals = defaultdict(float)
        count = 0
        size = self.args.per_device_eval_batch_size
        for start in range(0, len(dataset), size):
            rows = [dataset[i] for i in range(start, min(start + size, len(dataset)))]
            roll = self.rollout(rows, greedy=greedy)
            returns = roll.rewards.sum(1)  # (E, n)
            totals["return"] += float(returns.mean(-1).sum())
            for i, a in enumerate(roll.agent_names):
                totals[f"{a}/return"] += float(returns[:, i].sum())
            totals["turns"] += float(roll.turn_mask.sum())
            count += len(rows)
        metrics = {f"{metric_key_prefix}_{k}": v / count for k, v in totals.items()}
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics=metrics)
        return metrics

    @torch.no_grad()
    def generate_completions(self, sampling: bool = False, num_rows: int = 4) -> list[dict]:
        """Run a few episodes (eval set, else train set) and print/return each agent's completions per turn."""
        dataset = self.eval_dataset if self.eval_dataset is not None else self.train_dataset
        rows = [dataset[i] for i in range(min(num_rows, len(dataset)))]
        roll = self.rollout(rows, greedy=not sampling)
        table = []
        for t, turn in enumerate(roll.turns):
            for k, e in enumerate(turn[roll.agent_names[0]].episode_ids.tolist()):
                entry = {"episode": e, "turn": t, "reward": roll.rewards[e, t].tolist()}
                for a in roll.agent_names:
                    entry[f"{a}/prompt"] = turn[a].contexts[k]
                    entry[f"{a}/completion"] = turn[a].gen.texts[k]
                table.append(entry)
        if self.is_world_process_zero():
            for entry in table:
                lines = [f"-- episode {entry['episode']} turn {entry['turn']} reward {entry['reward']}"]
                lines += [f"  [{a}] {entry[a + '/completion']!r}" for a in roll.agent_names]
                print("\n".join(lines))
        return table

    # ------------------------------------------------------------------ saving
    def team_description(self) -> dict:
        """The saved team's team.json (see `trl_collm.saved_team`)."""
        args = self.args
        # The sampling settings, so `trl-collm eval` / `play` (and the card) run the team as it was trained.
        generation = dict(
            self.sampler.settings.to_team_json(),
            max_prompt_length={a: self.team.prompt_limits.get(a) for a in self.team.names},
        )
        desc = saved_team.describe_team(
            self.team,
            type(self).__name__,
            args.num_turns,
            args.preset,
            self.critic,
            generation=generation,
            base=self.base_identity,
        )
        if self.task_record is not None:
            desc["task"] = dict(self.task_record)
        return desc

    def create_model_card(self, model_name=None, dataset_name=None, tags=None, task=None):
        """The team card (README.md in output_dir, built by trl_collm.cards in place of TRL's single-model card):
        each agent's base model, the task (`task`: a registry name or import path), algorithm and critic, the last
        metrics, how to load and run the team."""
        from ..cards import write_team_card

        if self.is_world_process_zero():
            write_team_card(self, model_name=model_name, dataset_name=dataset_name, tags=tags, task=task)

    def _task_facts(self) -> dict:
        facts = {"env": type(self.env).__name__, "rewards": list(getattr(self.env, "reward_func_names", []) or [])}
        try:  # the prompts an episode starts with, from the first training row, on a copy of the env
            observations = self.env.clone().reset(self.train_dataset[0])
            facts["example_prompts"] = {
                a: self.team.decode_observation(a, agent_prompt(self.team.tokenizers[a], o))
                for a, o in zip(self.team.names, observations)
            }
        except Exception:  # noqa: BLE001 - a card must not fail on an env that cannot reset outside a batch
            pass
        return facts

    # The config fields the model card lists (those the trainer's config has).
    _card_fields = (
        "advantage_level",
        "policy_loss_type",
        "num_ppo_epochs",
        "kl_coef",
        "num_generations",
        "joint_mode",
        "expansion",
        "baseline",
        "loss_type",
        "gamma",
        "learning_rate",
    )

    def _algorithm_facts(self) -> dict:
        facts = {}
        if self.critic is not None:  # the card names the critic layout first
            facts.update(self.critic.card_facts())
        facts.update({k: getattr(self.args, k) for k in self._card_fields if hasattr(self.args, k)})
        return facts

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
        import transformers.trainer as hf_trainer

        model_name = (
            kwargs.pop("model_name", None)
            or (self.args.hub_model_id or self.args.output_dir).rstrip("/").split("/")[-1]
        )
        token = token if token is not None else self.args.hub_token
        if self.hub_model_id is None:
            self.init_hf_repo(token=token)
        self.save_model(_internal_call=True)
        if not self.is_world_process_zero():
            return None
        self.create_model_card(model_name=model_name, **kwargs)
        ignore = ["_*", "checkpoint-*", "checkpoint-*/**", "runs/**", LOCK_FILE] + (
            [] if include_critic else ["critic/*", "critic/**"]
        )
        return hf_trainer.hf_api().upload_folder(
            repo_id=self.hub_model_id,
            folder_path=self.args.output_dir,
            commit_message=commit_message,
            token=token,
            run_as_future=not blocking,
            ignore_patterns=ignore,
            revision=revision or self.args.hub_revision,
        )

    def _single_agent(self) -> bool:
        return len(self.team.names) == 1

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        output_dir = output_dir or self.args.output_dir
        # ZeRO-3: parameters are partitioned; gather a full state dict (collective, every rank) and write from it.
        full = distributed.full_state_dict(self)
        self.accelerator.wait_for_everyone()
        if self.is_world_process_zero():
            saved_team.write_team(output_dir, self.team, self.critic, self.team_description(), full)
            torch.save(self.args, os.path.join(output_dir, "training_args.bin"))
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


def _rows_of(episode_ids: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
    """Local row indices of `episode_ids` whose episode is in `wanted`."""
    return torch.isin(episode_ids, wanted).nonzero().flatten()


def _split(x: torch.Tensor, parts: int) -> list[torch.Tensor]:
    parts = max(1, min(parts, len(x)))
    return [c for c in torch.tensor_split(x, parts) if len(c)]


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


def _set_prompt_limits(team, args) -> None:
    """Prompts longer than a model's context would crash or silently wrap positions: cut them to fit (keeping the
    end)."""
    from ..modeling import max_positions

    for a in team.names:
        limits = [args.max_prompt_length]
        context = max_positions(team.model_of(a))
        if context is not None:
            limits.append(context - args.response_length)
        limits = [x for x in limits if x is not None]
        team.prompt_limits[a] = max(1, min(limits)) if limits else None
