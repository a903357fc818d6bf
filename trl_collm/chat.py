"""Conversational prompts, TRL's way: a prompt may be a list of `{"role", "content"}` messages, and each agent renders
it with its own tokenizer's chat template (a mixed team has several). Pure functions; the rollout and the sampler
call them.

Three kinds of observation reach an agent (docs/chat.md):

* a plain string or token ids: used as they are (no template is applied, as in TRL for non-conversational data);
* a conversation (list of messages): rendered with the agent's template and `add_generation_prompt=True`; an agent
  whose tokenizer has no template gets the *plain rendering*, the messages' contents joined by newlines (the same
  text `history_context` builds from a plain multi-turn history, so the two agree);
* a `ChatPrompt`: a string that also carries a chat form (the built-in tasks return these). Agents with a template
  get the chat form rendered, agents without one the string itself, unchanged.

With `agent_context="history"`, an agent's prompt at turn t is its conversation so far: every observation's messages
followed by its own answer as an assistant message, rendered with its template (plain text joined as before for an
agent without one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

Message = Mapping[str, str]

_PROBE = "\u2063trl-collm-probe\u2063"  # content no template alters; what follows it in the rendering ends a turn


class ChatPrompt(str):
    """A plain prompt (the string itself) that also has a chat form (`messages`). Everything that reads it as a
    string (reward functions, logs, agents without a chat template) sees exactly the plain prompt."""

    messages: tuple[dict, ...]

    def __new__(cls, text: str, messages: Sequence[Message]):
        self = super().__new__(cls, text)
        self.messages = tuple(dict(m) for m in messages)
        check_conversation(list(self.messages), "ChatPrompt messages")
        return self

    def __reduce__(self):  # deep copies and pickles (env clones, worker processes) keep the chat form
        return (ChatPrompt, (str(self), self.messages))


def system_user(system: str, user: str) -> list[dict]:
    """The chat form the built-in tasks use: the instructions as a system message, the material as the user's."""
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def task_prompt(instructions: str, material: str, sep: str = " ") -> ChatPrompt:
    """A prompt in both forms: plain `instructions + sep + material`, chat `system_user(instructions, material)`."""
    return ChatPrompt(f"{instructions}{sep}{material}", system_user(instructions, material))


def is_conversation(obs) -> bool:
    """True for a non-empty list of messages (mappings with "role" and "content"), as TRL's `is_conversational`."""
    return (
        isinstance(obs, (list, tuple))
        and len(obs) > 0
        and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in obs)
    )


def check_conversation(messages, what: str) -> None:
    """Raise a one-line error unless `messages` is a non-empty list of {"role": str, "content": str} messages."""
    if not is_conversation(messages):
        raise ValueError(f"{what} must be a non-empty list of {{'role': ..., 'content': ...}} messages.")
    for k, m in enumerate(messages):
        if not isinstance(m["role"], str) or not isinstance(m["content"], str):
            raise ValueError(f"{what}[{k}] needs a str 'role' and a str 'content', got {dict(m)!r}.")


def has_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render(tokenizer, messages: Sequence[Message]) -> str:
    """The prompt text for `messages`: the tokenizer's chat template with the generation prompt, or (no template)
    the plain rendering, the contents joined by newlines."""
    messages = [dict(m) for m in messages]
    if not has_template(tokenizer):
        return "\n".join(m["content"] for m in messages)
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as err:
        from jinja2.exceptions import TemplateError  # transformers' templates are jinja2's

        if not isinstance(err, TemplateError):
            raise
        # A template's own `raise_exception` (e.g. "Conversation roles must alternate user/assistant/...") or a
        # broken template: one line naming the model, the roles and the fix, instead of jinja's traceback.
        name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
        roles = [m["role"] for m in messages]
        reason = " ".join(str(err).split())
        raise ValueError(
            f"the chat template of {name!r} refuses a conversation with the roles {roles}: {reason}. Use the roles it "
            "takes (many accept one optional 'system' first, then 'user' / 'assistant' in turn), or give this agent "
            "plain-text prompts (a str observation)."
        ) from None


def messages_of(obs, decode: Callable[[list[int]], str]) -> list[dict]:
    """An observation as messages: a conversation as is, a ChatPrompt's chat form, text (or decoded ids) as one user
    message."""
    if isinstance(obs, ChatPrompt):
        return [dict(m) for m in obs.messages]
    if is_conversation(obs):
        return [dict(m) for m in obs]
    return [{"role": "user", "content": obs if isinstance(obs, str) else decode(obs)}]


def agent_prompt(tokenizer, obs):
    """What an agent is prompted with for one observation: text, or token ids left as they are."""
    if isinstance(obs, ChatPrompt):
        return render(tokenizer, obs.messages) if has_template(tokenizer) else str(obs)
    if is_conversation(obs):
        return render(tokenizer, obs)
    return obs


def wants_chat(tokenizer, observations: Sequence) -> bool:
    """Whether an agent's multi-turn history is rendered as a conversation: its tokenizer has a template and an
    observation came as messages (a conversation or a ChatPrompt). Otherwise the history is plain text, each
    observation as `agent_prompt` gives it (a conversation's plain rendering, a ChatPrompt's text) joined with the
    answers (`history_context`), which is also the plain rendering of the whole conversation."""
    return has_template(tokenizer) and any(is_conversation(o) or isinstance(o, ChatPrompt) for o in observations)


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


def history_messages(observations: Sequence, completions: Sequence[str], decode) -> list[dict]:
    """An agent's conversation so far: each observation's messages, then its answer as an assistant message."""
    if len(observations) != len(completions) + 1:
        raise ValueError("history_messages needs one more observation than completions.")
    messages = []
    for k, obs in enumerate(observations):
        messages += messages_of(obs, decode)
        if k < len(completions):
            messages.append({"role": "assistant", "content": completions[k]})
    return messages


def end_of_turn_id(tokenizer) -> int | None:
    """The token the chat template closes an assistant turn with (ChatML `<|im_end|>`, Llama 3 `<|eot_id|>`,
    Gemma `<end_of_turn>`), found by rendering a probe answer and reading the first token after it; None without
    a template or when the template closes turns with ordinary text."""
    if not has_template(tokenizer):
        return None
    probe = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _PROBE}]
    try:
        text = tokenizer.apply_chat_template(probe, tokenize=False)
    except Exception:  # a template that refuses this shape (e.g. requires a system message) ends turns with eos
        return None
    if _PROBE not in text:
        return None
    after = tokenizer(text.split(_PROBE, 1)[1], add_special_tokens=False)["input_ids"]
    special = set(getattr(tokenizer, "all_special_ids", ())) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    return int(after[0]) if after and after[0] in special else None


def stop_token_ids(tokenizer) -> tuple[int, ...]:
    """The tokens that end an agent's completion when the settings name none: eos, and the template's end-of-turn
    token when it is another token (an instruct model ends its answer with it, not with eos)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    stops = [] if eos is None else [int(eos)]
    eot = end_of_turn_id(tokenizer)
    if eot is not None and eot not in stops:
        stops.append(eot)
    return tuple(stops)
