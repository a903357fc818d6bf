"""MultiAgentPPOTrainer: actor-critic for n agents with a centralized (CoLLM-CC) or per-agent (CoLLM-DC) critic.

One iteration:
1. roll out a batch of episodes (shared runner, `rollout.py`);
2. score it without gradients: old / reference log-probs, critic values, rewards (+ KL, missing-EOS penalty),
   advantages and returns (GAE over turns, or over tokens as TRL's PPO: `ppo_advantages.py`); where the plan says
   `reuse_value_forward`, the critic's forward here has gradients and its value loss is backpropagated here, in
   chunks of episodes (`_critic_step_while_scoring`), for the update's one optimizer step;
3. update: PPO epochs x minibatches, each a sum of the agents' policy losses + vf_coef * critic loss and one
   optimizer step (or, with `critic_updates="per_agent"`, the reference code's schedule: one step per agent and turn).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from .. import algorithms as alg
from ..critics import CriticBatch, build_critic
from ..rollout import Rollout
from ..value_stats import RunningMeanStd, explained_variance
from .base import TeamTrainerBase
from .plan import IterationPlan, make_plan
from .ppo_advantages import PPOAdvantageEstimation, PPOAdvantages, ValueTargets
from .ppo_config import MultiAgentPPOConfig
from .scored import ScoredTurn
from .updates import _rows_of


@dataclass
class PPOTurn(ScoredTurn):
    """A scored turn of the PPO trainer."""

    kl: torch.Tensor | None = None  # (B, Lr) per-token KL to the reference (kl_coef != 0)
    # old_logprobs None: the plan takes them from the update's first forward (`plan.old_logprobs_from_update`)


@dataclass
class ScoredRollout:
    """A rollout scored for the update: its turns with log-probs and advantages, the critics' inputs and targets
    (`critic_batches[k]` is paired with `advantages.targets[k]`)."""

    rollout: Rollout
    turns: list[dict[str, PPOTurn]]  # turns[t][agent]
    critic_batches: list[CriticBatch]
    advantages: PPOAdvantages
    metrics: dict
    # plan.reuse_value_forward: the critic's value loss, backpropagated while scoring (its gradients wait in the
    # parameters' .grad for the update's one optimizer step). None: the update runs its own value losses.
    critic_step: CriticStep | None = None


@dataclass
class CriticStep:
    """What the scoring pass's critic backward leaves for the update: its logs (as the update's value losses log
    them) and whether every loss was finite (else the update drops the step)."""

    logs: dict[str, list[float]]
    finite: bool


class MultiAgentPPOTrainer(PPOAdvantageEstimation, TeamTrainerBase):
    """Multi-agent PPO with a team critic: CoLLM-CC (`critic_type="centralized"`, one critic sees every agent) or
    CoLLM-DC (`"decentralized"`, one critic per agent). With one model and no team options it behaves as TRL's last
    `PPOTrainer`, and it takes that trainer's arguments in the same order.

    Example:

    ```python
    >>> from datasets import Dataset
    >>> from peft import LoraConfig
    >>> from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer

    >>> def reward(prompts, completions, **columns):  # completions[e]: [alice's text, bob's text]
    ...     return [float(len(a) < len(b)) for a, b in completions]

    >>> args = MultiAgentPPOConfig(output_dir="team", agent_names=["alice", "bob"], critic_type="centralized")
    >>> trainer = MultiAgentPPOTrainer(
    ...     args=args,
    ...     model="Qwen/Qwen3-1.7B",  # one base, one LoRA adapter per agent and one for the critic
    ...     peft_config=LoraConfig(r=16, target_modules="all-linear"),
    ...     train_dataset=Dataset.from_dict({"prompt": ["Summarize: ..."] * 16}),
    ...     reward_funcs=reward,
    ... )
    >>> trainer.train()
    ```

    Args:
        args ([`MultiAgentPPOConfig`], *optional*):
            The run's configuration. `None`: `MultiAgentPPOConfig(output_dir="outputs/ppo")`.
        processing_class (tokenizer or path, list or dict name -> tokenizer, *optional*):
            Each agent's tokenizer. `None`: loaded from each agent's model (its path, or `config._name_or_path`).
        model (`str`, model, list or dict name -> model):
            The team. One path or Hub id: loaded once per agent, or with `peft_config` one base carrying one LoRA
            adapter per agent. A list: one model per agent (any architectures, each with its own tokenizer). A dict:
            the agents' names and models. One model object serves a one-agent team or, with `peft_config`, a LoRA
            team. The team's size comes from the list or dict, else from `args.agent_names` / `args.num_agents`.
        ref_model (model or path, list or dict, *optional*):
            Reference policies for the KL term. `None` with a KL term in the config: a LoRA policy uses its base with
            the adapter off, any other a frozen copy of itself.
        reward_model (`AutoModelForSequenceClassification`, *optional*):
            A TRL-PPO reward model; it scores each agent's prompt + completion, re-tokenized by the first agent's
            tokenizer, as one more reward function.
        train_dataset ([`~datasets.Dataset`]):
            The rows episodes start from: a `prompt` (or `input_ids`) column for reward functions, whatever the
            `env`'s `reset` reads otherwise.
        value_model (`AutoModelForSequenceClassification`, list or dict, *optional*):
            The critic's value model(s), one per critic unit (`critic_outputs(args, n)` says how many outputs each
            needs). `None`: built from the owning agent's model, or an adapter on the shared base of a LoRA team
            (`args.critic_placement` says where the critic lives).
        data_collator (*optional*):
            Collates dataset rows; default: the list of rows as given (the environment reads them).
        eval_dataset ([`~datasets.Dataset`] or dict of them, *optional*):
            Rows for `evaluate()`, which plays them and reports the returns.
        optimizers (`tuple`, *optional*, defaults to `(None, None)`):
            An optimizer and learning-rate scheduler to use instead of the default AdamW and `args.lr_scheduler_type`.
        callbacks (list of [`~transformers.TrainerCallback`], *optional*):
            Callbacks added to transformers' defaults.
        peft_config ([`~peft.PeftConfig`], list or dict, *optional*):
            One config with one `model`: a shared-base LoRA team (the base is frozen, one adapter per agent). With a
            list or dict of models, or a list or dict of configs: a LoRA adapter on each agent's own model.
        reward_funcs (callable or list of callables, *optional*):
            GRPO-style reward functions `f(prompts, completions, **columns)`, with `completions[e]` the n agents'
            texts of episode e, returning per episode a float (joint reward) or a list of n floats (one per agent).
            Several are summed with `args.reward_weights`. Single-turn; give an `env` for several turns.
        env ([`MultiAgentEnv`], *optional*):
            The environment that turns the agents' completions into rewards and next observations. Pass either `env`
            or `reward_funcs` / `reward_model`.
        critic_processing_class (tokenizer or path, list or dict, *optional*):
            The critic's tokenizer(s), one per critic unit. `None`: the tokenizer of the model each unit is built on.
        prompt_formatters (callable, list or dict name -> callable, *optional*):
            With `reward_funcs`: each agent's prompt built from the dataset row (`row -> str`), one for all agents or
            one per agent. `None`: every agent reads the row's `prompt` (or `input_ids`).
    """

    _tag_names = ["trl", "trl-collm", "ppo", "multi-agent", "collm"]
    _name = "MultiAgentPPO"
    _paper = {
        "title": "Learning Decentralized LLM Collaboration with Multi-Agent Actor Critic",
        "id": "2601.21972",
        "citation": (
            "@inproceedings{liu2026collm, title={Learning Decentralized LLM Collaboration with Multi-Agent "
            "Actor Critic}, "
            "author={Liu, Shuo and Chen, Tianle and Amiri, Ryan and Amato, Christopher}, booktitle={ICML}, year={2026}}"
        ),
    }

    def __init__(
        self,
        args: MultiAgentPPOConfig | None = None,
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
        args = args or MultiAgentPPOConfig(output_dir="outputs/ppo")
        super().__init__(
            args=args,
            processing_class=processing_class,
            model=model,
            ref_model=ref_model,
            reward_model=reward_model,
            train_dataset=train_dataset,
            value_model=value_model,
            data_collator=data_collator,
            eval_dataset=eval_dataset,
            optimizers=optimizers,
            callbacks=callbacks,
            peft_config=peft_config,
            reward_funcs=reward_funcs,
            env=env,
            critic_processing_class=critic_processing_class,
            prompt_formatters=prompt_formatters,
        )
        self.value_rms = RunningMeanStd() if args.value_normalization else None

    def sampler_logprob_temperature(self) -> float | None:
        """The policy's temperature in the loss, when the plan takes the old log-probs from the sampler (asked once,
        when the sampler is built; a backend that does not record them leaves them to the scoring forward)."""
        return (
            self.loss_temperature() if make_plan(self.args, self.plan_facts(0)).old_logprobs_from_sampler.on else None
        )

    def checkpoint_state(self) -> dict:
        return {"value_rms": self.value_rms.state_dict()} if self.value_rms is not None else {}

    def load_checkpoint_state(self, state: dict) -> None:
        if "value_rms" in state and self.value_rms is not None:
            self.value_rms.load_state_dict(state["value_rms"])

    # ------------------------------------------------------------------ schedule
    def optimizer_steps_per_iteration(self) -> int:
        args = self.args
        groups = len(self.team.names) * args.num_turns if args.critic_updates == "per_agent" else 1
        return args.num_ppo_epochs * args.num_mini_batches * groups

    # ------------------------------------------------------------------ the critic
    def build_critic(self, team, value_model, args, peft_config, critic_processing_class):
        token_level = args.advantage_level == "token"
        critic = build_critic(team, value_model, args, peft_config, critic_processing_class, token_level=token_level)
        if token_level:
            critic.check_tokenizers(team)
        # Token-level views carry the response after the view: keep room for it in the critic's context.
        critic.set_context_limits(args.response_length if token_level else 0)
        return critic

    # ------------------------------------------------------------------ scoring (no grad)
    @torch.no_grad()
    def score_rollout(
        self, roll: Rollout, plan: IterationPlan | None = None, critic_step: bool = False
    ) -> ScoredRollout:
        """The whole record the update reads: log-probs, rewards, advantages, value targets. `plan`: the iteration's
        (default: one made for this rollout). `critic_step` (the training iteration's): where the plan says
        `reuse_value_forward`, the critic's forward has gradients and its value loss is backpropagated here, for
        the update that follows at once; otherwise scoring leaves every gradient alone."""
        args, names = self.args, self.team.names
        n, E, T = len(names), roll.num_episodes, roll.num_turns
        plan = plan or self.plan_iteration(E * args.num_turns)
        rewards = roll.rewards.clone()  # (E, T, n)
        kl_seq = torch.zeros(E, T, n)
        logp_seq = torch.zeros(E, T, n)
        turns: list[dict[str, PPOTurn]] = []
        for t, turn in enumerate(roll.turns):
            scored = {}
            for i, a in enumerate(names):
                at = turn[a]
                if args.missing_eos_penalty is not None:
                    rewards[at.episode_ids, t, i] -= args.missing_eos_penalty * (~at.gen.ended).float().cpu()
                scored[a] = st = self._scored_turn(a, at, plan)
                if st.kl is not None:
                    kl_seq[at.episode_ids, t, i] = st.kl.sum(-1).cpu()
                if st.old_logprobs is not None:
                    logp_seq[at.episode_ids, t, i] = st.old_logprobs.sum(-1).cpu()
            turns.append(scored)
        scores = rewards.clone()  # environment reward after the EOS penalty, before KL
        cbs = self.critic.batches(roll)
        from_update = plan.old_logprobs_from_update.on
        metrics = self._scoring_metrics(roll, scores, kl_seq, None if from_update else logp_seq)
        shaped = rewards - args.kl_coef * kl_seq
        values, step = None, None
        if critic_step and plan.reuse_value_forward.on:
            values, step = self._critic_step_while_scoring(roll, cbs, shaped)
        if args.advantage_level == "token":
            advantages = self._token_advantages(turns, cbs, scores)
        else:
            advantages = self._turn_advantages(roll, cbs, shaped, values)
        for t, turn in enumerate(turns):
            for a, st in turn.items():
                st.advantages = advantages.advantages[t][a]
        return ScoredRollout(roll, turns, cbs, advantages, metrics, step)

    def _critic_step_while_scoring(
        self, roll: Rollout, cbs: list[CriticBatch], rewards: torch.Tensor
    ) -> tuple[list[torch.Tensor], CriticStep]:
        """`plan.reuse_value_forward`: the critic's only forward, with gradients, in chunks of value_micro_batch_size
        episodes. A chunk's values give its episodes' returns (GAE runs within an episode) and so its value loss,
        backpropagated at once, weighted as the update weights its value losses (each a mean over its rows, times
        rows / the update's pairs): the sum over chunks is the update's value loss, and no more than one chunk's
        activations are alive. The gradients stay in .grad (zeroed first) for the update's one optimizer step.
        Returns every batch's detached values (for the advantages) and what the update logs and checks."""
        args, names = self.args, self.team.names
        played = int(roll.turn_mask.sum())  # the update's (episode, turn) pairs
        self.optimizer.zero_grad(set_to_none=True)
        self.model.train()  # the update's mode (dropout is off in every module: the same numbers as eval)
        values: list[torch.Tensor | None] = [None] * len(cbs)  # per batch (B, outputs), filled chunk by chunk
        sums = defaultdict(float)  # per batch: row-weighted sums of the chunks' loss and clip fraction
        finite = True
        for chunk in torch.arange(roll.num_episodes).split(args.value_micro_batch_size):
            with torch.enable_grad():
                parts = []
                for k, cb in enumerate(cbs):
                    rows = _rows_of(cb.episode_ids, chunk)
                    if len(rows):
                        v = self.critic.values(cb, self.accelerator.device, rows)
                        if values[k] is None:
                            values[k] = torch.zeros(len(cb.episode_ids), v.shape[-1])
                        values[k][rows] = v.detach().float().cpu()
                        parts.append((k, rows, v))
                _, _, ret = self._turn_gae(roll, cbs, values, rewards)  # right for the episodes valued so far
                total = 0
                for k, rows, v in parts:
                    cb = cbs[k]
                    cols = [c for _, cs in self.critic.loss_columns([cb], names) for c in cs]
                    target = ValueTargets(values[k], cb.column_targets(ret, names))
                    loss, clipfrac = self._value_loss(cb, target, rows, cols, values=v)
                    share = len(rows) / len(cb.episode_ids)  # the logs: the whole batch's means, as one loss has
                    sums[(k, "loss")] += float(loss.detach()) * share
                    sums[(k, "clipfrac")] += float(clipfrac) * share
                    finite = finite and bool(torch.isfinite(loss.detach()))
                    # (the update's order: vf_coef x loss x rows / pairs, its micro-batch weight being 1 here)
                    total = total + args.vf_coef * loss * len(rows) / played
                # Backpropagated even when non-finite (the update then drops the step, as it does for its losses).
                if parts:
                    self.accelerator.backward(total)
        logs = defaultdict(list)
        for k, cb in enumerate(cbs):
            if (k, "loss") in sums:
                _log_value_loss(logs, cb, sums[(k, "loss")], sums[(k, "clipfrac")])
        values = [torch.zeros(0, 1) if v is None else v for v in values]  # (a batch without rows: none valued)
        return values, CriticStep(dict(logs), finite)

    def _scored_turn(self, a: str, at, plan: IterationPlan) -> PPOTurn:
        """One agent's turn with its old and reference log-probs and per-token KL (no advantages yet). Without old
        log-probs where the update's first forward gives them (`plan.old_logprobs_from_update`)."""
        if plan.old_logprobs_from_update.on:
            return PPOTurn(at)
        g = at.gen
        old = g.sampled_logprobs if plan.old_logprobs_from_sampler.on else None
        old, ref = self._old_and_ref_logprobs(a, at, old)
        if ref is None:
            return PPOTurn(at, old_logprobs=old)
        kl = alg.kl_per_token(old, ref, self.args.kl_estimator).masked_fill(~g.response_mask, 0)
        return PPOTurn(at, old_logprobs=old, ref_logprobs=ref, kl=kl)

    def _old_and_ref_logprobs(self, a: str, at, sampled=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The sampling policy's log-probs of the turn's tokens (`sampled`: recorded while sampling, else a scoring
        forward) and the reference's (None without a KL term)."""
        g = at.gen
        old = sampled if sampled is not None else self.chunked_logprobs(a, g)
        if self.args.kl_coef == 0 or not self.team.has_reference(a):
            return old, None
        return old, self.chunked_logprobs(a, g, reference=True)

    def _scoring_metrics(self, roll: Rollout, scores, kl_seq, logp_seq) -> dict:
        """The batch's objective (TRL PPO's names) and the episode metrics; `logp_seq` None: the old log-probs come
        from the update's first forward, and so does the entropy (`update`)."""
        kl_coef, played = self.args.kl_coef, roll.turn_mask.unsqueeze(-1)
        metrics = {
            "objective/kl": float(kl_seq.sum((1, 2)).mean()),
            **({} if logp_seq is None else {"objective/entropy": float((-logp_seq).sum((1, 2)).mean())}),
            "objective/non_score_reward": float((-kl_coef * kl_seq).sum((1, 2)).mean()),
            "objective/scores": float((scores * played).sum(1).mean()),
            "objective/rlhf_reward": float((scores * played).sum(1).mean() - kl_coef * kl_seq.sum((1, 2)).mean()),
        }
        agent_scores = (roll.rewards * played).sum(1)  # (E, n): the env's rewards, before the EOS penalty
        metrics.update(self._episode_metrics(agent_scores, float(roll.turn_mask.float().sum(1).mean()), roll.turns))
        for i, a in enumerate(self.team.names):
            metrics[f"{a}/objective/kl"] = float(kl_seq[:, :, i].sum(1).mean())
        return metrics

    # ------------------------------------------------------------------ update
    def training_iteration(self, rows: list[dict]) -> dict:
        plan = self.plan_iteration(len(rows) * self.args.num_turns)  # trainers/plan.py: this iteration's shortcuts
        roll = self.rollout(rows, keep_prompt_graph=plan.reuse_rollout_prefill.on)
        scored = self.score_rollout(roll, plan, critic_step=True)
        if self.value_rms is not None:
            self.value_rms.update(scored.advantages.returns)
        self.model.train()
        metrics = dict(scored.metrics)
        metrics.update(self.update(scored))
        metrics.update(self._critic_diagnostics(scored))
        return metrics

    def update(self, scored: ScoredRollout) -> dict:
        """The update's optimizer steps and what it logs; where the old log-probs come from its first forward, the
        batch's entropy too (`objective/entropy`, from those log-probs)."""
        args = self.args
        pairs = scored.rollout.turn_mask.nonzero()  # (P, 2): (episode, turn) pairs that were played
        logs = self.run_updates(scored, pairs, args.num_ppo_epochs, args.critic_updates == "per_agent")
        if scored.critic_step is not None:
            for key, vals in scored.critic_step.logs.items():
                logs[key].extend(vals)
        first = logs.pop("first_logprobs", None)
        out = {key: float(torch.tensor(vals).mean()) for key, vals in logs.items()}
        ratios = logs.get("val/ratio", [])
        out["val/ratio_var"] = float(torch.tensor(ratios).var()) if len(ratios) > 1 else 0.0
        if first is not None:
            out["objective/entropy"] = _entropy_of_first_forwards(scored, first)
        return out

    def step_losses(self, scored: ScoredRollout, mpairs: torch.Tensor, agents: list[str], logs):
        """The agents' policy losses, then vf_coef x the critic losses on the same (episode, turn) pairs (none where
        scoring backpropagated them: `scored.critic_step`)."""
        for a, st, rows in self.agent_rows(scored.turns, mpairs, agents):
            yield self._policy_loss(a, st, rows, logs), len(rows)
        if scored.critic_step is None:
            yield from self._value_losses(scored, mpairs, agents, logs)

    def _value_losses(self, scored: ScoredRollout, mpairs: torch.Tensor, agents: list[str], logs):
        """vf_coef x the critic losses of the `agents` on the step's pairs; critic batch k is paired with its targets
        by k."""
        for k, cb in enumerate(scored.critic_batches):
            for _, cols in self.critic.loss_columns([cb], agents):
                rows = _rows_of(cb.episode_ids, mpairs[mpairs[:, 1] == cb.turn][:, 0])
                if len(rows):
                    loss, clipfrac = self._value_loss(cb, scored.advantages.targets[k], rows, cols)
                    _log_value_loss(logs, cb, float(loss.detach()), float(clipfrac))
                    yield self.args.vf_coef * loss, len(rows)

    def _policy_loss(self, a: str, st: PPOTurn, rows: torch.Tensor, logs) -> torch.Tensor:
        args = self.args
        g = st.gen
        mask = g.response_mask[rows]
        new, ent = self.update_logprobs(a, g, rows, mask)
        if st.old_logprobs is None:  # plan.old_logprobs_from_update: the current ones, detached (as TRL does)
            old = new.detach()
            logs["first_logprobs"].append(((st.turn.turn, a), rows, old))
        else:
            old = st.old_logprobs[rows]
        adv = st.advantages[rows].to(new.device)
        weights = self.importance_weights(a, g, rows, old, mask, logs)
        if args.policy_loss_type == "reinforce":
            loss = alg.policy_loss_reinforce(new, adv, mask, weights)
            ratio = torch.exp((new - old).masked_fill(~mask, 0))
            stats = {
                "clipfrac": torch.tensor(0.0),
                "approxkl": 0.5 * alg.masked_mean((new - old) ** 2, mask),
                "ratio_mean": alg.masked_mean(ratio, mask),
            }
        else:
            loss, stats = alg.policy_loss_clipped(new, old, adv, mask, args.cliprange, weights)
        ent_mean = alg.masked_mean(ent, mask)
        logged = (
            ("policy/approxkl_avg", stats["approxkl"]),
            ("policy/clipfrac_avg", stats["clipfrac"]),
            ("loss/policy_avg", loss),
            ("policy/entropy_avg", ent_mean),
            ("val/ratio", stats["ratio_mean"]),
        )
        for key, val in logged:
            logs[key].append(float(val.detach()))
            logs[f"{a}/{key}"].append(float(val.detach()))
        return loss

    def _value_loss(
        self, cb: CriticBatch, target: ValueTargets, rows: torch.Tensor, cols: list[int], values=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The clipped value loss of batch `cb`'s `rows` on columns `cols` (a mean), and its clip fraction. `values`:
        the rows' values when the caller has them with gradients, else a critic forward here."""
        args = self.args
        if values is None:
            values = self.critic.values(cb, self.accelerator.device, rows)
        old = target.old_values[rows].to(values.device)
        ret = target.returns[rows].to(values.device)
        if self.value_rms is not None:
            old, ret = self.value_rms.normalize(old), self.value_rms.normalize(ret)
        if target.mask is not None:  # token-level
            mask = target.mask[rows].to(values.device)
        else:
            mask = torch.zeros_like(values, dtype=torch.bool)
            mask[:, cols] = True
        loss, stats = alg.value_loss_clipped(values, old, ret, mask, args.cliprange_value)
        return loss, stats["clipfrac"]

    def _critic_diagnostics(self, scored: ScoredRollout) -> dict:
        """Explained variance per agent, value mean, raw advantage mean/std."""
        s = scored.advantages
        out = {
            "critic/value_mean": float(s.values.mean()),
            "critic/return_mean": float(s.returns.mean()),
            "critic/advantage_mean": float(s.raw_advantages.mean()),
            "critic/advantage_std": float(s.raw_advantages.std()) if s.raw_advantages.numel() > 1 else 0.0,
        }
        if s.value_table is not None:  # turn-level
            mask = scored.rollout.turn_mask
            for i, a in enumerate(self.team.names):
                out[f"{a}/critic/explained_variance"] = explained_variance(
                    s.value_table[:, :, i], s.return_table[:, :, i], mask
                )
                out[f"{a}/critic/value_mean"] = float(s.value_table[:, :, i][mask].mean())
        return out


def _log_value_loss(logs, cb: CriticBatch, loss: float, clipfrac: float) -> None:
    """What the update logs of one critic batch's value loss (the scoring pass's critic step logs the same keys)."""
    logs["loss/value_avg"].append(loss)
    logs["val/clipfrac_avg"].append(clipfrac)
    logs[f"critic/{cb.key}/loss"].append(loss)


def _entropy_of_first_forwards(scored: ScoredRollout, first: list) -> float:
    """The batch's entropy estimate as scoring computes it (minus the sampled tokens' log-probs, summed per
    episode), from the update's first forwards: `first` holds ((turn, agent), rows, log-probs) per policy loss, put
    back in place per turn and agent and summed in the scoring pass's order (the same float)."""
    pieces = defaultdict(list)
    for key, rows, logp in first:
        pieces[key].append((rows, logp))
    total = 0
    for t, turn in enumerate(scored.turns):
        for a, st in turn.items():
            full = torch.zeros(st.gen.response_ids.shape, device=st.gen.response_ids.device)
            for rows, logp in pieces[(t, a)]:
                full[rows] = logp
            total = total + -full.sum()
    return float(total) / scored.rollout.num_episodes
