"""``writing-tags``: a small conditional writing task of ours (not one of the paper's), for warm-started tiny teams.

Two taggers read the same forum post (its title and its two tags, e.g. ``careerguidance / job-offer``). The
``forum`` tagger must answer the post's forum tag, the ``subject`` tagger its subject tag. The right answer depends
on the input (12 forums, 14 subjects over the 120 shipped posts), so a team that scores here has learned
input-dependent behaviour - the thing the paper's writing tasks need and the matrix games never test. Joint reward
(max 2.0): +1 for each tagger whose answer holds its own tag, -0.5 for each tagger whose answer holds the teammate's
tag instead of (or besides) its own. Cheap on purpose: prompts of ~40 tokens, answers of a few tokens.

    import trl_collm.tasks.tags  # registers "writing-tags"
    task = get_task("writing-tags")
"""

from __future__ import annotations

import re

from ..chat import ChatPrompt, system_user
from ..envs import RewardFunctionEnv
from . import TaskSpec, register_task

__all__ = ["AGENT_NAMES", "load_tag_posts", "make_tags_env", "tag_prompt", "tags_of", "tags_reward"]

AGENT_NAMES = ["forum", "subject"]
OWN, OTHER = 1.0, -0.5


def tags_of(row) -> dict[str, str]:
    """The two tags of a post row: {'forum': ..., 'subject': ...} from its 'topic' ('forum/subject')."""
    forum, _, subject = str(row["topic"]).partition("/")
    if not forum or not subject:
        raise ValueError(f"writing-tags: row topic {row.get('topic')!r} is not 'forum/subject'")
    return {"forum": forum.lower(), "subject": subject.lower()}


def tag_prompt(row, agent: str) -> ChatPrompt:
    tags = tags_of(row)
    post = f'Forum post: "{row["title"]}"\nTags: {tags["forum"]} / {tags["subject"]}'
    role = f"You are the {agent} tagger. Answer with the post's {agent} tag only."
    # Chat form (models with a template): the role as the system message, the post as the user's.
    return ChatPrompt(f"{post}\n{role}\nTag:", system_user(role, post))


def word_set(text: str) -> set[str]:
    """The lower-case words of a text, as the reward reads them (the warm start scores its transcripts the same)."""
    return set(re.findall(r"[a-z0-9][a-z0-9-]*", str(text).lower()))


def tags_reward(prompts, completions, topic, **_) -> list[float]:
    """Joint reward per episode: +1 per tagger that wrote its own tag, -0.5 per tagger that wrote the other's."""
    out = []
    for texts, t in zip(completions, topic):
        tags = tags_of({"topic": t})
        score = 0.0
        for agent, text in zip(AGENT_NAMES, texts):
            words = word_set(text)
            other = AGENT_NAMES[1 - AGENT_NAMES.index(agent)]
            score += OWN * (tags[agent] in words) + OTHER * (tags[other] in words)
        out.append(score)
    return out


def make_tags_env() -> RewardFunctionEnv:
    return RewardFunctionEnv(
        reward_funcs=[tags_reward],
        formatters={a: (lambda row, a=a: tag_prompt(row, a)) for a in AGENT_NAMES},
        agent_names=list(AGENT_NAMES),
        reward_type="joint",
    )


def load_tag_posts(split: str = "train", source=None, limit: int | None = None):
    """The writing-summary posts (the 120 shipped ones by default); every row needs a 'topic' 'forum/subject'."""
    from .writing import load_posts

    return load_posts(split, source, limit)


register_task(
    TaskSpec(
        name="writing-tags",
        description="Two taggers name a forum post's forum and subject tags (ours; a small conditional writing task).",
        agent_names=list(AGENT_NAMES),
        num_turns=1,
        make_env=lambda **options: make_tags_env(**options),
        load_dataset=load_tag_posts,
        max_reward=2 * OWN,
        options={},
    )
)
