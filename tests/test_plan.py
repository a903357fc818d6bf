"""trl_collm/trainers/plan.py as one table: config overrides and trainer facts -> each shortcut and its reason.

The configs are built (no model loads); the facts are what a trainer would report. `-` in a row: the decision is
off, and its reason must contain the text given; `+`: on, with the text given. Decisions a row does not name are
checked against the baseline row (everything on, PPO: one epoch, one minibatch, 4 pairs in one micro-batch of 4).
The trainers' equivalence tests (tests/test_trainer_e2e.py, tests/test_prompt_cache.py, tests/test_mc.py) check
that each shortcut trains as the path it skips.
"""

from __future__ import annotations

import logging

import pytest
from conftest import RUN_SETTINGS

from trl_collm import MultiAgentMCConfig, MultiAgentPPOConfig
from trl_collm.trainers.plan import PlanFacts, make_plan

PPO_BASE = dict(num_ppo_epochs=1, num_mini_batches=1, kl_coef=0.0, per_device_train_batch_size=4)
FACTS = dict(pairs=4, micro_batch_rows=4)
ALL_ON = {
    "one_look": "+num_ppo_epochs=1, num_mini_batches=1",
    "graphs_can_wait": "+every (row, turn) pair in one micro-batch of 4",
    "old_logprobs_from_update": "+the update's first forward gives them",
    "old_logprobs_from_sampler": "-the update's first forward gives them",
    "reuse_value_forward": "+one critic forward with gradients while scoring, its value loss backpropagated every 2",
    "reuse_rollout_prefill": "+the update forwards only the responses",
}
EPOCHS = "-num_ppo_epochs=2: the update sees each row 2 times"
MC_SAMPLER = "-MC records none while sampling"
MC_ONE_LOOK = dict(
    one_look="+num_iterations=1, num_mini_batches=1",
    old_logprobs_from_sampler=MC_SAMPLER,
    reuse_value_forward="-MC has no critic",
)
WAIT = "-up to 8 (row, turn) pairs in micro-batches of 4"

