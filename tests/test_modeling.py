"""Tokenizers as real model families ship them (team/modeling.py's pad id): pad equal to eos keeps the eos in the
action, and a pad id without an embedding row never reaches a model (the script path is in tests/test_dropin.py)."""

from __future__ import annotations

import torch

from trl_collm import MultiAgentPPOTrainer


def ok_reward(prompts, completions, **kwargs):
    return [float(len(c[0]) % 3) - float(len(c[-1]) % 2) for c in completions]


# ---------------------------------------------------------------------------------------------------------------
# 1. tokenizers as real families ship them (the script path is in tests/test_dropin.py)
# ---------------------------------------------------------------------------------------------------------------


def test_pad_equal_to_eos_keeps_the_eos_in_the_action(tmp_path, make_config, prompts_dataset):
    """Qwen-shaped tokenizers use one id for pad and eos: the first eos ends (and belongs to) the action, and what
    generate() appends after it is padding."""
    from trl_collm.testing import save_tiny_model

    path = save_tiny_model(tmp_path, "qwen-family", family="qwen")
    args = make_config(tmp_path, num_agents=1, advantage_level="turn")
    tr = MultiAgentPPOTrainer(args=args, model=path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    tok = tr.team.tokenizers["policy"]
    assert tok.pad_token_id == tok.eos_token_id
    eos, a, b = tok.eos_token_id, 40, 41
    q_ids, q_mask = tr.team.encode("policy", ["hello there"], "cpu")
    gen = tr.sampler._finish("policy", q_ids, q_mask, torch.tensor([[a, b, eos, eos, eos]]), None)
    assert gen.response_mask.tolist() == [[True, True, True, False, False]]
    assert bool(gen.ended[0])
    tr.train()  # and a whole run works with it


def test_pad_without_an_embedding_row_never_reaches_a_model(tmp_path, make_config, prompts_dataset):
    """A pad token added after the model was built (Llama shape: no spare rows) is replaced by an id the model can
    embed wherever padding is written, for the policy, the critic and generation alike."""
    from transformers import AutoTokenizer

    from trl_collm.team.modeling import input_pad_id
    from trl_collm.testing import save_tiny_model

    path = save_tiny_model(tmp_path, "llama-family", family="llama")
    tok = AutoTokenizer.from_pretrained(path)
    tok.add_special_tokens({"pad_token": "[PAD]"})
    args = make_config(tmp_path, num_agents=2, critic_type="decentralized")
    tr = MultiAgentPPOTrainer(
        args=args, model=path, processing_class=tok, train_dataset=prompts_dataset, reward_funcs=ok_reward
    )
    rows = tr.team.model_of("agent_0").get_input_embeddings().num_embeddings
    assert tok.pad_token_id == rows  # one past the table
    assert tr.team.pad_id("agent_0") == tok.eos_token_id
    assert input_pad_id(tok, tr.team.model_of("agent_0")) == tok.eos_token_id
    ids, mask = tr.team.encode("agent_0", ["a", "a much longer prompt than that"], "cpu")
    assert int(ids.max()) < rows and int(ids[0, 0]) == tok.eos_token_id and int(mask[0, 0]) == 0
    tr.train()
