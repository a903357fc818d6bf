"""Seeded sampling with the scores of every step: how the tests compare a fast decoding path with the plain one."""

import torch


def sample_with_scores(model, ids, mask, bf16: bool = False, max_new_tokens: int = 16, **cache):
    """`generate()` sampling at temperature 1 from seed 0 (under CPU bf16 autocast when `bf16`): the sequences and
    the (steps, rows, vocabulary) scores; `cache` passes a past-key-values argument through."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16), torch.no_grad():
        torch.manual_seed(0)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=True,
            top_k=0,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
            **cache,
        )
    return out.sequences, torch.stack(out.scores)
