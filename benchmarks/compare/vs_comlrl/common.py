"""Measurement helpers shared by run_ours.py and run_theirs.py (stdlib + torch + transformers only, so the comlrl
virtualenv imports it too). Nothing here knows either library."""

from __future__ import annotations

import json
import os
import random
import resource
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")


def peak_rss_mib() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def peak_gpu_mib() -> float | None:
    """Peak memory the process allocated on the GPU (torch's allocator), or None on CPU runs."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.max_memory_allocated() / 2**20


def device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device == "cuda" else "cpu"


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class GenerateCounter:
    """Counts the tokens `generate()` produces, whoever calls it: wraps GenerationMixin.generate (the class method
    every HF causal LM inherits) for the life of the process. New tokens = (output length - input length) x rows;
    with the stop token outside the vocabulary every response runs to max_new_tokens."""

    def __init__(self):
        from transformers.generation.utils import GenerationMixin

        self.tokens = 0
        self.calls = 0
        self.seconds = 0.0
        original = GenerationMixin.generate
        counter = self

        def generate(model, *args, **kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            t0 = time.perf_counter()
            out = original(model, *args, **kwargs)
            counter.seconds += time.perf_counter() - t0
            seqs = out.sequences if hasattr(out, "sequences") else out
            counter.tokens += int(seqs.shape[0]) * (int(seqs.shape[1]) - int(ids.shape[1]))
            counter.calls += 1
            return out

        GenerationMixin.generate = generate


def common_args(p):
    p.add_argument("--algo", required=True, choices=["cc", "dc", "mc"])
    p.add_argument("--models", nargs=2, required=True, help="the two agents' model folders (save_tiny_model)")
    p.add_argument("--episodes", type=int, default=512, help="joint actions (reward evaluations) in the run")
    p.add_argument(
        "--batch", type=int, default=16, help="joint actions per update (CC/DC: rollout buffer; MC: prompts x G)"
    )
    p.add_argument("--num-generations", type=int, default=4, help="MC: G samples per agent and prompt")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where both libraries put every model")
    p.add_argument("--tail", type=float, default=0.25, help="final reward = mean over this last fraction of episodes")
    return p


def parse_run_args(doc: str, argv=None, extra=None):
    """The run scripts' start: parse and check the shared command line (plus `extra(parser)`'s own flags), then set
    torch's threads."""
    import argparse

    parser = common_args(argparse.ArgumentParser(description=doc.split("\n\n")[0]))
    if extra is not None:
        extra(parser)
    opts = parser.parse_args(argv)
    check_args(opts)
    import torch

    if opts.threads:
        torch.set_num_threads(opts.threads)
    return opts


def check_args(opts) -> None:
    if opts.algo == "mc" and opts.batch % opts.num_generations:
        raise SystemExit(f"--batch {opts.batch} must be a multiple of --num-generations {opts.num_generations} for MC")
    if opts.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda but torch sees no GPU")
    if opts.episodes % opts.batch:
        raise SystemExit(f"--episodes {opts.episodes} must be a multiple of --batch {opts.batch}")


def emit(result: dict) -> None:
    """The harness's one line of output: JSON on the real stdout (the libraries' own prints were sent to stderr)."""
    sys.__stdout__.write(json.dumps(result, sort_keys=True) + "\n")
    sys.__stdout__.flush()
