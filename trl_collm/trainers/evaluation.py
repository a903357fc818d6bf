"""Evaluation of a team during or after training: the mean return of greedy or sampled episodes (`evaluate`) and a
printed table of a few episodes' completions (`generate_completions`)."""

from __future__ import annotations

from collections import defaultdict

import torch


@torch.no_grad()
def mean_returns(trainer, dataset, prefix: str, greedy: bool) -> dict:
    """`<prefix>_return` (team mean), `<prefix>_<agent>/return` and `<prefix>_turns`, averaged over the episodes of
    `dataset`, run in batches of per_device_eval_batch_size."""
    totals = defaultdict(float)
    count = 0
    size = trainer.args.per_device_eval_batch_size
    for start in range(0, len(dataset), size):
        rows = [dataset[i] for i in range(start, min(start + size, len(dataset)))]
        roll = trainer.rollout(rows, greedy=greedy)
        returns = roll.rewards.sum(1)  # (E, n)
        totals["return"] += float(returns.mean(-1).sum())
        for i, a in enumerate(roll.agent_names):
            totals[f"{a}/return"] += float(returns[:, i].sum())
        totals["turns"] += float(roll.turn_mask.sum())
        count += len(rows)
    return {f"{prefix}_{k}": v / count for k, v in totals.items()}


@torch.no_grad()
def completion_table(trainer, rows: list[dict], greedy: bool) -> list[dict]:
    """One entry per (episode, turn): the turn's rewards and each agent's prompt and completion."""
    roll = trainer.rollout(rows, greedy=greedy)
    table = []
    for t, turn in enumerate(roll.turns):
        for k, e in enumerate(turn[roll.agent_names[0]].episode_ids.tolist()):
            entry = {"episode": e, "turn": t, "reward": roll.rewards[e, t].tolist()}
            for a in roll.agent_names:
                entry[f"{a}/prompt"] = turn[a].contexts[k]
                entry[f"{a}/completion"] = turn[a].gen.texts[k]
            table.append(entry)
    return table


def print_table(table: list[dict], agent_names: list[str]) -> None:
    for entry in table:
        lines = [f"-- episode {entry['episode']} turn {entry['turn']} reward {entry['reward']}"]
        lines += [f"  [{a}] {entry[a + '/completion']!r}" for a in agent_names]
        print("\n".join(lines))
