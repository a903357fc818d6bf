"""MultiAgentPPOTrainer: actor-critic for n agents with a centralized (CoLLM-CC) or per-agent (CoLLM-DC) critic.

One iteration:
1. roll out a batch of episodes (shared runner, `rollout.py`);
2. score it without gradients: old / reference log-probs, critic values, rewards (+ KL, missing-EOS penalty),
   advantages and returns (GAE over turns, or over tokens as TRL's PPO);
3. update: PPO epochs x minibatches, each a sum of the agents' policy losses + vf_coef * critic loss and one
   optimizer step (or, with `critic_updates="per_agent"`, the reference code's schedule: one step per agent and turn).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from .. import algorithms as alg
from ..configs import MultiAgentPPOConfig
from ..rollout import AgentTurn, Rollout
from ..views import centralized_view, decentralized_view
from .base import TeamTrainerBase, _chunked, _rows_of


@dataclass
class CriticBatch:
    """Critic inputs and targets for one (turn, critic, target) group of rows."""

    key: str  # critic unit
    turn: int
    agents: list[str]  # agents whose values the output columns hold (len k), or the one agent valued
    episode_ids: torch.Tensor  # (B,)
    views: list[str]
    suffix_ids: list[list[int]] | None  # token-level: the agent's response tokens appended to the view
    old_values: torch.Tensor | None = None  # (B, k) turn-level or (B, Lr) token-level
    returns: torch.Tensor | None = None
    mask: torch.Tensor | None = None  # (B, Lr) token-level
    view_ids: list[list[int]] | None = None  # the views tokenized by the critic (filled on first use)


class MultiAgentPPOTrainer(TeamTrainerBase):
    """Multi-agent PPO. With one model and no team options it behaves as TRL's last `PPOTrainer`."""

    _tag_names = ["trl", "trl-collm", "ppo", "multi-agent", "collm"]
    _name = "MultiAgentPPO"
    _paper = {
        "title": "Learning Decentralized LLM Collaboration with Multi-Agent Actor Critic",
        "id": "2601.21972",
        "citation": "@inproceedings{liu2026collm, title={Learning Decentralized LLM Collaboration with Multi-Agent Actor Critic}, "
        "author={Liu, Shuo and Chen, Tianle and Amiri, Ryan and Amato, Christopher}, booktitle={ICML}, year={2026}}",
    }

    def __init__(self, args: MultiAgentPPOConfig | None = None, processing_class=None, model=None, ref_model=None,
                 reward_model=None, train_dataset=None, value_model=None, data_collator=None, eval_dataset=None,
                 optimizers=(None, None), callbacks=None, peft_config=None, reward_funcs=None, env=None, **kwargs):
        args = args or MultiAgentPPOConfig(output_dir="outputs/ppo")
        super().__init__(args, processing_class, model, ref_model, reward_model, train_dataset, value_model, data_collator,
                         eval_dataset, optimizers, callbacks, peft_config, reward_funcs, env, **kwargs)
        self.value_rms = alg.RunningMeanStd() if args.value_normalization else None

    # ------------------------------------------------------------------ schedule
    def optimizer_steps_per_iteration(self) -> int:
        args = self.args
        groups = len(self.team.names) * args.num_turns if args.critic_updates == "per_agent" else 1
        return args.num_ppo_epochs * args.num_mini_batches * groups

    # ------------------------------------------------------------------ views
    def critic_batches(self, roll: Rollout) -> list[CriticBatch]:
        """Which text each critic reads. DC: the agent's own context only. CC: every agent's, tagged by name."""
        args, names = self.args, self.team.names
        token = args.advantage_level == "token"
        out = []
        for t, turn in enumerate(roll.turns):
            ids = turn[names[0]].episode_ids
            if args.critic_type == "decentralized":
                for a in names:
                    views = [decentralized_view(c) for c in turn[a].contexts]
                    out.append(CriticBatch(a, t, [a], ids, views, _suffix(turn[a]) if token else None))
                continue
            joint = [[turn[a].contexts[k] for a in names] for k in range(len(ids))]
            actions = [[turn[a].gen.texts[k] for a in names] for k in range(len(ids))] if args.critic_sees_joint_action else None

            def view(k, target=None):
                return centralized_view(names, joint[k], actions[k] if actions else None, target)

            if args.centralized_value == "agent_tagged" or token:
                for a in names:
                    tag = a if args.centralized_value == "agent_tagged" else None
                    out.append(CriticBatch("central", t, [a], ids, [view(k, tag) for k in range(len(ids))], _suffix(turn[a]) if token else None))
            else:
                cols = list(names) if args.centralized_value == "per_agent_heads" else ["*team*"]
                out.append(CriticBatch("central", t, cols, ids, [view(k) for k in range(len(ids))], None))
        return out

    def _critic_forward(self, cb: CriticBatch, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Values (B, k) at the end of the view (turn-level) or (B, Lr) per response token (token-level)."""
        unit = self.critic.units[cb.key]
        if cb.view_ids is None:  # tokenized once per iteration: the scoring pass and every update step reuse it
            cb.view_ids = unit.tokenize(cb.views)
        sel = range(len(cb.views)) if rows is None else rows.tolist()
        suffix = [cb.suffix_ids[i] for i in sel] if cb.suffix_ids is not None else None
        ids, mask = unit.pad([cb.view_ids[i] for i in sel], self.accelerator.device, suffix_ids=suffix)
        if suffix is None:
            return unit(ids, mask, keep=1)[:, -1, :]
        col = self.critic.output_index(cb.agents[0])
        lr = max(len(s) for s in suffix)
        # Left padding puts every suffix at the right end; value of the state before token j sits at L - lr - 1 + j.
        return unit(ids, mask, keep=lr + 1)[:, :-1, col]

    # ------------------------------------------------------------------ scoring (no grad)
    @torch.no_grad()
    def score_rollout(self, roll: Rollout):
        args, team, names = self.args, self.team, self.team.names
        n, E, T = len(names), roll.num_episodes, roll.num_turns
        token = args.advantage_level == "token"
        temp = args.temperature if args.scale_logits_by_temperature else 1.0
        stats = defaultdict(list)
        rewards = roll.rewards.clone()  # (E, T, n)
        kl_seq = torch.zeros(E, T, n)
        logp_seq = torch.zeros(E, T, n)
        chunk = args.local_rollout_forward_batch_size
        defer = self._defer_old_logprobs()
        for t, turn in enumerate(roll.turns):
            for i, a in enumerate(names):
                at = turn[a]
                g = at.gen
                stats[f"{a}/num_eos_tokens"].append(float(g.ended.float().sum()))
                stats[f"{a}/response_length"].append(float(g.response_mask.float().sum(-1).mean()))
                if args.missing_eos_penalty is not None:
                    rewards[at.episode_ids, t, i] -= args.missing_eos_penalty * (~g.ended).float().cpu()
                at.ref_logprobs = None
                at.old_deferred = defer
                if defer:  # filled row by row by the update's own forward (see _defer_old_logprobs)
                    at.old_logprobs = torch.zeros(g.response_ids.shape, device=g.response_ids.device)
                    continue
                old = _chunked(lambda s: team.logprobs(a, g.query_ids[s], g.query_mask[s], g.response_ids[s], g.response_mask[s], temp)[0], len(at.episode_ids), chunk)
                at.old_logprobs = old
                if args.kl_coef != 0 and team.has_reference(a):
                    ref = _chunked(lambda s: team.logprobs(a, g.query_ids[s], g.query_mask[s], g.response_ids[s], g.response_mask[s], temp, reference=True)[0], len(at.episode_ids), chunk)
                    at.ref_logprobs = ref
                    kl = alg.kl_per_token(old, ref, args.kl_estimator).masked_fill(~g.response_mask, 0)
                    at.kl = kl
                    kl_seq[at.episode_ids, t, i] = kl.sum(-1).cpu()
                logp_seq[at.episode_ids, t, i] = old.sum(-1).cpu()
        scores = rewards.clone()  # environment reward after the EOS penalty, before KL
        cbs = self.critic_batches(roll)
        if token:
            self._token_advantages(roll, cbs, scores)
        else:
            self._turn_advantages(roll, cbs, rewards - args.kl_coef * kl_seq)
        ep_return = (roll.rewards * roll.turn_mask.unsqueeze(-1)).sum(1)  # (E, n)
        metrics = {
            "objective/kl": float(kl_seq.sum((1, 2)).mean()),
            "objective/entropy": None if defer else float((-logp_seq).sum((1, 2)).mean()),
            "objective/non_score_reward": float((-args.kl_coef * kl_seq).sum((1, 2)).mean()),
            "objective/scores": float((scores * roll.turn_mask.unsqueeze(-1)).sum(1).mean()),
            "objective/rlhf_reward": float((scores * roll.turn_mask.unsqueeze(-1)).sum(1).mean() - args.kl_coef * kl_seq.sum((1, 2)).mean()),
            "objective/turns": float(roll.turn_mask.float().sum(1).mean()),
            "val/num_eos_tokens": float(sum(sum(stats[f"{a}/num_eos_tokens"]) for a in names)),
        }
        for i, a in enumerate(names):
            metrics[f"{a}/objective/scores"] = float(ep_return[:, i].mean())
            metrics[f"{a}/objective/kl"] = float(kl_seq[:, :, i].sum(1).mean())
            metrics[f"{a}/response_length"] = sum(stats[f"{a}/response_length"]) / len(stats[f"{a}/response_length"])
        comps = getattr(self.env, "last_reward_components", None) or {}
        for name, value in comps.items():
            metrics[f"rewards/{name}"] = float(value.float().mean())
        return cbs, metrics

    def _turn_advantages(self, roll: Rollout, cbs: list[CriticBatch], rewards: torch.Tensor):
        """Turn-level GAE: each completion is one action valued at the end of its view."""
        args, names = self.args, self.team.names
        n, E, T = len(names), roll.num_episodes, roll.num_turns
        V = torch.zeros(E, T, n)
        for cb in cbs:
            v = _chunked(lambda s: self._critic_forward(cb, torch.arange(len(cb.views))[s]), len(cb.views), args.local_rollout_forward_batch_size).float().cpu()
            if self.value_rms is not None:
                v = self.value_rms.denormalize(v)
            cb.old_values = v
            for c, a in enumerate(cb.agents):
                if a == "*team*":
                    V[cb.episode_ids, cb.turn, :] = v[:, c : c + 1]
                else:
                    V[cb.episode_ids, cb.turn, names.index(a)] = v[:, c]
        mask = roll.turn_mask
        adv = torch.zeros(E, T, n)
        ret = torch.zeros(E, T, n)
        for i in range(n):
            adv[:, :, i], ret[:, :, i] = alg.gae(rewards[:, :, i], V[:, :, i], mask.float(), args.gamma, args.lam)
        self._stats = {"values": V[mask], "returns": ret[mask], "raw_adv": adv[mask]}
        for cb in cbs:
            cols = [ret[cb.episode_ids, cb.turn].mean(-1) if a == "*team*" else ret[cb.episode_ids, cb.turn, names.index(a)] for a in cb.agents]
            cb.returns = torch.stack(cols, dim=-1)
        adv = self._normalize_advantages(adv, mask)
        for t, turn in enumerate(roll.turns):
            for i, a in enumerate(names):
                turn[a].advantages = adv[turn[a].episode_ids, t, i]
        self._adv_table, self._value_table, self._return_table = adv, V, ret

    def _normalize_advantages(self, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        args = self.args
        if args.advantage_norm_scope == "none":
            return adv
        E, T, n = adv.shape
        agent_id = torch.arange(n).view(1, 1, n).expand(E, T, n)
        turn_id = torch.arange(T).view(1, T, 1).expand(E, T, n)
        groups = {"batch": torch.zeros_like(agent_id), "agent": agent_id, "agent_turn": agent_id * T + turn_id}[args.advantage_norm_scope]
        full_mask = mask.unsqueeze(-1).expand(E, T, n)
        if args.advantage_norm_std_floor is not None:
            return alg.zscore_by_group(adv, groups, full_mask, unbiased=False, std_floor=args.advantage_norm_std_floor)
        return alg.zscore_by_group(adv, groups, full_mask, unbiased=True)

    def _token_advantages(self, roll: Rollout, cbs: list[CriticBatch], scores: torch.Tensor):
        """TRL PPO semantics: per-token values, per-token KL penalty, score at the last response token."""
        args, names = self.args, self.team.names
        turn = roll.turns[0]
        all_values, all_returns, all_adv = [], [], []
        for cb in cbs:
            a = cb.agents[0]
            at = turn[a]
            mask = at.gen.response_mask
            v = _chunked(lambda s: self._critic_forward(cb, torch.arange(len(cb.views))[s]), len(cb.views), args.local_rollout_forward_batch_size).float()
            if self.value_rms is not None:
                v = self.value_rms.denormalize(v)
            v = v.masked_fill(~mask, 0)
            kl = getattr(at, "kl", torch.zeros_like(v))
            r, non_score = alg.token_level_rewards(scores[at.episode_ids, 0, names.index(a)].to(v.device), kl, mask, args.kl_coef)
            if args.whiten_rewards:
                r = alg.whiten(r, mask, shift_mean=False)
            adv, ret = alg.gae(r, v, mask.float(), args.gamma, args.lam)
            cb.old_values, cb.returns, cb.mask = v, ret, mask
            at.token_advantages = adv
            all_values.append(v[mask]), all_returns.append(ret[mask]), all_adv.append(adv[mask])
        self._stats = {"values": torch.cat(all_values).cpu(), "returns": torch.cat(all_returns).cpu(), "raw_adv": torch.cat(all_adv).cpu()}
        scope = args.advantage_norm_scope
        if scope == "batch":
            flat = torch.cat([turn[a].token_advantages[turn[a].gen.response_mask] for a in names])
            mean, std = flat.mean(), flat.std() if flat.numel() > 1 else torch.tensor(1.0)
        for a in names:
            at = turn[a]
            m = at.gen.response_mask
            if scope in ("agent", "agent_turn"):
                at.advantages = alg.whiten(at.token_advantages, m)
            elif scope == "batch":
                at.advantages = ((at.token_advantages - mean) / (std + 1e-8)).masked_fill(~m, 0)
            else:
                at.advantages = at.token_advantages

    # ------------------------------------------------------------------ update
    def training_iteration(self, rows: list[dict]) -> dict:
        roll = self.rollout(rows)
        cbs, metrics = self.score_rollout(roll)
        if self.value_rms is not None:
            self.value_rms.update(self._stats["returns"])
        self.model.train()
        metrics.update(self.update(roll, cbs))
        if metrics["objective/entropy"] is None:  # deferred: the update filled the old log-probs
            metrics["objective/entropy"] = float(sum(-roll.turns[t][a].old_logprobs.sum() for t in range(len(roll.turns))
                                                     for a in self.team.names)) / roll.num_episodes
        metrics.update(self._critic_diagnostics(roll))
        return metrics

    def _defer_old_logprobs(self) -> bool:
        """Skip the scoring pass's log-prob forward when the update's own forward gives the same numbers.

        That holds when every agent's first forward in the update sees the parameters that sampled its tokens: one
        epoch, one minibatch (so each row is seen once), and no earlier optimizer step of the iteration touching that
        agent's weights. With `critic_updates="per_agent"` that rules out several turns (turn t's step changes the
        weights turn t+1 is scored with) and critic heads on actor backbones (another agent's critic step moves the
        backbone). Dropout is disabled in every module (base trainer), so eval and train forwards agree. The KL
        penalty is shaped into the rewards before the update, so it needs the old log-probs up front.
        The reference rule (`preset="collm"`) qualifies: it saves one forward per agent and turn every iteration.
        """
        args = self.args
        if args.num_ppo_epochs != 1 or args.num_mini_batches != 1:
            return False
        if args.kl_coef != 0 and any(self.team.has_reference(a) for a in self.team.names):
            return False
        if args.critic_updates == "per_agent":
            placements = {u.placement for u in self.critic.units.values()}
            if args.num_turns > 1 or "actor_head" in placements:
                return False
        return True

    def update(self, roll: Rollout, cbs: list[CriticBatch]) -> dict:
        args = self.args
        pairs = roll.turn_mask.nonzero()  # (P, 2): (episode, turn) pairs that were played

        def critic_backward(mpairs, agents, weight, logs):
            """vf_coef x the critic loss on the same (episode, turn) pairs, for the critics of `agents`."""
            keys = {self.critic.key_for(a) for a in agents}
            for cb in cbs:
                cols = [c for c, x in enumerate(cb.agents) if x == "*team*" or x in agents]
                if cb.key not in keys or not cols:
                    continue
                rows = _rows_of(cb.episode_ids, mpairs[mpairs[:, 1] == cb.turn][:, 0])
                if len(rows):
                    loss = self._value_loss(cb, rows, cols, logs)
                    self.accelerator.backward(args.vf_coef * loss * weight * len(rows) / len(mpairs))

        logs = self.run_updates(roll.turns, pairs, args.num_ppo_epochs, args.critic_updates == "per_agent", critic_backward)
        out = {key: float(torch.tensor(vals).mean()) for key, vals in logs.items()}
        ratios = logs.get("val/ratio", [])
        out["val/ratio_var"] = float(torch.tensor(ratios).var()) if len(ratios) > 1 else 0.0
        return out

    def _policy_loss(self, a: str, at: AgentTurn, rows: torch.Tensor, logs) -> torch.Tensor:
        args = self.args
        g = at.gen
        temp = args.temperature if args.scale_logits_by_temperature else 1.0
        mask = g.response_mask[rows]
        new, ent = self.team.logprobs(a, g.query_ids[rows], g.query_mask[rows], g.response_ids[rows], mask, temp, with_entropy=True)
        if at.old_deferred:  # see _defer_old_logprobs: this forward is the first with these weights
            at.old_logprobs[rows] = new.detach()
        adv = at.advantages[rows].to(new.device)
        if args.policy_loss_type == "reinforce":
            loss = alg.policy_loss_reinforce(new, adv, mask)
            ratio = torch.exp((new - at.old_logprobs[rows]).masked_fill(~mask, 0))
            st = {"clipfrac": torch.tensor(0.0), "approxkl": 0.5 * alg.masked_mean((new - at.old_logprobs[rows]) ** 2, mask),
                  "ratio_mean": alg.masked_mean(ratio, mask)}
        else:
            loss, st = alg.policy_loss_clipped(new, at.old_logprobs[rows], adv, mask, args.cliprange)
        ent_mean = alg.masked_mean(ent, mask)
        for key, val in (("policy/approxkl_avg", st["approxkl"]), ("policy/clipfrac_avg", st["clipfrac"]),
                         ("loss/policy_avg", loss), ("policy/entropy_avg", ent_mean), ("val/ratio", st["ratio_mean"])):
            logs[key].append(float(val.detach()))
            logs[f"{a}/{key}"].append(float(val.detach()))
        return loss

    def _value_loss(self, cb: CriticBatch, rows: torch.Tensor, cols: list[int], logs) -> torch.Tensor:
        args = self.args
        values = self._critic_forward(cb, rows)
        old = cb.old_values[rows].to(values.device)
        ret = cb.returns[rows].to(values.device)
        if self.value_rms is not None:
            old, ret = self.value_rms.normalize(old), self.value_rms.normalize(ret)
        if cb.mask is not None:  # token-level
            mask = cb.mask[rows].to(values.device)
        else:
            mask = torch.zeros_like(values, dtype=torch.bool)
            mask[:, cols] = True
        loss, st = alg.value_loss_clipped(values, old, ret, mask, args.cliprange_value)
        logs["loss/value_avg"].append(float(loss.detach()))
        logs["val/clipfrac_avg"].append(float(st["clipfrac"]))
        logs[f"critic/{cb.key}/loss"].append(float(loss.detach()))
        return loss

    def _critic_diagnostics(self, roll: Rollout) -> dict:
        """Explained variance per agent, value mean, raw advantage mean/std."""
        s = self._stats
        out = {
            "critic/value_mean": float(s["values"].mean()),
            "critic/return_mean": float(s["returns"].mean()),
            "critic/advantage_mean": float(s["raw_adv"].mean()),
            "critic/advantage_std": float(s["raw_adv"].std()) if s["raw_adv"].numel() > 1 else 0.0,
        }
        if self.args.advantage_level == "turn":
            mask = roll.turn_mask
            for i, a in enumerate(self.team.names):
                out[f"{a}/critic/explained_variance"] = alg.explained_variance(self._value_table[:, :, i], self._return_table[:, :, i], mask)
                out[f"{a}/critic/value_mean"] = float(self._value_table[:, :, i][mask].mean())
        return out


def _suffix(at: AgentTurn) -> list[list[int]]:
    # Whole padded rows: every suffix has the same length, so response token j sits at the same position in each row.
    return [r.tolist() for r in at.gen.response_ids]
