"""PPO's advantages: turn-level GAE over each completion (one action valued at the end of its view) or token-level
GAE as TRL's PPO, the advantages' normalisation by scope, and the value targets each critic batch's loss reads.

`PPOAdvantageEstimation` is mixed into `MultiAgentPPOTrainer` (trainers/ppo.py), whose scoring pass calls it; it
reads the trainer's config, team, critic and running value statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import algorithms as alg
from ..critics import CriticBatch
from ..rollout import Rollout
from .base import _chunked
from .scored import ScoredTurn


@dataclass
class ValueTargets:
    """PPO's targets for one critic batch (its scoring pass made them, so they live here, not in the critic's
    CriticBatch): the values the clipped value loss starts from, the returns it moves them to."""

    old_values: torch.Tensor  # (B, k) turn-level or (B, Lr) token-level
    returns: torch.Tensor  # same shape
    mask: torch.Tensor | None = None  # (B, Lr) token-level: the response tokens; None: turn-level


@dataclass
class PPOAdvantages:
    """What an advantage function returns: normalised advantages per turn and agent, the critic's statistics, and the
    value targets (one `ValueTargets` per critic batch, in the batches' order)."""

    advantages: list[dict[str, torch.Tensor]]  # [t][agent]: (B,) turn-level or (B, Lr) token-level
    values: torch.Tensor  # the played entries' values, returns and raw advantages, flat (statistics)
    returns: torch.Tensor
    raw_advantages: torch.Tensor
    value_table: torch.Tensor | None = None  # (E, T, n) turn-level values and returns (per-agent diagnostics)
    return_table: torch.Tensor | None = None
    targets: list[ValueTargets] = field(default_factory=list)


class PPOAdvantageEstimation:
    """The PPO trainer's advantage functions (mixed into `MultiAgentPPOTrainer`)."""

    def _values(self, cb: CriticBatch) -> torch.Tensor:
        """The critic's values for a whole batch, in chunks of local_rollout_forward_batch_size rows."""
        device = self.accelerator.device
        return _chunked(
            lambda s: self.critic.values(cb, device, torch.arange(len(cb.views))[s]),
            len(cb.views),
            self.args.local_rollout_forward_batch_size,
        )

    def _turn_advantages(
        self, roll: Rollout, cbs: list[CriticBatch], rewards: torch.Tensor, values: list | None = None
    ) -> PPOAdvantages:
        """Turn-level GAE: each completion is one action valued at the end of its view. `values`: the critic's
        values of every view of each batch when the caller has them already (the critic's step while scoring),
        else a scoring forward computes them."""
        names = self.team.names
        old_values = []
        for k, cb in enumerate(cbs):
            v = (self._values(cb) if values is None else values[k]).float().cpu()
            if self.value_rms is not None:
                v = self.value_rms.denormalize(v)
            old_values.append(v)
        V, adv, ret = self._turn_gae(roll, cbs, old_values, rewards)
        mask = roll.turn_mask
        values, returns, raw = V[mask], ret[mask], adv[mask]
        targets = [ValueTargets(v, cb.column_targets(ret, names)) for cb, v in zip(cbs, old_values)]
        adv = self._normalize_advantages(adv, mask)
        per_turn = [
            {a: adv[turn[a].episode_ids, t, i] for i, a in enumerate(names)} for t, turn in enumerate(roll.turns)
        ]
        return PPOAdvantages(per_turn, values, returns, raw, value_table=V, return_table=ret, targets=targets)

    def _turn_gae(
        self, roll: Rollout, cbs: list[CriticBatch], values: list[torch.Tensor | None], rewards: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Turn-level GAE per agent: each batch's values (B, k) (None: not valued yet, read as 0) scattered into the
        (E, T, n) value table, and the advantages and returns over it. An episode's entries read only its own values,
        so a caller holding some episodes' values gets those episodes right."""
        args, names = self.args, self.team.names
        n, E, T = len(names), roll.num_episodes, roll.num_turns
        V = torch.zeros(E, T, n)
        for cb, v in zip(cbs, values):
            if v is not None:
                cb.scatter_values(v, V, names)
        mask = roll.turn_mask.float()
        adv = torch.zeros(E, T, n)
        ret = torch.zeros(E, T, n)
        for i in range(n):
            adv[:, :, i], ret[:, :, i] = alg.gae(rewards[:, :, i], V[:, :, i], mask, args.gamma, args.lam)
        return V, adv, ret

    def _normalize_advantages(self, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        E, T, n = adv.shape
        agent_id = torch.arange(n).view(1, 1, n).expand(E, T, n)
        turn_id = torch.arange(T).view(1, T, 1).expand(E, T, n)
        full_mask = mask.unsqueeze(-1).expand(E, T, n)
        scope, floor = self.args.advantage_norm_scope, self.args.advantage_norm_std_floor
        return alg.normalize_by_scope(adv, full_mask, agent_id, turn_id, scope, floor)

    def _token_advantages(
        self, turns: list[dict[str, ScoredTurn]], cbs: list[CriticBatch], scores: torch.Tensor
    ) -> PPOAdvantages:
        """TRL PPO semantics: per-token values, per-token KL penalty, score at the last response token (`turns`:
        the scoring pass's `PPOTurn`s, whose `kl` it reads)."""
        args, names = self.args, self.team.names
        turn = turns[0]
        raw, targets = {}, []
        all_values, all_returns, all_adv = [], [], []
        for cb in cbs:
            a = cb.agents[0]
            st = turn[a]
            mask = st.gen.response_mask
            v = self._values(cb).float()
            if self.value_rms is not None:
                v = self.value_rms.denormalize(v)
            v = v.masked_fill(~mask, 0)
            kl = st.kl if st.kl is not None else torch.zeros_like(v)
            r, non_score = alg.token_level_rewards(
                scores[st.episode_ids, 0, names.index(a)].to(v.device), kl, mask, args.kl_coef
            )
            if args.whiten_rewards:
                r = alg.whiten(r, mask, shift_mean=False)
            adv, ret = alg.gae(r, v, mask.float(), args.gamma, args.lam)
            targets.append(ValueTargets(v, ret, mask))
            raw[a] = adv
            all_values.append(v[mask]), all_returns.append(ret[mask]), all_adv.append(adv[mask])
        # One turn: each agent's valid tokens, flattened, through the turn level's normalisation.
        masks, scope = {a: turn[a].gen.response_mask for a in names}, args.advantage_norm_scope
        sizes = [int(masks[a].sum()) for a in names]
        agent_id = torch.cat([torch.full((k,), i) for i, k in enumerate(sizes)])
        flat = torch.cat([raw[a][masks[a]] for a in names])
        flat = alg.normalize_by_scope(flat, None, agent_id, 0 * agent_id, scope, args.advantage_norm_std_floor)
        normalized = {}
        for a, part in zip(names, flat.split(sizes)):
            normalized[a] = raw[a] if scope == "none" else torch.zeros_like(raw[a]).masked_scatter(masks[a], part)
        return PPOAdvantages(
            [normalized],
            torch.cat(all_values).cpu(),
            torch.cat(all_returns).cpu(),
            torch.cat(all_adv).cpu(),
            targets=targets,
        )
