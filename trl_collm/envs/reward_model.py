"""``RewardModelFunction``: a TRL-PPO-style reward model used as a reward function."""

from __future__ import annotations

import inspect
from collections.abc import Mapping

import torch

from ..chat import agent_prompt
from ..team.modeling import backbone_of, input_pad_id, score_layer
from .protocol import Observation


class RewardModelFunction:
    """Wraps a TRL-PPO-style reward model (``AutoModelForSequenceClassification``, ``num_labels=1``).

    Each agent's prompt + completion is scored separately as ``logits[:, 0]`` of the last real token, as the model's
    own head pools it. For models with a transformer body and a score layer the batch is left-padded and the last
    column scored directly, so no pad id is needed; other models are called whole and pool on their
    ``config.pad_token_id`` (we then pad with it, on the tokenizer's padding side).
    """

    __name__ = "reward_model"

    def __init__(self, model, tokenizer, batch_size: int = 64, max_length: int | None = None):
        if batch_size < 1:
            raise ValueError(f"RewardModelFunction: batch_size must be >= 1, got {batch_size}.")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = int(batch_size)
        self.max_length = max_length
        # Score = the score layer on the last real token's hidden state. With a body and a score layer we find that
        # token ourselves (left padding: the last column), so the pad id never matters: config.pad_token_id may be
        # unset and a pad token a script added need not have an embedding row. Other models are called whole and
        # pool on their config.pad_token_id.
        self._parts = _body_and_head(model)
        config = getattr(model, "config", None)
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        pad = getattr(text_config, "pad_token_id", None)
        if self._parts is not None:
            pad = input_pad_id(tokenizer, model)
        elif pad is None:
            pad = getattr(tokenizer, "pad_token_id", None)
            if pad is not None and self.batch_size > 1:
                raise ValueError(
                    f"RewardModelFunction: the reward model's config.pad_token_id is None, so it cannot find the "
                    f"last token of a padded batch; set model.config.pad_token_id = tokenizer.pad_token_id "
                    f"({pad}) or use batch_size=1."
                )
        if pad is None and self.batch_size > 1:
            raise ValueError(
                "RewardModelFunction: neither the reward model's config nor the tokenizer defines a pad token id; "
                "set tokenizer.pad_token (e.g. to the eos token) and model.config.pad_token_id, or use batch_size=1."
            )
        self.pad_token_id = pad if pad is not None else 0
        try:
            forward = self._parts[0].forward if self._parts is not None else model.forward
            self._accepts_position_ids = "position_ids" in inspect.signature(forward).parameters
        except (TypeError, ValueError):
            self._accepts_position_ids = False

    def _text(self, prompt: Observation) -> str:
        # A conversation (or a task's chat form) reads as the scorer's own template renders it, as an agent's would.
        prompt = agent_prompt(self.tokenizer, prompt)
        if isinstance(prompt, str):
            return str(prompt)
        ids = prompt.tolist() if hasattr(prompt, "tolist") else list(prompt)
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _encode(self, texts: list[str]) -> list[list[int]]:
        enc = self.tokenizer(texts)
        ids = enc["input_ids"] if isinstance(enc, Mapping) or hasattr(enc, "keys") else enc
        ids = [x.tolist() if hasattr(x, "tolist") else list(x) for x in ids]
        if self.max_length is not None:
            # Respect the tokenizer's truncation side (default right) so the same text is cut the same way
            # as when it was used elsewhere.
            side = getattr(self.tokenizer, "truncation_side", "right")
            ids = [x[-self.max_length :] if side == "left" else x[: self.max_length] for x in ids]
        return ids

    def _device(self) -> torch.device:
        try:
            return next(self.model.parameters()).device
        except (StopIteration, AttributeError):
            return torch.device("cpu")

    @torch.no_grad()
    def score_ids(self, sequences: list[list[int]]) -> list[float]:
        """Score token-id sequences (one float each) in length-sorted batches of ``batch_size``."""
        device = self._device()
        side = "left" if self._parts is not None else getattr(self.tokenizer, "padding_side", "right")
        # Sorting by length keeps the padding (wasted compute) per batch small; results are scattered back.
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        scores = [0.0] * len(sequences)
        was_training = getattr(self.model, "training", False)
        if was_training:
            self.model.eval()  # dropout would make the reward noisy
        try:
            for start in range(0, len(order), self.batch_size):
                idx = order[start : start + self.batch_size]
                batch = [sequences[i] for i in idx]
                width = max(1, max(len(s) for s in batch))
                input_ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
                attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
                for r, seq in enumerate(batch):
                    if not seq:
                        continue
                    sl = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
                    input_ids[r, sl] = torch.tensor(seq, dtype=torch.long)
                    attention_mask[r, sl] = 1
                kwargs = {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device)}
                if self._accepts_position_ids:
                    # Positions count real tokens only, so left padding does not shift them.
                    kwargs["position_ids"] = (attention_mask.cumsum(-1) - 1).clamp(min=0).to(device)
                if self._parts is not None:
                    body, head = self._parts
                    out = body(**kwargs)
                    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
                    logits = head(hidden[:, -1])  # left padding: every row's last real token
                else:
                    logits = self.model(**kwargs).logits
                values = logits[:, 0].float().cpu().tolist()
                for i, v in zip(idx, values):
                    scores[i] = float(v)
        finally:
            if was_training:
                self.model.train()
        return scores

    def __call__(self, prompts, completions, **kwargs) -> list[float | list[float]]:
        if len(prompts) != len(completions):
            raise ValueError(
                f"reward function 'reward_model' got {len(prompts)} prompt lists for {len(completions)} "
                f"completion lists; pass one of each per episode."
            )
        texts, shape = [], []
        for e, (ps, cs) in enumerate(zip(prompts, completions)):
            if len(ps) != len(cs):
                raise ValueError(
                    f"reward function 'reward_model' got {len(ps)} prompts but {len(cs)} completions for "
                    f"episode {e}; pass one prompt and one completion per agent."
                )
            texts.extend(self._text(p) + c for p, c in zip(ps, cs))
            shape.append(len(cs))
        flat = self.score_ids(self._encode(texts)) if texts else []
        out, pos = [], 0
        for n in shape:
            chunk = flat[pos : pos + n]
            pos += n
            out.append(chunk[0] if n == 1 else chunk)
        return out


def _body_and_head(model):
    """(transformer body, score layer) of a sequence-classification model, or None for other callables."""
    try:
        return backbone_of(model), score_layer(model)
    except (ValueError, AttributeError):
        return None
