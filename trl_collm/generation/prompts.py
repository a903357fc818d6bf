"""`PromptSettings`: everything that shapes an agent's prompt, recorded once (team.json's "prompts") so that a saved
team is played on the prompts it was trained on.

What shapes a prompt, besides the env's observations:
- `agent_context`: the observation alone, or the agent's own history (trl_collm/rollout.py);
- `max_prompt_length`: per agent, the longest prompt in tokens (longer ones keep their last tokens), the config's
  `max_prompt_length` capped by the model's context minus the answer's length;
- `chat_templates`: per agent, a fingerprint of the chat template its tokenizer rendered conversations with
  (trl_collm/chat.py), or None for a tokenizer without one. The template itself travels with the tokenizer in the
  agent's folder; the fingerprint lets a sampler refuse a team whose tokenizers would render other prompts.

It sits beside `SamplingSettings` (sampler.py, how a prompt is answered) and, like it, validates itself and owns its
team.json form. The `Sampler` holds both; the runners read `agent_context` from it and the sampler encodes with the
limits, so no entry point can apply one and forget the other.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping

from .. import chat
from ..team.modeling import max_positions

AGENT_CONTEXTS = ("observation", "history")


def template_fingerprint(tokenizer) -> str | None:
    """A short hash of the tokenizer's chat template (None: no template, conversations get the plain rendering)."""
    if not chat.has_template(tokenizer):
        return None
    template = tokenizer.chat_template
    text = template if isinstance(template, str) else repr(sorted(dict(template).items()))  # named templates
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class PromptSettings:
    """How each agent's prompt is built from its observations. Empty mappings: no limit, no template check."""

    agent_context: str = "observation"
    max_prompt_length: Mapping[str, int | None] = dataclasses.field(default_factory=dict)
    chat_templates: Mapping[str, str | None] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.agent_context not in AGENT_CONTEXTS:
            raise ValueError(
                f"PromptSettings.agent_context must be one of {list(AGENT_CONTEXTS)}, got {self.agent_context!r}."
            )
        for agent, limit in self.max_prompt_length.items():
            if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
                raise ValueError(
                    f"PromptSettings.max_prompt_length[{agent!r}] must be None or an integer >= 1, got {limit!r}."
                )
        # own copies: a caller's dict edited later must not change a record already handed to a sampler
        object.__setattr__(self, "max_prompt_length", dict(self.max_prompt_length))
        object.__setattr__(self, "chat_templates", dict(self.chat_templates))

    def limit(self, agent: str) -> int | None:
        """Agent `agent`'s longest prompt in tokens (None: no limit)."""
        return self.max_prompt_length.get(agent)

    @classmethod
    def from_config(cls, args, team) -> PromptSettings:
        """A trainer's settings: its `agent_context`; each agent's limit, `max_prompt_length` capped so that prompt
        plus answer (`response_length`) fit the model's context (longer prompts would crash or wrap positions); the
        fingerprint of each agent's chat template."""
        limits = {}
        for a in team.names:
            caps = [args.max_prompt_length]
            context = max_positions(team.model_of(a))
            if context is not None:
                caps.append(context - args.response_length)
            caps = [c for c in caps if c is not None]
            limits[a] = max(1, min(caps)) if caps else None
        templates = {a: template_fingerprint(team.tokenizers[a]) for a in team.names}
        return cls(args.agent_context, limits, templates)

    def check_team(self, team) -> None:
        """Refuse a team whose tokenizers would render conversations otherwise than the recorded ones did."""
        # only the agents with a record (none for an older team.json or settings made by hand)
        for a, recorded in self.chat_templates.items():
            if a not in team.tokenizers:
                continue
            found = template_fingerprint(team.tokenizers[a])
            if recorded != found:
                raise ValueError(
                    f"agent {a!r} was trained with chat template {recorded or 'none'} but its tokenizer has "
                    f"{found or 'none'}, so its prompts would differ from training's; use the tokenizer saved in "
                    "the team's folder (load_team), or pass PromptSettings without `chat_templates` to play it anyway."
                )

    # ------------------------------------------------------------------ team.json
    def to_team_json(self) -> dict:
        """The "prompts" entry of team.json."""
        return {
            "agent_context": self.agent_context,
            "max_prompt_length": dict(self.max_prompt_length),
            "chat_templates": dict(self.chat_templates),
        }

    @classmethod
    def from_team_json(cls, desc: dict) -> PromptSettings:
        """The settings a team.json (the whole description) records. A team saved before this record has no
        "prompts" entry: it was played on the observation alone, with the limits its "generation" entry kept."""
        entry = desc.get("prompts")
        if entry is None:
            return cls(max_prompt_length=(desc.get("generation") or {}).get("max_prompt_length") or {})
        return cls(
            agent_context=entry.get("agent_context", "observation"),
            max_prompt_length=entry.get("max_prompt_length") or {},
            chat_templates=entry.get("chat_templates") or {},
        )
