"""The iteration plan: which shortcuts an iteration takes, and the condition that decided each, in one place.

One rule decides most of them: **the update's first forward sees the sampling weights, each row once** (`one_look`:
one epoch, one minibatch, and no optimizer step of the iteration on an agent's weights before that agent's
forward). Dropout is off in every module (the base trainer), so the sampling (eval) and update (train) forwards
agree. Where the rule holds, a forward the iteration would run twice with the same weights runs once:

- `old_logprobs_from_update` (PPO) skips the scoring pass's policy forward: the update's first forward gives the old
  log-probs (the loss takes them detached, as TRL does when they are the current ones: the ratio is 1 in the
  forward). Also needs no KL term with a reference (its penalty is shaped into the rewards before the update).
  For MC, `old_logprobs_from_update` says whether scoring skips its old log-prob forward: GRPO's loss types take the
  update's own log-probs, detached, when the iteration has one optimizer step (as GRPO does); REINFORCE without a KL
  term reads none; the clipped loss and vLLM's importance-sampling correction always need them scored.
- `old_logprobs_from_sampler` (PPO), where the update cannot give them, skips the same forward: the sampler records
  the log-probs of what it samples. Needs logits as the model gives them (no repetition penalty, forced or
  suppressed tokens) and a backend that records them; equal up to float rounding.
- `reuse_value_forward` (PPO) skips the update's critic forward: the scoring pass runs the critic's only forward,
  with gradients, in chunks of `value_micro_batch_size` episodes; each chunk's values give its episodes' value
  targets (GAE is per episode) and its value loss is backpropagated at once, so the critic's activations are never
  held whole; the detached values give the advantages, and the update's one optimizer step adds the policy losses'
  gradients to those. Also needs the joint schedule, turn-level advantages, no running value normalisation, no
  activation checkpointing (a DC chunk's turns run under two critic adapters before its backward) and no DeepSpeed
  (its engine owns the backward); not that the graphs can wait.
- `reuse_rollout_prefill` (PPO, MC) skips the update's prompt forward: the rollout's prompt prefill, run with
  gradients, is reused. Also needs the graphs can wait and a backend that keeps the prefill (`generate()`).

Each is a config field (default True) that switches it off (MC's `old_logprobs_from_update` too).

"The graphs can wait" (`graphs_can_wait`): graphs built before the update's first backward are held until it, so
every (row, turn) pair of the iteration is in one micro-batch (each graph is backpropagated once, in one loss), no
activation checkpointing (a recomputation would run under whichever adapter is active by then) and no DeepSpeed
(ZeRO-3 gathers and releases the weights around each pass).

`make_plan(args, facts)` is the one function: the config says what the user asked, `PlanFacts` what the trainer
knows (DeepSpeed, the critic's placement, the backend). The trainers make a plan per iteration
(`TeamUpdates.plan_iteration`, logged when it changes) and read only its fields; tests/test_plan.py is its table.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .mc_config import GRPO_LOSS_TYPES
from .ppo_config import MultiAgentPPOConfig


@dataclass(frozen=True)
class Decision:
    """One decision of the plan: whether it applies, and the condition that decided it."""

    on: bool
    reason: str


@dataclass(frozen=True)
class PlanFacts:
    """What the trainer knows that the config does not say."""

    pairs: float  # the most (row, turn) pairs the iteration's update can see (inf: unknown in advance)
    micro_batch_rows: int  # (row, turn) pairs per forward / backward part of an optimizer step
    deepspeed: bool = False
    critic_shares_actor_weights: bool = False  # a critic head on an actor's backbone
    has_reference: bool = False  # some agent has a reference policy (a KL term reads it)
    logits_are_the_models: bool = True  # every agent's generation config leaves the logits as the model gives them
    sampler_records_logprobs: bool = True  # the sampler was asked to record log-probs and its backend records them
    backend_keeps_prompt_graph: bool = True  # the backend can run the prompt prefill with gradients and return it
    optimizer_steps: int | None = None  # optimizer steps per iteration, where a decision reads it (MC gives it)


@dataclass(frozen=True)
class IterationPlan:
    """The shortcuts of one iteration (see the module's table), each with its reason."""

    one_look: Decision
    graphs_can_wait: Decision
    old_logprobs_from_update: Decision
    old_logprobs_from_sampler: Decision
    reuse_value_forward: Decision
    reuse_rollout_prefill: Decision

    def describe(self) -> str:
        """One line per decision, for the log."""
        return "\n".join(
            f"  {f.name}: {'yes' if d.on else 'no'} ({d.reason})" for f in fields(self) for d in [getattr(self, f.name)]
        )


def make_plan(args, facts: PlanFacts) -> IterationPlan:
    """The plan for a `MultiAgentPPOConfig` or `MultiAgentMCConfig` and the trainer's facts."""
    look = one_look(args, facts)
    wait = graphs_can_wait(args, facts)
    from_update = old_logprobs_from_update(args, facts)
    return IterationPlan(
        one_look=look,
        graphs_can_wait=wait,
        old_logprobs_from_update=from_update,
        old_logprobs_from_sampler=_old_logprobs_from_sampler(args, facts, from_update),
        reuse_value_forward=_reuse_value_forward(args, facts, look),
        reuse_rollout_prefill=_first(
            (not args.reuse_rollout_prefill, "reuse_rollout_prefill=False"),
            (not look.on, look.reason),
            (not wait.on, wait.reason),
            (not facts.backend_keeps_prompt_graph, "the backend cannot keep the prefill (only generate() does)"),
            on="the update forwards only the responses, on the rollout's prefill",
        ),
    )


def one_look(args, facts: PlanFacts) -> Decision:
    """Whether every agent's first forward in the update sees the weights that sampled, each row once."""
    ppo = isinstance(args, MultiAgentPPOConfig)
    epochs_name, epochs = ("num_ppo_epochs", args.num_ppo_epochs) if ppo else ("num_iterations", args.num_iterations)
    per_agent = args.critic_updates == "per_agent" if ppo else args.update_schedule == "per_agent_turn"
    schedule = "critic_updates='per_agent'" if ppo else "update_schedule='per_agent_turn'"
    return _first(
        (epochs != 1, f"{epochs_name}={epochs}: the update sees each row {epochs} times"),
        (args.num_mini_batches != 1, f"num_mini_batches={args.num_mini_batches}: a later minibatch sees moved weights"),
        (per_agent and args.num_turns > 1, f"{schedule} over {args.num_turns} turns: turn t's step moves turn t+1's"),
        (
            per_agent and facts.critic_shares_actor_weights,
            f"{schedule} with a critic on an actor's backbone: another agent's critic step moves it first",
        ),
        on=f"{epochs_name}=1, num_mini_batches=1: the update's first forward sees the sampling weights, each row once",
    )


def graphs_can_wait(args, facts: PlanFacts) -> Decision:
    """Whether graphs built before the update's first backward can be held until it."""
    return _first(
        (
            facts.pairs > facts.micro_batch_rows,
            f"up to {facts.pairs} (row, turn) pairs in micro-batches of {facts.micro_batch_rows}",
        ),
        (args.activation_checkpointing, "activation_checkpointing: a recomputation would run under another adapter"),
        (facts.deepspeed, "DeepSpeed: ZeRO gathers and releases the weights around each pass"),
        on=f"every (row, turn) pair in one micro-batch of {facts.micro_batch_rows}",
    )


def old_logprobs_from_update(args, facts: PlanFacts) -> Decision:
    """Whether the update's first forward gives PPO's old log-probs (no scoring forward); MC: `_mc_old_logprobs`."""
    if not isinstance(args, MultiAgentPPOConfig):
        return _mc_old_logprobs(args, facts)
    look = one_look(args, facts)
    return _first(
        (not args.old_logprobs_from_update, "old_logprobs_from_update=False"),
        (not look.on, look.reason),
        (
            args.kl_coef != 0 and facts.has_reference,
            "a KL term: its penalty is shaped into the rewards before the update",
        ),
        on="the update's first forward gives them",
    )


def _mc_old_logprobs(args, facts: PlanFacts) -> Decision:
    """MC: whether scoring skips the old log-prob forward (the loss takes the update's own, detached, or reads none)."""
    grpo = args.loss_type in GRPO_LOSS_TYPES
    steps = facts.optimizer_steps
    return _first(
        (not args.old_logprobs_from_update, "old_logprobs_from_update=False"),
        (
            args.use_vllm and args.vllm_importance_sampling_correction,
            "vLLM's importance-sampling correction compares the engine's log-probs with the sampling weights' own",
        ),
        (args.loss_type == "clipped", "loss_type='clipped' reads the sampling weights' log-probs at every step"),
        (grpo and steps is None, "the optimizer steps per iteration are unknown"),
        (
            grpo and steps is not None and steps > 1,
            f"{steps} optimizer steps per iteration: a later one sees moved weights",
        ),
        (not grpo and args.beta != 0, f"loss_type={args.loss_type!r} with a KL term (beta={args.beta})"),
        on="one optimizer step per iteration: the update's first forward gives them, as GRPO's"
        if grpo
        else f"loss_type={args.loss_type!r} without a KL term reads none",
    )


def _old_logprobs_from_sampler(args, facts: PlanFacts, from_update: Decision) -> Decision:
    if not isinstance(args, MultiAgentPPOConfig):
        return Decision(False, "MC records none while sampling (scoring gives them where the update does not)")
    return _first(
        (not args.old_logprobs_from_sampler, "old_logprobs_from_sampler=False"),
        (from_update.on, "the update's first forward gives them"),
        (not facts.logits_are_the_models, "a generation config changes the logits (repetition penalty, forced tokens)"),
        (not facts.sampler_records_logprobs, "the backend does not record log-probs (a scoring forward does)"),
        on="recorded while sampling, from the decoding forward",
    )


def _reuse_value_forward(args, facts: PlanFacts, look: Decision) -> Decision:
    if not isinstance(args, MultiAgentPPOConfig):
        return Decision(False, "MC has no critic")
    return _first(
        (not args.reuse_value_forward, "reuse_value_forward=False"),
        (not look.on, look.reason),
        (args.critic_updates == "per_agent", "critic_updates='per_agent': the critic steps before some agents"),
        (args.advantage_level == "token", "advantage_level='token'"),
        (args.value_normalization, "value_normalization: its statistics move with the returns before the update"),
        (
            args.activation_checkpointing,
            "activation_checkpointing: a chunk's backward would recompute under whichever critic adapter ran last",
        ),
        (facts.deepspeed, "DeepSpeed: its engine runs the backward inside the optimizer step"),
        on=f"one critic forward with gradients while scoring, its value loss backpropagated every "
        f"{args.value_micro_batch_size} episodes",
    )


def _first(*conditions: tuple[bool, str], on: str) -> Decision:
    """Off with the reason of the first condition that holds, else on."""
    for blocked, reason in conditions:
        if blocked:
            return Decision(False, reason)
    return Decision(True, on)
