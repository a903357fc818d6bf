"""The update half of a trainer: the optimizer over per-module parameter groups, gradient clipping, and the update
schedule (epochs x minibatches of played (episode, turn) pairs -> optimizer steps, each accumulated over
micro-batches, with the non-finite guard), the importance-sampling weights the losses apply to vLLM-sampled rows,
the update's log-probs (`update_logprobs`, on the prompt prefill kept from sampling when the plan says so), and the
iteration's plan (`plan_iteration`: which shortcuts it takes, trainers/plan.py). A trainer implements one hook,
`step_losses`.

`TeamUpdates` is mixed into `TeamTrainerBase`; it uses the trainer's `args`, `team`, `critic`, `accelerator`,
`optimizer`, `lr_scheduler`, `callback_handler`, `state`, `control`, `nonfinite_steps`, `sampler` and `plan`.
"""

from __future__ import annotations

import inspect
import logging
from collections import defaultdict

import torch
from transformers import Trainer

from .. import algorithms as alg
from ..generation.backends import sampler_logits_are_the_models
from ..numerics import gradients_finite
from . import distributed
from .plan import IterationPlan, PlanFacts, make_plan

logger = logging.getLogger(__name__)


class TeamUpdates:
    plan: IterationPlan | None = None  # this iteration's shortcuts (`plan_iteration`); None before the first

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

    # ------------------------------------------------------------------ the iteration's shortcuts (plan.py)
    def plan_facts(self, num_pairs: float) -> PlanFacts:
        """What this trainer knows that the plan needs; `num_pairs`: the most (row, turn) pairs of the iteration.
        Before the sampler exists (its log-prob temperature is being chosen), it is assumed to record log-probs."""
        team, sampler = self.team, getattr(self, "sampler", None)
        return PlanFacts(
            pairs=num_pairs,
            micro_batch_rows=self.micro_batch_rows(),
            deepspeed=self.is_deepspeed_enabled,
            critic_shares_actor_weights=self.critic is not None and self.critic.shares_actor_weights(),
            has_reference=any(team.has_reference(a) for a in team.names),
            logits_are_the_models=all(sampler_logits_are_the_models(team.model_of(a)) for a in team.names),
            sampler_records_logprobs=sampler is None
            or (sampler.logprob_temperature is not None and sampler.backend.records_logprobs),
            backend_keeps_prompt_graph=sampler is not None and sampler.backend.keeps_prompt_graph,
        )

    def plan_iteration(self, num_pairs: float) -> IterationPlan:
        """This iteration's plan (trainers/plan.py), kept as `self.plan`; logged at the first iteration and whenever
        it changes."""
        plan = make_plan(self.args, self.plan_facts(num_pairs))
        if plan != self.plan:
            logger.info("iteration plan (trl_collm/trainers/plan.py):\n%s", plan.describe())
        self.plan = plan
        return plan

    @staticmethod
    def prompt_cache_rows(gen, rows: torch.Tensor):
        """The rows `rows` of `gen`'s kept prompt prefill for the update's forward, or None. Taken once: a second
        backward through the prefill's graph would fail, and its memory goes with the update's graph."""
        cache, gen.prompt_cache = gen.prompt_cache, None
        return cache.rows(rows) if cache is not None else None

    def update_logprobs(self, a: str, gen, rows: torch.Tensor, mask: torch.Tensor):
        """Agent `a`'s log-probs (with gradients) and entropies of `gen`'s rows `rows`: the update's forward, on the
        kept prompt prefill when there is one. `mask`: the response tokens that count."""
        return self.team.logprobs(
            a,
            gen.query_ids[rows],
            gen.query_mask[rows],
            gen.response_ids[rows],
            mask,
            self.loss_temperature(),
            with_entropy=True,
            prompt_cache=self.prompt_cache_rows(gen, rows),
        )

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
        # A scoring pass that backpropagated the critic's loss (PPO's `reuse_value_forward`) zeroed the gradients
        # before it and left its own in .grad for this, the iteration's one step.
        early = getattr(scored, "critic_step", None)
        if early is None:
            self.optimizer.zero_grad(set_to_none=True)
        losses_finite = self._accumulate(scored, pairs, agents, logs, micro) and (early is None or early.finite)
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
                if not finite_here and self.is_deepspeed_enabled:
                    # ZeRO skips a step only for non-finite gradients, and an infinite loss can have finite ones:
                    # NaN gradients here make every rank's ZeRO skip this step (the reduced gradients carry them).
                    loss = loss * float("nan")
                # Scaled in this order (tensor * weight * rows / n), as before: another grouping rounds differently.
                self.accelerator.backward(loss * weight * rows / len(mpairs))
                distributed.release_gathered(self)  # ZeRO-3: the models this loss gathered, now that it is done
            if k < len(parts) - 1:  # transformers' event for an accumulation step that is not an optimizer step
                self.control = self.callback_handler.on_substep_end(self.args, self.state, self.control)
        return finite

    def step_losses(self, scored, mpairs: torch.Tensor, agents: list[str], logs):
        """The losses of one micro-batch of (episode, turn) pairs for the `agents` being updated: yields
        (loss, rows), a mean over `rows` of the micro-batch's pairs (the base weights it by rows / len(mpairs)).
        Append what to log to `logs[key]`. The one hook a trainer implements for its update."""
        raise NotImplementedError

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

    @staticmethod
    def agent_rows(turns, mpairs: torch.Tensor, agents: list[str]):
        """Yields (agent, scored turn, local rows) for every agent and turn that `mpairs` touches."""
        for a in agents:
            for t in mpairs[:, 1].unique().tolist():
                st = turns[t][a]
                rows = _rows_of(st.episode_ids, mpairs[mpairs[:, 1] == t][:, 0])
                if len(rows):
                    yield a, st, rows


def _rows_of(episode_ids: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
    """Local row indices of `episode_ids` whose episode is in `wanted`."""
    return torch.isin(episode_ids, wanted).nonzero().flatten()


def _split(x: torch.Tensor, parts: int) -> list[torch.Tensor]:
    parts = max(1, min(parts, len(x)))
    return [c for c in torch.tensor_split(x, parts) if len(c)]
