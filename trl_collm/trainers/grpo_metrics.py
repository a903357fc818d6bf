"""The metric names TRL's GRPOTrainer logs, computed for a team (over every agent's completions; a one-agent team logs
what GRPO logs), and `log_completions`' printout.

Rollout: `num_tokens` (prompt and completion tokens seen so far), `completions/{mean,min,max}_length`,
`completions/clipped_ratio` (no stop token), `completions/{mean,min,max}_terminated_length`, `reward`, `reward_std`,
`frac_reward_zero_std` (groups whose G rewards are all equal), `rewards/<function>/{mean,std}`. Loss (GRPO's loss
types): `entropy`, `kl`, `clip_ratio/{low_mean,low_min,high_mean,high_max,region_mean}`.
"""

from __future__ import annotations

import torch
from transformers import TrainerCallback


def _std(x: torch.Tensor) -> float:
    return float(x.float().std()) if x.numel() > 1 else 0.0


def completion_metrics(turns: list[dict], names: list[str]) -> tuple[dict, int]:
    """GRPO's completion lengths over every agent's completions of every turn, and the tokens (prompt + completion)
    they took."""
    lengths, ended, tokens = [], [], 0
    for turn in turns:
        for a in names:
            g = turn[a].gen
            lengths.append(g.response_mask.sum(-1).cpu())
            ended.append(g.ended.cpu())
            tokens += int(g.query_mask.sum()) + int(g.response_mask.sum())
    length, done = torch.cat(lengths).float(), torch.cat(ended)
    term = length[done]
    out = {
        "completions/mean_length": float(length.mean()),
        "completions/min_length": float(length.min()),
        "completions/max_length": float(length.max()),
        "completions/clipped_ratio": float((~done).float().mean()),
        "completions/mean_terminated_length": float(term.mean()) if len(term) else 0.0,
        "completions/min_terminated_length": float(term.min()) if len(term) else 0.0,
        "completions/max_terminated_length": float(term.max()) if len(term) else 0.0,
    }
    return out, tokens


def reward_metrics(rewards: torch.Tensor, groups: torch.Tensor, components: dict | None) -> dict:
    """GRPO's reward metrics of the first turn: `rewards` (N, n) per sample and agent, `groups` (N,) or (N, n) the
    sample's group, `components` the reward functions' own (N, n) values when the env kept them."""
    groups = groups if groups.dim() == rewards.dim() else groups.unsqueeze(-1).expand_as(rewards)
    zero_std, count = 0, 0
    for i in range(rewards.shape[1]):
        for gid in groups[:, i].unique():
            members = rewards[groups[:, i] == gid, i]
            zero_std += int(bool((members == members[0]).all()))
            count += 1
    out = {"reward": float(rewards.mean()), "reward_std": _std(rewards), "frac_reward_zero_std": zero_std / count}
    for name, values in (components or {}).items():
        if torch.is_tensor(values) and values.shape == rewards.shape:
            out[f"rewards/{name}/mean"] = float(values.float().mean())
            out[f"rewards/{name}/std"] = _std(values)
    return out


def clip_metrics(stats: dict, mask: torch.Tensor, logs) -> None:
    """GRPO's clip ratios of one loss (`algorithms.grpo_token_loss`'s `low` / `high`) appended to `logs`."""
    m = mask.bool()
    tokens = m.sum().clamp(min=1)
    per_row = m.sum(-1).clamp(min=1)
    low, high = stats["low"].float(), stats["high"].float()
    logs["clip_ratio/low_mean"].append(float(low.sum() / tokens))
    logs["clip_ratio/high_mean"].append(float(high.sum() / tokens))
    logs["clip_ratio/region_mean"].append(float((stats["low"] | stats["high"]).float().sum() / tokens))
    logs["clip_ratio/low_min"].append(float((low.sum(-1) / per_row).min()))
    logs["clip_ratio/high_max"].append(float((high.sum(-1) / per_row).max()))


def completions_text(tree, advantages: list[torch.Tensor], rows: int) -> str:
    """The first `rows` samples of the first turn: prompt, each agent's completion, reward and advantage."""
    lines = []
    first = tree.turns[0]
    for k in range(min(rows, len(tree.rewards[0]))):
        for i, a in enumerate(tree.agent_names):
            at = first[a]
            lines.append(
                f"[{a}] reward {float(tree.rewards[0][k, i]):.4g} advantage {float(advantages[0][k, i]):.4g}\n"
                f"  prompt: {at.contexts[k]!r}\n  completion: {at.gen.texts[k]!r}"
            )
    return "\n".join(lines)


class CompletionPrinter(TrainerCallback):
    """`log_completions`: at each log, print the completions the trainer kept from its latest iteration."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_log(self, args, state, control, logs=None, **kwargs):
        text = getattr(self.trainer, "completions_to_log", None)
        if text and state.is_world_process_zero:
            print(f"-- completions at step {state.global_step}\n{text}", flush=True)
        self.trainer.completions_to_log = None
