"""Rollout throughput of a 2-agent team: HF generate() against transformers' continuous batching, vLLM and
generate() with a static cache and a compiled decode step, side by side.

    python benchmarks/gpu/gpu_speed.py --json /tmp/rollout.json                      # GPU: 0.5B agents, bf16
    python benchmarks/gpu/gpu_speed.py --size tiny --batches 4 8 --response-length 8  # a quick check on CPU
    python benchmarks/gpu/gpu_speed.py --model smollm2-135m-instruct --vllm --batches 8 16 --response-length 16  # vLLM
    python benchmarks/gpu/gpu_speed.py --static-cache --batches 16 64 256            # GPU: issue 21 part 4's lever

`--model`: a model path or name instead of the factory's random-init agents (vLLM needs head sizes its kernels
support: SmolLM2-135M-Instruct runs). `--vllm` adds a vLLM column (trl_collm/generation/vllm_backend.py; vLLM
installed as docs/generation.md says); `--static-cache` adds generate() with `cache_implementation="static"`, whose
decode step transformers compiles (no shared-prefix prefill there: that path hands generate() a dynamic cache).

Builds a MultiAgentPPOTrainer on two random-init agents from the offline factory (`--size 0.5b`: 24 layers, 1152
hidden, ~0.48B parameters each) and times `trainer.rollout(rows)` (prompts -> both agents' completions -> rewards,
the exact rollout a training iteration runs) at each batch size, with `generate()` and with continuous batching
(the same team; only the sampler's backend changes), alternating the backends: one warm-up call each, then
`--repeats` timed calls each. Answers run to the full `--response-length` (a stop token that is never sampled),
so tokens/s = batch x agents x response_length / seconds. Writes one JSON object (and prints a table); with
`--deadline` (a Unix time) it stops before starting a measurement it cannot finish in time, and keeps what it has.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class _StaticCacheGenerate:
    """generate() with the model's generation config switched to a static KV cache for the call (transformers then
    compiles the decode step once per shape)."""

    def __init__(self, **kwargs):
        from trl_collm.generation.backends import GenerateBackend

        self.inner = GenerateBackend(**kwargs)
        self.records_logprobs = self.inner.records_logprobs

    def generate(self, request):
        model = request.model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = base.generation_config
        previous = config.cache_implementation
        config.cache_implementation = "static"
        try:
            return self.inner.generate(request)
        finally:
            config.cache_implementation = previous

    def weights_changed(self):
        return None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="0.5b")
    p.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--response-length", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--cb-config",
        nargs="*",
        default=["{}"],
        help="JSON dicts for ContinuousBatchingConfig; each one is timed as its own column",
    )
    p.add_argument("--model", default=None, help="model path or name (default: the factory's --size agents)")
    p.add_argument("--vllm", action="store_true", help="add a vLLM column (use_vllm's backend)")
    p.add_argument("--static-cache", action="store_true", help="add generate() with a static cache + compiled step")
    p.add_argument("--deadline", type=float, default=None, help="Unix time by which to stop starting measurements")
    p.add_argument("--json", default=None)
    a = p.parse_args()

    from datasets import Dataset

    from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer
    from trl_collm.generation.backends import ContinuousBatchingBackend, GenerateBackend
    from trl_collm.generation.sampler import BackendOptions
    from trl_collm.testing import tiny_model_dir

    cuda = torch.cuda.is_available()
    path = a.model or tiny_model_dir(f"{a.size}-qwen2", size=a.size)
    rows = [f"write step {i} of the plan for the house" for i in range(max(a.batches))]
    args = MultiAgentPPOConfig(
        output_dir="/tmp/trl_collm_gpu_speed",
        agent_names=["alice", "bob"],
        per_device_train_batch_size=max(a.batches),
        local_rollout_forward_batch_size=max(a.batches),
        response_length=a.response_length,
        bf16=cuda,
        use_cpu=not cuda,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        num_sample_generations=0,
        stop_token_id=10**9,  # never sampled: every answer runs to response_length
        model_init_kwargs={"dtype": "bfloat16"} if cuda else None,
    )
    reward = lambda prompts, completions, **k: [float(len(c[0]) % 3) for c in completions]  # noqa: E731
    trainer = MultiAgentPPOTrainer(
        args=args, model=path, train_dataset=Dataset.from_dict({"prompt": rows}), reward_funcs=reward
    )
    team = trainer.team
    backends = {"generate": GenerateBackend.from_config(BackendOptions.from_args(args))}
    for i, config in enumerate(a.cb_config):
        backends["continuous_batching" + (f"_{i}" if i else "")] = ContinuousBatchingBackend(json.loads(config))
    if a.vllm:
        from trl_collm.generation.vllm_backend import VLLMBackend

        backends["vllm"] = VLLMBackend.from_config(BackendOptions.from_args(args))
    if a.static_cache:
        backends["generate_static_compiled"] = _StaticCacheGenerate(batch_size=max(a.batches), share_prefix=False)
    result = {
        "size": a.model or a.size,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "dtype": "bfloat16" if cuda else "float32",
        "response_length": a.response_length,
        "agents": len(team.names),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "cb_configs": a.cb_config,
        "batches": {},
    }

    def timed(backend: str, batch: int) -> float:
        trainer.sampler = dataclasses.replace(trainer.sampler, backend=backends[backend])
        _sync()
        t0 = time.perf_counter()
        roll = trainer.rollout([{"prompt": r} for r in rows[:batch]])
        _sync()
        seconds = time.perf_counter() - t0
        lengths = {int(roll.turns[0][n].gen.response_mask.sum()) for n in team.names}
        assert lengths == {batch * a.response_length}, f"{backend}: answers did not run to full length ({lengths})"
        return seconds

    def write():
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)

    last_cost = 0.0
    for batch in a.batches:
        if a.deadline is not None and time.time() + 1.5 * last_cost > a.deadline:
            result["stopped_before_batch"] = batch
            print(f"stopping before batch {batch}: the deadline would pass", flush=True)
            break
        t_batch = time.time()
        times = {name: [] for name in backends}
        warm = {}
        for name in list(backends):  # first calls: CUDA graphs, allocator, kernels
            try:
                warm[name] = timed(name, batch)
            except Exception as exc:  # noqa: BLE001 - one failing backend must not cost the other figures
                result.setdefault("errors", {})[name] = f"batch {batch}: {type(exc).__name__}: {exc}"[:2000]
                print(f"{name} failed at batch {batch}: {exc}", flush=True)
                del backends[name], times[name]
        for _ in range(a.repeats):
            for name in backends:
                times[name].append(timed(name, batch))
        tokens = batch * len(team.names) * a.response_length
        entry = {
            name: {
                "median_s": statistics.median(t),
                "tokens_per_s": tokens / statistics.median(t),
                "runs_s": t,
                "warmup_s": warm[name],
            }
            for name, t in times.items()
        }
        for name in backends:
            if "generate" in entry:
                entry[name]["speedup"] = entry[name]["tokens_per_s"] / entry["generate"]["tokens_per_s"]
        result["batches"][str(batch)] = entry
        print(
            f"batch {batch:>4}: "
            + "  ".join(
                f"{name} {entry[name]['tokens_per_s']:.1f} tok/s ({entry[name].get('speedup', 0):.2f}x)"
                for name in backends
            ),
            flush=True,
        )
        write()
        last_cost = time.time() - t_batch
        # The next batch is larger: its cost grows with the rows (generate) or less (continuous batching).
        last_cost *= 2.0
    write()


if __name__ == "__main__":
    main()
