"""How far vLLM's log-probs of its sampled tokens are from the trainer's, on the real model (vLLM venv only).

    python benchmarks/gpu/vllm_logprob_gap.py --rows 32 --tokens 32 --json docs/data/vllm_logprob_gap.json

Samples `--rows` answers of `--tokens` tokens from SmolLM2-135M-Instruct with the vLLM backend (temperature 0.7, no
top-k / top-p: the trainers' defaults), computes the same tokens' log softmax(logits / T) with the model's own full
forward (what PPO's scoring pass and the update compute), and reports the per-token gap and what the
importance-sampling correction would weight the loss by (TRL's default mode: sequence_mask, clip 3).
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--json", default=None)
    a = p.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_collm import algorithms as alg
    from trl_collm.generation.sampler import GenerationRequest, SamplingSettings
    from trl_collm.generation.vllm_backend import VLLMBackend
    from trl_collm.team.modeling import left_pad
    from trl_collm.team.pretrained import smollm2_135m_instruct

    path = smollm2_135m_instruct()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    questions = [f"Write step {i} of a plan to build a small wooden house." for i in range(a.rows)]
    rows = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True) for q in questions]
    rows = [list(r["input_ids"]) if hasattr(r, "keys") else list(r) for r in rows]
    ids, mask = left_pad(rows, tok.pad_token_id, "cpu")
    settings = SamplingSettings(max_new_tokens=a.tokens, temperature=a.temperature)
    backend = VLLMBackend()
    torch.manual_seed(0)
    out = backend.generate(GenerationRequest(model, ids, mask, settings, pad_id=tok.pad_token_id))
    backend.close()
    is_stop = out.tokens == tok.eos_token_id
    valid = (is_stop.long().cumsum(-1) - is_stop.long()) == 0
    full = torch.cat([ids, out.tokens], 1)
    with torch.no_grad():
        logits = model(input_ids=full, attention_mask=torch.cat([mask, torch.ones_like(out.tokens)], 1)).logits
    logits = logits[:, ids.shape[1] - 1 : -1]
    trainer = torch.log_softmax(logits / a.temperature, -1).gather(-1, out.tokens.unsqueeze(-1)).squeeze(-1)
    gap = (trainer - out.engine_logprobs)[valid]
    weights = alg.importance_sampling_weights(trainer, out.engine_logprobs, valid, "sequence_mask", None, 3.0)
    seq_w = weights[:, 0]
    result = {
        "model": "SmolLM2-135M-Instruct",
        "dtype": "float32",
        "device": "cpu",
        "rows": a.rows,
        "tokens": int(valid.sum()),
        "temperature": a.temperature,
        "abs_gap_mean": float(gap.abs().mean()),
        "abs_gap_max": float(gap.abs().max()),
        "gap_mean": float(gap.mean()),
        "sequence_is_weight_min": float(seq_w.min()),
        "sequence_is_weight_max": float(seq_w.max()),
        "vllm": __import__("vllm").__version__,
        "torch": torch.__version__,
    }
    print(json.dumps(result, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
