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


def history_context(observations: list[str], completions: list[str]) -> str:
    """An agent's local history h_t = o_0, a_0, ..., o_t as one prompt (used with agent_context='history')."""
    if len(observations) != len(completions) + 1:
        raise ValueError("history_context needs one more observation than completions.")
    pieces = []
    for obs, act in zip(observations, completions):
        pieces.append(obs)
        pieces.append(act)
    pieces.append(observations[-1])
    return "\n".join(pieces)