# (id, trainer, config overrides, facts overrides, expected decisions beyond the baseline)
TABLE = [
    ("baseline", "ppo", {}, {}, {}),
    (
        "two epochs",
        "ppo",
        dict(num_ppo_epochs=2),
        {},
        dict(
            one_look=EPOCHS,
            old_logprobs_from_update=EPOCHS,
            old_logprobs_from_sampler="+recorded while sampling",
            reuse_value_forward=EPOCHS,
            reuse_rollout_prefill=EPOCHS,
        ),
    ),
    (
        "two minibatches",
        "ppo",
        dict(num_mini_batches=2),
        {},
        dict(
            one_look="-num_mini_batches=2: a later minibatch",
            old_logprobs_from_update="-num_mini_batches=2",
            old_logprobs_from_sampler="+recorded while sampling",
            reuse_value_forward="-num_mini_batches=2",
            reuse_rollout_prefill="-num_mini_batches=2",
        ),
    ),
    (
        "per-agent steps, one turn",  # the reference schedule: each agent's step touches only its own weights first
        "ppo",
        dict(critic_updates="per_agent"),
        {},
        dict(reuse_value_forward="-critic_updates='per_agent': the critic steps before some agents"),
    ),
    (
        "per-agent steps, two turns",
        "ppo",
        dict(critic_updates="per_agent", num_turns=2),
        dict(pairs=8),
        dict(
            one_look="-critic_updates='per_agent' over 2 turns",
            graphs_can_wait=WAIT,
            old_logprobs_from_update="-critic_updates='per_agent' over 2 turns",
            old_logprobs_from_sampler="+recorded while sampling",
            reuse_value_forward="-critic_updates='per_agent' over 2 turns",
            reuse_rollout_prefill="-critic_updates='per_agent' over 2 turns",
        ),
    ),
    (
        "per-agent steps, critic head on an actor's backbone",
        "ppo",
        dict(critic_updates="per_agent"),
        dict(critic_shares_actor_weights=True),
        dict(
            one_look="-another agent's critic step moves it first",
            old_logprobs_from_update="-another agent's critic step",
            old_logprobs_from_sampler="+recorded while sampling",
            reuse_value_forward="-another agent's critic step",
            reuse_rollout_prefill="-another agent's critic step",
        ),
    ),
    (
        "a KL term with a reference",
        "ppo",
        dict(kl_coef=0.05),
        dict(has_reference=True),
        dict(
            old_logprobs_from_update="-a KL term: its penalty is shaped into the rewards",
            old_logprobs_from_sampler="+recorded while sampling",
        ),
    ),
    ("a KL coefficient without a reference", "ppo", dict(kl_coef=0.05), {}, {}),
    (
        "KL, and a repetition penalty",
        "ppo",
        dict(kl_coef=0.05),
        dict(has_reference=True, logits_are_the_models=False),
        dict(
            old_logprobs_from_update="-a KL term",
            old_logprobs_from_sampler="-a generation config changes the logits",
        ),
    ),
    (
        "KL, a backend that records no log-probs",
        "ppo",
        dict(kl_coef=0.05),
        dict(has_reference=True, sampler_records_logprobs=False, backend_keeps_prompt_graph=False),
        dict(
            old_logprobs_from_update="-a KL term",
            old_logprobs_from_sampler="-the backend does not record log-probs",
            reuse_rollout_prefill="-the backend cannot keep the prefill",
        ),
    ),
    (
        "two micro-batches",
        "ppo",
        {},
        dict(pairs=8),
        # the critic's loss is backpropagated while scoring, chunk by chunk: it never waits for the update
        dict(graphs_can_wait=WAIT, reuse_rollout_prefill=WAIT),
    ),
    (
        "activation checkpointing",
        "ppo",
        dict(activation_checkpointing=True),
        {},
        dict(
            graphs_can_wait="-activation_checkpointing",
            reuse_value_forward="-activation_checkpointing: a chunk's backward would recompute",
            reuse_rollout_prefill="-activation_checkpointing",
        ),
    ),
    (
        "DeepSpeed",
        "ppo",
        {},
        dict(deepspeed=True),
        dict(
            graphs_can_wait="-DeepSpeed",
            reuse_value_forward="-DeepSpeed: its engine runs the backward",
            reuse_rollout_prefill="-DeepSpeed",
        ),
    ),
    ("token-level advantages", "ppo", dict(advantage_level="token"), {}, dict(reuse_value_forward="-advantage_level")),
    ("value normalisation", "ppo", dict(value_normalization=True), {}, dict(reuse_value_forward="-value_normal")),
    (
        "switch: old log-probs from the update",
        "ppo",
        dict(old_logprobs_from_update=False),
        {},
        dict(
            old_logprobs_from_update="-old_logprobs_from_update=False",
            old_logprobs_from_sampler="+recorded while sampling",
        ),
    ),
    (
        "switches: neither from the update nor from the sampler",
        "ppo",
        dict(old_logprobs_from_update=False, old_logprobs_from_sampler=False),
        {},
        dict(
            old_logprobs_from_update="-old_logprobs_from_update=False",
            old_logprobs_from_sampler="-old_logprobs_from_sampler=False",
        ),
    ),
    (
        "switch: the value forward",
        "ppo",
        dict(reuse_value_forward=False),
        {},
        dict(reuse_value_forward="-reuse_value_forward=False"),
    ),
    (
        "switch: the rollout's prefill",
        "ppo",
        dict(reuse_rollout_prefill=False),
        {},
        dict(reuse_rollout_prefill="-reuse_rollout_prefill=False"),
    ),
    (
        "MC, one iteration",
        "mc",
        {},
        {},
        dict(
            one_look="+num_iterations=1, num_mini_batches=1",
            old_logprobs_from_update="+loss_type='reinforce' without a KL term reads none",
            old_logprobs_from_sampler=MC_SAMPLER,
            reuse_value_forward="-MC has no critic",
        ),
    ),
    (
        "MC, per agent and turn over two turns (a tree: pairs unknown in advance)",
        "mc",
        dict(update_schedule="per_agent_turn", num_turns=2),
        dict(pairs=float("inf")),
        dict(
            one_look="-update_schedule='per_agent_turn' over 2 turns",
            graphs_can_wait="-up to inf (row, turn) pairs",
            old_logprobs_from_update="+loss_type='reinforce' without a KL term reads none",
            old_logprobs_from_sampler=MC_SAMPLER,
            reuse_value_forward="-MC has no critic",
            reuse_rollout_prefill="-update_schedule='per_agent_turn' over 2 turns",
        ),
    ),
    (
        "MC, two iterations",
        "mc",
        dict(num_iterations=2, loss_type="clipped"),
        {},
        dict(
            one_look="-num_iterations=2: the update sees each row 2 times",
            old_logprobs_from_update="-loss_type='clipped' reads the sampling weights' log-probs at every step",
            old_logprobs_from_sampler=MC_SAMPLER,
            reuse_value_forward="-MC has no critic",
            reuse_rollout_prefill="-num_iterations=2",
        ),
    ),
    # MC's old log-probs (trainers/mc.py's score_tree reads this decision): GRPO's loss types take the update's own
    # when the iteration has one optimizer step; REINFORCE reads none without a KL term; 'clipped' always scores them.
    (
        "MC, a GRPO loss, one optimizer step",
        "mc",
        dict(loss_type="grpo"),
        dict(optimizer_steps=1),
        dict(MC_ONE_LOOK, old_logprobs_from_update="+one optimizer step per iteration: the update's first forward"),
    ),
    (
        "MC, a GRPO loss with a KL term, one optimizer step (the KL reads the reference, not the old log-probs)",
        "mc",
        dict(loss_type="dapo", beta=0.04),
        dict(optimizer_steps=1),
        dict(MC_ONE_LOOK, old_logprobs_from_update="+one optimizer step per iteration"),
    ),
    (
        "MC, a GRPO loss, one step per agent (two steps)",
        "mc",
        dict(loss_type="bnpo", update_schedule="per_agent_turn"),
        dict(optimizer_steps=2),
        dict(MC_ONE_LOOK, old_logprobs_from_update="-2 optimizer steps per iteration: a later one sees moved weights"),
    ),
    (
        "MC, a GRPO loss over two minibatches",
        "mc",
        dict(loss_type="dr_grpo", num_mini_batches=2),
        dict(optimizer_steps=2),
        dict(
            MC_ONE_LOOK,
            one_look="-num_mini_batches=2: a later minibatch",
            old_logprobs_from_update="-2 optimizer steps per iteration",
            reuse_rollout_prefill="-num_mini_batches=2",
        ),
    ),
    (
        "MC, a GRPO loss, steps not given",
        "mc",
        dict(loss_type="grpo"),
        {},
        dict(MC_ONE_LOOK, old_logprobs_from_update="-the optimizer steps per iteration are unknown"),
    ),
    (
        "MC, switch: old log-probs from the update",
        "mc",
        dict(old_logprobs_from_update=False),
        {},
        dict(MC_ONE_LOOK, old_logprobs_from_update="-old_logprobs_from_update=False"),
    ),
    (
        "MC, a GRPO loss, one optimizer step, switch off",
        "mc",
        dict(loss_type="grpo", old_logprobs_from_update=False),
        dict(optimizer_steps=1),
        dict(MC_ONE_LOOK, old_logprobs_from_update="-old_logprobs_from_update=False"),
    ),
    (
        "MC, REINFORCE with a KL term",
        "mc",
        dict(beta=0.04),
        dict(optimizer_steps=1),
        dict(MC_ONE_LOOK, old_logprobs_from_update="-loss_type='reinforce' with a KL term (beta=0.04)"),
    ),
]


