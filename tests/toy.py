"""Toy models with closed-form gradients, shared by the preset-gradient tests (PPO `collm`, MC `magrpo`)."""

import types

import torch
from torch import nn
from transformers import PretrainedConfig

from trl_collm.generation.sampler import Generation

V = 7  # toy vocabulary size


class ConstantPolicy(nn.Module):
    """Logits are a learnable vector theta at every position: log p(token) = log_softmax(theta)[token]."""

    def __init__(self, theta):
        super().__init__()
        self.theta = nn.Parameter(torch.tensor(theta, dtype=torch.float32))
        self.config = PretrainedConfig(hidden_size=1, pad_token_id=0, eos_token_id=1)

    def forward(self, input_ids, logits_to_keep=0, **kwargs):
        b, length = input_ids.shape
        return types.SimpleNamespace(logits=self.theta.expand(b, logits_to_keep or length, V))


def generation(responses):
    """Fixed prompts/responses: response_ids rows right-padded with 0, the mask marks real tokens."""
    width = max(len(r) for r in responses)
    ids = torch.zeros(len(responses), width, dtype=torch.long)
    mask = torch.zeros(len(responses), width, dtype=torch.bool)
    for k, r in enumerate(responses):
        ids[k, : len(r)] = torch.tensor(r)
        mask[k, : len(r)] = True
    q = torch.full((len(responses), 2), 5, dtype=torch.long)
    return Generation(
        q, torch.ones_like(q), ids, mask, [str(r) for r in responses], torch.zeros(len(responses), dtype=torch.bool)
    )


def reinforce_step(theta, responses, advantages, eta):
    """theta after one SGD step on mean_s -(sum_j log softmax(theta)[y_sj]) * A_s."""
    th = torch.tensor(theta)
    p = torch.softmax(th, 0)
    grad = sum(
        -advantages[k] * (torch.bincount(torch.tensor(r), minlength=V).float() - len(r) * p)
        for k, r in enumerate(responses)
    )
    return th - eta * grad / len(responses)
