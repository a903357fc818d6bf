"""What a critic reads. Pure string functions, easy to inspect and to test.

A decentralized critic's view of agent i is built from agent i's own context only; it never receives the other
agents' texts (the function is not even given them). A centralized critic reads every agent's context, each tagged
by the agent's name, optionally the joint action, and (for `agent_tagged` values) which agent it is valuing.
"""

from __future__ import annotations


def decentralized_view(context: str) -> str:
    """Agent i's critic sees exactly what agent i's policy sees: its own context."""
    return context


def centralized_view(
    agent_names: list[str],
    contexts: list[str],
    actions: list[str] | None = None,
    target_agent: str | None = None,
) -> str:
    if len(agent_names) != len(contexts):
        raise ValueError(f"centralized_view got {len(contexts)} contexts for {len(agent_names)} agents.")
    parts = [f"[{name}] {ctx}" for name, ctx in zip(agent_names, contexts)]
    text = "\n\n".join(parts)
    if actions is not None:
        acts = "\n".join(f"[{name} action] {act}" for name, act in zip(agent_names, actions))
        text += "\n\n[joint action]\n" + acts
    if target_agent is not None:
        text += f"\n\n[value for {target_agent}]"
    return text


def fair_share(lengths: list[int], budget: int) -> list[int]:
    """How many tokens of each context to keep so that they sum to at most `budget`: contexts shorter than an equal
    share keep everything, and the longer ones split the rest equally (a centralized critic's view keeps the latest
    part of every agent's context instead of losing the first agents' whole)."""
    budget = max(0, int(budget))
    if sum(lengths) <= budget:
        return list(lengths)
    keep = [0] * len(lengths)
    left = sorted(range(len(lengths)), key=lambda i: lengths[i])
    while left:
        share = budget // len(left)
        i = left[0]
        if lengths[i] <= share:  # fits in its share: keep all of it, the others split what it leaves
            keep[i] = lengths[i]
            budget -= lengths[i]
            left.pop(0)
            continue
        for j, i in enumerate(left):  # all the rest are longer than their share
            keep[i] = share + (1 if j < budget - share * len(left) else 0)
        break
    return keep
