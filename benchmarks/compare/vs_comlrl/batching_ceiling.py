"""How much can batching alone buy on this hardware? The same work done as one batch of B or as B batches of one.

comlrl generates and updates one sample at a time; trl_collm batches. At equal settings both do the same arithmetic, so
the speed-up batching gives is bounded by how much cheaper one batch of B is than B batches of 1 on the device at
hand. This script measures that bound, for the shapes of the comparison task (a 94-token prompt, 8 new tokens, the
CC critic's ~200-token joint view), with plain transformers calls (no trainer of either library):

- generate: `generate(max_new_tokens=8)` (sampling, top_k 50) on B prompts at once vs one prompt B times;
- forward + backward: log-probs of a (prompt + response) sequence and their backward, B rows at once vs B times 1;
- critic forward + backward: a value head on the backbone over the joint view, likewise.

    python benchmarks/compare/vs_comlrl/batching_ceiling.py                      # tiny and small models, CPU, 1 thread
    python benchmarks/compare/vs_comlrl/batching_ceiling.py --device cuda --sizes small 0.5b

Prints a table and one JSON line; a ratio of r means the batched form is r times faster for the same work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = os.path.dirname(os.path.abspath(__file__))


def timed(fn, reps, sync):
    fn()  # warm-up (allocator, kernels, caches)
    sync()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def measure(path, device, batch, prompt_len, new_tokens, view_len, reps):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path).to(device)
    model.generation_config.eos_token_id = None  # every row runs to new_tokens, as in the comparison
    vocab = model.config.vocab_size
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    head = torch.nn.Linear(model.config.hidden_size, 1).to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    prompts = torch.randint(4, vocab, (batch, prompt_len), device=device)
    seqs = torch.randint(4, vocab, (batch, prompt_len + new_tokens), device=device)
    views = torch.randint(4, vocab, (batch, view_len), device=device)
    gen = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=True,
        top_k=50,
        top_p=1.0,
        temperature=1.0,
        pad_token_id=0,
    )

    def generate(rows):
        with torch.no_grad():
            model.generate(input_ids=rows, attention_mask=torch.ones_like(rows), **gen)

    def logprob_step(rows):
        logits = model(input_ids=rows, logits_to_keep=new_tokens + 1).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, rows[:, -new_tokens:, None])
        logp.sum().backward()

    def critic_step(rows):
        values = head(body(input_ids=rows).last_hidden_state[:, -1])
        (values.float() ** 2).mean().backward()

    def one_by_one(fn, data):
        return lambda: [fn(data[i : i + 1]) for i in range(batch)]

    row = dict(
        model=os.path.basename(path), params=sum(p.numel() for p in model.parameters()), device=device, batch=batch
    )
    for name, fn, data in (
        ("generate", generate, prompts),
        ("logprob_fwd_bwd", logprob_step, seqs),
        ("critic_fwd_bwd", critic_step, views),
    ):
        batched = timed(lambda: fn(data), reps, sync)
        single = timed(one_by_one(fn, data), max(1, reps // 2), sync)
        model.zero_grad(set_to_none=True)
        head.zero_grad(set_to_none=True)
        row[name] = dict(batched_s=batched, one_by_one_s=single, ratio=single / batched)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=["tiny", "small", "medium", "0.5b"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--batch", type=int, default=16, help="rows per batch = comlrl's rollout buffer in the comparison")
    p.add_argument("--prompt-len", type=int, default=94, help="tokens of one agent's prompt in the comparison task")
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--view-len", type=int, default=200, help="tokens of the CC critic's joint view")
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default); the comparison uses 1")
    p.add_argument("--models-dir", default=os.path.join(HERE, ".models"))
    opts = p.parse_args(argv)
    import torch

    if opts.threads:
        torch.set_num_threads(opts.threads)
    if opts.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch sees no GPU")
    from trl_collm.testing import save_tiny_model

    rows = []
    for size in opts.sizes:
        path = save_tiny_model(opts.models_dir, f"qwen2-{size}-s0", arch="qwen2", size=size, seed=0)
        rows.append(measure(path, opts.device, opts.batch, opts.prompt_len, opts.new_tokens, opts.view_len, opts.reps))
    print(f"batch {opts.batch} at once vs {opts.batch} x 1, {opts.device}, torch threads {torch.get_num_threads()}")
    print(f"{'model':18s} {'params':>11s} | {'generate':>22s} | {'log-prob fwd+bwd':>22s} | {'critic fwd+bwd':>22s}")
    for r in rows:
        cells = [
            f"{r[k]['batched_s'] * 1e3:7.1f} vs {r[k]['one_by_one_s'] * 1e3:7.1f} ms {r[k]['ratio']:4.1f}x"
            for k in ("generate", "logprob_fwd_bwd", "critic_fwd_bwd")
        ]
        print(f"{r['model']:18s} {r['params']:11,d} | " + " | ".join(cells))
    print(json.dumps(dict(settings=vars(opts), torch=torch.__version__, rows=rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
