"""One forward + backward of a causal LM that also counts what autograd keeps for the backward: shared by the CPU
adaptations' tests (tests/test_cpu_*.py), which check both the numbers and the bytes an adaptation saves."""

import torch


def forward_backward(model, ids, bf16=False, attention_mask=None, position_ids=None):
    """(logits, bytes kept for the backward, gradients) of the loss sum(logsumexp(logits)) over the real tokens.

    Each kept tensor counts once (by its storage address: a tensor kept by several nodes is one copy); gradients are
    cloned, for the parameters that got one. `bf16`: the forward under CPU bf16 autocast."""
    kept = {}

    def pack(t):
        kept[t.data_ptr()] = t.numel() * t.element_size()
        return t

    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits = model(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids).logits
        per_token = logits.float().logsumexp(-1)
        loss = per_token.sum() if attention_mask is None else (per_token * attention_mask).sum()
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), sum(kept.values()), grads
