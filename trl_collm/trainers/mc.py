"""MultiAgentMCTrainer: the Monte-Carlo, critic-free team baseline (group baselines, MAGRPO-style).

One iteration:
1. sample: G completions per agent per prompt, joint actions index-aligned (multi-turn: tree expansion or G
   independent branches) or as a capped cross product (single turn), `rollout.run_tree` / `run_cross`;
2. returns: a node's reward plus gamma times the mean return of its children; advantages: return minus a baseline
   of its group (the G siblings: same prompt or parent node, same agent, same turn), optionally std-scaled;
3. update: REINFORCE on the summed log-probability of every completion token (on-policy), or a clipped ratio
   surrogate over `num_iterations` with an optional KL to the reference; the agents' losses are summed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .. import algorithms as alg
from ..envs.reward_functions import per_agent
from ..rollout import SampleTree, run_cross, run_tree
from .base import TeamTrainerBase
from .grpo_metrics import CompletionPrinter, clip_metrics, completion_metrics, completions_text, reward_metrics
from .mc_config import GRPO_LOSS_TYPES, MultiAgentMCConfig
from .scored import ScoredTurn


@dataclass
class MCTurn(ScoredTurn):
    """A scored turn of the MC trainer."""

    sample_mask: torch.Tensor | None = None  # (B,) cross mode: the samples that took part in a joint action


@dataclass
class MCAdvantages:
    """What `advantages` returns: per turn, (N_t, n) advantages and the (N_t, n) returns they came from."""

    advantages: list[torch.Tensor]
    returns: list[torch.Tensor]


@dataclass
class ScoredTree:
    """A sampled tree scored for the update."""

    tree: SampleTree
    turns: list[dict[str, MCTurn]]  # turns[t][agent]
    advantages: MCAdvantages


class MultiAgentMCTrainer(TeamTrainerBase):
    """Critic-free multi-agent trainer (MAGRPO and its variants): each agent samples `args.num_generations`
    completions per prompt, and a sample's advantage is its return minus the group's baseline (`args.baseline`);
    no value model. The constructor is
    `MultiAgentPPOTrainer`'s without the critic's arguments.

    Example:

    ```python
    >>> from datasets import Dataset
    >>> from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer

    >>> def reward(prompts, completions, **columns):  # completions[e]: [agent_0's text, agent_1's text]
    ...     return [float(len(a) < len(b)) for a, b in completions]

    >>> args = MultiAgentMCConfig(output_dir="team", num_agents=2, num_generations=4)
    >>> trainer = MultiAgentMCTrainer(
    ...     args=args,
    ...     model=["Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B"],  # one model per agent
    ...     train_dataset=Dataset.from_dict({"prompt": ["Summarize: ..."] * 16}),
    ...     reward_funcs=reward,
    ... )
    >>> trainer.train()
    ```

    Args:
        args ([`MultiAgentMCConfig`], *optional*):
            The run's configuration. `None`: `MultiAgentMCConfig(output_dir="outputs/mc")`.
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
        prompt_formatters (callable, list or dict name -> callable, *optional*):
            With `reward_funcs`: each agent's prompt built from the dataset row (`row -> str`), one for all agents or
            one per agent. `None`: every agent reads the row's `prompt` (or `input_ids`).
        quantization_config (*optional*):
            GRPOTrainer's argument: passed to `from_pretrained` with `args.model_init_kwargs` for models given as
            paths.
    """

    _tag_names = ["trl", "trl-collm", "multi-agent", "magrpo"]
    _name = "MultiAgentMC"
    _paper = {
        "title": "LLM Collaboration With Multi-Agent Reinforcement Learning",
        "id": "2508.04652",
        "citation": (
            "@article{liu2025magrpo, title={LLM Collaboration With Multi-Agent Reinforcement Learning}, "
            "author={Liu, Shuo and Liang, Zeyu and Lyu, Xueguang and Amato, Christopher}, journal={arXiv:2508.04652}, "
            "year={2025}}"
        ),
    }

    def __init__(
        self,
        args: MultiAgentMCConfig | None = None,
        processing_class=None,
        model=None,
        ref_model=None,
        reward_model=None,
        train_dataset=None,
        data_collator=None,
        eval_dataset=None,
        optimizers=(None, None),
        callbacks=None,
        peft_config=None,
        reward_funcs=None,
        env=None,
        prompt_formatters=None,
        quantization_config=None,
    ):
        args = args or MultiAgentMCConfig(output_dir="outputs/mc")
        if not isinstance(args, MultiAgentMCConfig):
            raise TypeError(f"`args` must be a MultiAgentMCConfig, got {type(args).__name__}.")
        if quantization_config is not None:  # as GRPOTrainer: one more from_pretrained keyword
            args.model_init_kwargs = {**(args.model_init_kwargs or {}), "quantization_config": quantization_config}
        if reward_funcs is not None and _one_agent(args, model):  # GRPO's contract: one completion per sample
            funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
            reward_funcs = [
                f if not callable(f) or getattr(f, "scores_per_agent", False) else per_agent(f) for f in funcs
            ]
        super().__init__(
            args=args,
            processing_class=processing_class,
            model=model,
            ref_model=ref_model,
            reward_model=reward_model,
            train_dataset=train_dataset,
            data_collator=data_collator,
            eval_dataset=eval_dataset,
            optimizers=optimizers,
            callbacks=callbacks,
            peft_config=peft_config,
            reward_funcs=reward_funcs,
            env=env,
            prompt_formatters=prompt_formatters,
        )
        self._generator = torch.Generator().manual_seed(args.seed)
        self.num_tokens = 0  # GRPO's num_tokens: prompt and completion tokens seen so far
        self.completions_to_log = None
        if args.log_completions:
            self.add_callback(CompletionPrinter(self))

    def checkpoint_state(self) -> dict:
        return {"generator": self._generator.get_state(), "num_tokens": self.num_tokens}

    def load_checkpoint_state(self, state: dict) -> None:
        if "generator" in state:
            self._generator.set_state(state["generator"])
        self.num_tokens = int(state.get("num_tokens", 0))

    def plan_facts(self, num_pairs: float):
        """The base's facts and this iteration's optimizer steps (MC's old log-prob decision reads them)."""
        return dataclasses.replace(super().plan_facts(num_pairs), optimizer_steps=self.optimizer_steps_per_iteration())

    def optimizer_steps_per_iteration(self) -> int:
        args = self.args
        groups = len(self.team.names) * args.num_turns if args.update_schedule == "per_agent_turn" else 1
        return args.num_iterations * args.num_mini_batches * groups

    def micro_batch_rows(self) -> int:
        """MC's rows are samples and `per_device_train_batch_size` counts prompts: a part holds the G samples of each
        of those prompts (what one iteration samples per agent and turn in aligned mode), not G times fewer. Lower
        `per_device_train_batch_size` (and raise `gradient_accumulation_steps`) for smaller parts."""
        return max(1, self.args.per_device_train_batch_size * self.args.num_generations)

    # ------------------------------------------------------------------ sampling
    def sample(self, rows: list[dict]) -> SampleTree:
        args = self.args
        self.model.eval()
        sampler = self.sampler_for_step()
        # (sample, turn) pairs of the update: G samples per row in one turn; a tree's later turns branch further
        samples = len(rows) * args.num_generations if args.num_turns == 1 else float("inf")
        if self.plan_iteration(samples).reuse_rollout_prefill.on:  # trainers/plan.py
            sampler = dataclasses.replace(sampler, keep_prompt_graph=True)
        if args.joint_mode == "cross":
            return run_cross(
                sampler, self.env, rows, args.num_generations, args.max_joint_combinations, self._generator
            )
        return run_tree(
            sampler,
            self.env,
            rows,
            args.num_turns,
            args.num_generations,
            args.expansion,
            early_termination_threshold=args.early_termination_threshold,
        )

    def advantages(self, tree: SampleTree) -> MCAdvantages:
        """Per turn, (N_t, n) advantages: return minus the baseline of the node's group, per agent."""
        args = self.args
        rewards = tree.rewards
        if args.missing_eos_penalty is not None:  # as TRL: a completion that never stopped scores less
            rewards = [
                r
                - args.missing_eos_penalty
                * torch.stack([(~turn[a].gen.ended).float().cpu() for a in tree.agent_names], dim=-1)
                for r, turn in zip(rewards, tree.turns)
            ]
        returns = tree.returns(args.gamma, rewards)
        out = []
        for t, ret in enumerate(returns):
            mask = tree.credit_mask[t] if tree.credit_mask is not None else torch.ones_like(ret, dtype=torch.bool)
            adv = torch.stack(
                [_group_advantages(args, ret[:, i], tree.groups[t], mask[:, i]) for i in range(ret.shape[1])], -1
            )
            out.append(adv)
        return MCAdvantages(out, returns)

    # ------------------------------------------------------------------ the iteration
    def training_iteration(self, rows: list[dict]) -> dict:
        return self.learn(self.sample(rows))

    def learn(self, tree: SampleTree) -> dict:
        """Advantages, (old / reference log-probs when needed) and the update, for one sampled tree."""
        scored = self.score_tree(tree)
        pairs = [
            torch.stack([torch.arange(len(ids)), torch.full((len(ids),), t)], -1)
            for t, ids in enumerate(turn[self.team.names[0]].episode_ids for turn in scored.turns)
        ]
        self.model.train()
        args = self.args
        logs = self.run_updates(scored, torch.cat(pairs), args.num_iterations, args.update_schedule == "per_agent_turn")
        metrics = {key: float(torch.tensor(vals).mean()) for key, vals in logs.items()}
        for key in ("clip_ratio/low_min", "clip_ratio/high_max"):  # GRPO logs the extremes, not the mean
            if key in logs:
                metrics[key] = float(min(logs[key]) if key.endswith("min") else max(logs[key]))
        metrics.update(self._rollout_metrics(scored))
        metrics.update(self._grpo_rollout_metrics(scored))
        if "loss/policy_avg" in metrics:  # GRPO's (transformers') name of the training loss
            metrics["loss"] = metrics["loss/policy_avg"]
        return metrics

    def _grpo_rollout_metrics(self, scored: ScoredTree) -> dict:
        """GRPO's names for the rollout (trainers/grpo_metrics.py); keeps log_completions' text."""
        tree = scored.tree
        out, tokens = completion_metrics(tree.turns, self.team.names)
        self.num_tokens += tokens
        out["num_tokens"] = float(self.num_tokens)
        if self.lr_scheduler is not None:  # transformers' name, which GRPO logs (ours: lr)
            out["learning_rate"] = self.lr_scheduler.get_last_lr()[0]
        components = getattr(self.env, "last_reward_components", None) if tree.num_turns == 1 else None
        out.update(reward_metrics(tree.rewards[0], tree.groups[0], components))
        if self.args.log_completions:
            self.completions_to_log = completions_text(
                tree, scored.advantages.advantages, self.args.num_completions_to_print or 4
            )
        return out

    @torch.no_grad()
    def score_tree(self, tree: SampleTree) -> ScoredTree:
        """Advantages per sample, and the old / reference log-probs the loss needs."""
        args, names = self.args, self.team.names
        advantages = self.advantages(tree)
        # Whether the loss takes the update's own log-probs (or reads none), and why: trainers/plan.py. A tree sampled
        # elsewhere (a test's) gets a plan here; this decision reads no pair count.
        plan = self.plan if self.plan is not None else self.plan_iteration(float("inf"))
        need_old = not plan.old_logprobs_from_update.on
        turns = []
        for t, turn in enumerate(tree.turns):
            scored = {}
            for i, a in enumerate(names):
                at = turn[a]
                scored[a] = MCTurn(
                    at,
                    advantages=advantages.advantages[t][:, i],
                    sample_mask=tree.credit_mask[t][:, i] if tree.credit_mask is not None else None,
                    old_logprobs=self.chunked_logprobs(a, at.gen) if need_old else None,
                    ref_logprobs=self.chunked_logprobs(a, at.gen, reference=True) if args.beta != 0 else None,
                )
            turns.append(scored)
        return ScoredTree(tree, turns, advantages)

    def _corrects_importance(self) -> bool:
        return bool(self.args.use_vllm and self.args.vllm_importance_sampling_correction)

    def step_losses(self, scored: ScoredTree, mpairs: torch.Tensor, agents: list[str], logs):
        """The agents' policy losses (no critic)."""
        for a, st, rows in self.agent_rows(scored.turns, mpairs, agents):
            yield self._policy_loss(a, st, rows, logs), len(rows)

    def _accumulate(self, scored, pairs: torch.Tensor, agents: list[str], logs, micro: int):
        """loss_type='dapo' divides by the tokens of the whole minibatch (each agent's own, summed over processes and
        divided by their number, as GRPO's num_items_in_batch): counted here, before its micro-batches."""
        if self.args.loss_type == "dapo":
            tokens = {}
            for a in agents:
                n = sum(self._loss_mask(st, rows).sum() for _, st, rows in self.agent_rows(scored.turns, pairs, [a]))
                n = torch.as_tensor(n, dtype=torch.float32, device=self.accelerator.device)
                if self.accelerator.num_processes > 1:
                    n = self.accelerator.reduce(n, reduction="sum") / self.accelerator.num_processes
                tokens[a] = n
            self._dapo_tokens = (len(pairs), tokens)
        return super()._accumulate(scored, pairs, agents, logs, micro)

    def _loss_mask(self, at: MCTurn, rows: torch.Tensor) -> torch.Tensor:
        """The response tokens of `rows` that carry the loss."""
        mask = at.gen.response_mask[rows]
        if at.sample_mask is not None:  # cross mode: samples that took part in no joint action carry no signal
            mask = mask & at.sample_mask[rows].to(mask.device).unsqueeze(-1)
        if self.args.mask_truncated_completions:  # as GRPO: a completion cut at the length limit carries no loss
            mask = mask & at.gen.ended[rows].to(mask.device).unsqueeze(-1)
        return mask

    def _grpo_loss(self, a: str, at: MCTurn, rows, new, mask, weights, logs) -> torch.Tensor:
        """GRPO's loss (`loss_type` grpo / bnpo / dr_grpo / dapo) of agent `a`'s `rows`, a mean over those rows as
        `step_losses` yields (dapo: scaled so that the minibatch's backward is its token sum over its tokens)."""
        args = self.args
        old = new.detach() if at.old_logprobs is None else at.old_logprobs[rows].to(new.device)
        per_token, st = alg.grpo_token_loss(
            new,
            old,
            at.advantages[rows].to(new.device),
            mask,
            args.epsilon,
            args.epsilon if args.epsilon_high is None else args.epsilon_high,
            args.delta,
            weights,
            at.ref_logprobs[rows] if args.beta != 0 else None,
            args.beta,
            args.kl_estimator,
            args.use_bias_correction_kl,
        )
        if args.loss_type == "dapo":
            pairs, tokens = self._dapo_tokens
            loss = alg.normalised_token_loss(per_token, mask, "dapo", num_tokens=tokens[a]) * (pairs / len(rows))
        else:
            loss = alg.normalised_token_loss(per_token, mask, args.loss_type, args.response_length)
        clip_metrics(st, mask, logs)
        if args.beta != 0:
            kl = alg.masked_mean(st["kl"], mask)
            logs["objective/kl"].append(float(kl))
            logs["kl"].append(float(kl))
        return loss

    def _policy_loss(self, a: str, at: MCTurn, rows: torch.Tensor, logs) -> torch.Tensor:
        args = self.args
        g = at.gen
        mask = self._loss_mask(at, rows)
        new, ent = self.update_logprobs(a, g, rows, mask)
        adv = at.advantages[rows].to(new.device)
        weights = (
            self.importance_weights(a, g, rows, at.old_logprobs[rows], mask, logs)
            if self._corrects_importance()
            else None
        )
        logs["entropy"].append(float(alg.masked_mean(ent, mask).detach()))
        if args.loss_type in GRPO_LOSS_TYPES:
            loss = self._grpo_loss(a, at, rows, new, mask, weights, logs)
            clipfrac = torch.tensor(logs["clip_ratio/region_mean"][-1])
        elif args.loss_type == "reinforce":
            loss = alg.policy_loss_reinforce(new, adv, mask, weights)
            clipfrac = torch.tensor(0.0)
        else:
            loss, st = alg.policy_loss_clipped(new, at.old_logprobs[rows], adv, mask, args.epsilon, weights)
            clipfrac = st["clipfrac"]
        if args.beta != 0 and args.loss_type not in GRPO_LOSS_TYPES:
            kl = alg.masked_mean(alg.kl_per_token(new, at.ref_logprobs[rows], args.kl_estimator), mask)
            loss = loss + args.beta * kl
            logs["objective/kl"].append(float(kl.detach()))
            logs["kl"].append(float(kl.detach()))
        for key, val in (
            ("loss/policy_avg", loss),
            ("policy/entropy_avg", alg.masked_mean(ent, mask)),
            ("policy/clipfrac_avg", clipfrac),
        ):
            logs[key].append(float(val.detach()))
            logs[f"{a}/{key}"].append(float(val.detach()))
        return loss

    def _rollout_metrics(self, scored: ScoredTree) -> dict:
        names, tree, returns = self.team.names, scored.tree, scored.advantages.returns
        first = tree.rewards[0]
        root_returns = returns[0]
        out = {
            # mean over the prompts' first-turn samples of the (tree) return: the team's expected return
            "objective/scores": float(root_returns.mean()),
            "mc/nodes": float(sum(len(r) for r in tree.rewards)),
        }
        for t, rew in enumerate(tree.rewards):
            out[f"turn_{t + 1}/reward_mean"] = float(rew.mean())
            out[f"turn_{t + 1}/return_mean"] = float(returns[t].mean())
        # MC logs the first turn's response lengths (length_turns)
        out.update(self._episode_metrics(root_returns, float(len(tree.turns)), tree.turns, tree.turns[:1]))
        for i, a in enumerate(names):
            out[f"{a}/reward_mean"] = float(first[:, i].mean())
        return out


def _one_agent(args: MultiAgentMCConfig, model) -> bool:
    """A team of one agent by construction (one model, no second name): its reward functions are GRPO's, scoring
    one completion per sample (`per_agent`), not the list of one text a team's function reads."""
    if isinstance(model, (list, tuple, dict)):
        return len(model) == 1
    return args.num_agents in (None, 1) and (args.agent_names is None or len(args.agent_names) == 1)


def _group_advantages(args, returns: torch.Tensor, groups: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One agent's advantages at one turn: return minus its group's baseline, scaled as scale_advantages (ours) or
    scale_rewards (GRPO's) says."""
    scale_rewards = getattr(args, "scale_rewards", None)
    if scale_rewards is None:
        return alg.group_advantages(returns, groups, mask, args.baseline, args.scale_advantages)
    return alg.grpo_scaled_advantages(returns, groups, mask, args.baseline, scale_rewards)
