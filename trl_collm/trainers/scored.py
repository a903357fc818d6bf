"""What scoring hands to the update, declared: one `ScoredTurn` per agent and turn (each trainer adds its fields).

The rollout's `AgentTurn` stays what the episode runner produced; a trainer wraps it with what it computed without
gradients (old / reference log-probs, advantages) instead of attaching attributes to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..rollout import AgentTurn


@dataclass
class ScoredTurn:
    """One agent's actions at one turn plus what the update needs about them."""

    turn: AgentTurn
    advantages: torch.Tensor | None = None  # (B,) one per completion, or (B, Lr) one per response token
    old_logprobs: torch.Tensor | None = None  # (B, Lr) log-probs of the sampling policy (ratio losses)
    ref_logprobs: torch.Tensor | None = None  # (B, Lr) log-probs of the reference policy (KL terms)

    @property
    def agent(self) -> str:
        return self.turn.agent

    @property
    def episode_ids(self) -> torch.Tensor:
        return self.turn.episode_ids

    @property
    def gen(self):
        return self.turn.gen