def _config(tmp_path, trainer: str, overrides: dict):
    if trainer == "ppo":
        args = MultiAgentPPOConfig(**RUN_SETTINGS, output_dir=str(tmp_path), **{**PPO_BASE, **overrides})
        args.resolve_for_team(2)
        return args
    base = dict(num_mini_batches=1, per_device_train_batch_size=2, num_generations=2)
    return MultiAgentMCConfig(**RUN_SETTINGS, output_dir=str(tmp_path), **{**base, **overrides})


@pytest.mark.parametrize("trainer, overrides, facts, expected", [row[1:] for row in TABLE], ids=[r[0] for r in TABLE])
def test_the_plan_table(tmp_path, trainer, overrides, facts, expected):
    plan = make_plan(_config(tmp_path, trainer, overrides), PlanFacts(**{**FACTS, **facts}))
    for name, want in {**ALL_ON, **expected}.items():
        decision = getattr(plan, name)
        assert decision.on == (want[0] == "+") and want[1:] in decision.reason, (name, decision)


def test_mc_old_logprobs_are_scored_under_vllm_importance_correction(tmp_path):
    """vLLM's correction compares the engine's log-probs with the sampling weights' own: scored, whatever the loss."""
    args = _config(tmp_path, "mc", dict(loss_type="grpo"))
    args.use_vllm, args.vllm_importance_sampling_correction = True, True  # set after the checks (vLLM not installed)
    decision = make_plan(args, PlanFacts(**FACTS, optimizer_steps=1)).old_logprobs_from_update
    assert not decision.on and "importance-sampling correction" in decision.reason


def test_the_plan_is_logged_once_and_again_when_it_changes(tmp_path, caplog):
    """`plan_iteration` logs the plan at the first iteration and when it changes, not every iteration."""
    from trl_collm.trainers.updates import TeamUpdates

    class Trainer(TeamUpdates):  # the facts a trainer reports, without a model
        args = _config(tmp_path, "ppo", {})

        def plan_facts(self, num_pairs):
            return PlanFacts(pairs=num_pairs, micro_batch_rows=4)

    trainer = Trainer()
    with caplog.at_level(logging.INFO, logger="trl_collm.trainers.updates"):
        for pairs in (4, 4, 8, 8, 4):
            trainer.plan_iteration(pairs)
    logged = [r.getMessage() for r in caplog.records if "iteration plan" in r.getMessage()]
    assert len(logged) == 3  # 4 (first), 8 (changed), 4 (changed back)
    assert "reuse_rollout_prefill: yes" in logged[0] and "reuse_rollout_prefill: no (up to 8" in logged[1]
    assert trainer.plan.reuse_rollout_prefill.on
