"""Throughput of one multi-agent PPO training iteration against bare generation.

For each model size it builds a 2-agent team (two separate models from the offline tiny-model factory, one
centralized critic) and times `trainer.training_iteration(rows)` for two configs:

- ``collm``:   ``MultiAgentPPOConfig(preset="collm")`` (turn-level CoLLM-CC: 1 epoch, REINFORCE rule, per-agent
               critic steps, no KL / no reference model);
- ``default``: the default config (turn-level CC critic, 4 PPO epochs, clipped ratio, KL to a reference copy).

Between iterations it times a bare ``model.generate()`` per agent on the same prompts with the same sampling
settings and ``max_new_tokens``, so "iteration / generate" says how much the training machinery costs on top of
sampling the same tokens. Generation is forced to the full ``response_length``: the stop token is set to an id
outside the vocabulary, which the model can never sample (so token counts are comparable across runs).

This is a benchmark, not a test. Examples::

    python benchmarks/speed/bench_iteration.py                     # tiny + small, 3 iterations, batch 8, 32 tokens, CPU
    python benchmarks/speed/bench_iteration.py --smoke              # seconds; for CI
    python benchmarks/speed/bench_iteration.py --device cuda --dtype bfloat16 --json bench.json
    python benchmarks/speed/bench_iteration.py --sizes small --profile   # + cProfile of one CC iteration
    python benchmarks/speed/bench_iteration.py --model smollm2-135m-instruct --lora --configs collm --batch 2 \
        --response-length 24 --threads 2            # the real model: a 2-agent LoRA team on one shared base

``--model`` takes a model folder or a packaged name (`trl_collm.team.pretrained`) in place of the tiny factory's sizes;
``--lora`` trains one LoRA adapter per agent (r=4 on q_proj / v_proj) on one shared base, the critic being one more
adapter with a value head (the library's default for a LoRA team), instead of separate full models.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import io
import json
import math
import os
import platform
import pstats
import resource
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

TARGET_RATIO = 3.0  # iteration / bare generate, for the turn-level CC preset
CONFIGS = ("collm", "default")


# ---------------------------------------------------------------------------------------------- helpers
def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (MiB)."""
    # ru_maxrss is KiB on Linux, bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def generated_tokens(roll) -> int:
    """The tokens a rollout's agents generated, over every turn (padding excluded)."""
    return int(sum(int(turn[a].gen.response_mask.sum()) for turn in roll.turns for a in roll.agent_names))


def _prompts(n: int, offset: int) -> list[str]:
    subjects = ["The planner", "The coder", "The critic", "Agent one", "Agent two", "The writer"]
    tasks = ["writes the plan", "checks the code", "fixes the answer", "shares the summary", "builds a function"]
    return [
        f"{subjects[(i + offset) % len(subjects)]} {tasks[(i * 3 + offset) % len(tasks)]} and the team gets a "
        f"reward of {i % 10}."
        for i in range(n)
    ]


def length_reward(prompts, completions, **kwargs):
    """Cheap per-agent reward: a little for every character, so the reward path costs ~nothing."""
    return [[len(c) / 100.0 for c in comp] for comp in completions]


# phase -> the trainer methods that run it, the first one a trainer has (PPO: rollout / score_rollout / update; MC:
# sample / score_tree / run_updates)
PHASE_METHODS = {
    "rollout": ("sample", "rollout"),
    "score_rollout": ("score_rollout", "score_tree"),
    "update": ("update", "run_updates"),
}


def flop_counter():
    """torch's FlopCounterMode (matmuls and attention, forward and backward), taught the CPU kernels that torch 2.13's
    registry lacks: its own attention kernels (it knows the CUDA flash / efficient ones; without them a CPU run would
    count no attention at all) and oneDNN's linear on a prepacked weight (`mkldnn._linear_pointwise`, what the
    frozen bf16 layers run without a graph, cpu/autocast_cache.py; without it a bf16 decode counted ~a tenth of its
    arithmetic). Counts are dense (a masked-out score counts as computed), as torch counts its own kernels."""
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten

    def forward(query, key, value, *args, out_shape=None, **kwargs):
        return fc.sdpa_flop_count(query, key, value)

    def backward(grad_out, query, key, value, *args, out_shape=None, **kwargs):
        return fc.sdpa_backward_flop_count(grad_out, query, key, value)

    def linear(x_shape, *args, out_shape=None, **kwargs):
        # x (..., K) times a (N, K) weight in oneDNN's layout: 2·K·N per row, read off the input and output shapes
        return 2 * math.prod(x_shape) * out_shape[-1]

    mapping = {
        aten._scaled_dot_product_flash_attention_for_cpu: forward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: backward,
    }
    if hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        mapping[torch.ops.mkldnn._linear_pointwise] = linear
    return fc.FlopCounterMode(display=False, custom_mapping=mapping)


class PhaseTimer:
    """Wraps each phase's trainer method (PHASE_METHODS; instance attributes, the library is untouched). With a
    `counter` (flop_counter(), entered around the iteration) it also sums each phase's FLOPs into `flops`."""

    def __init__(self, trainer, device: str):
        self.device = device
        self.times: dict[str, float] = {}
        self.cpu_times: dict[str, float] = {}
        self.flops: dict[str, int] = {}
        self.counter = None
        self.last_rollout = None
        self.phase = None  # the phase running now (count_weight_passes attributes the model calls it sees to it)
        self.passes: dict[str, int] = {}
        for phase, methods in PHASE_METHODS.items():
            method = next(m for m in methods if hasattr(trainer, m))
            setattr(trainer, method, self._wrap(phase, getattr(trainer, method)))

    def _wrap(self, name, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            _sync(self.device)
            t0, c0 = time.perf_counter(), time.process_time()
            f0 = self.counter.get_total_flops() if self.counter is not None else 0
            outer, self.phase = self.phase, name
            try:
                out = fn(*args, **kwargs)
            finally:
                self.phase = outer
            _sync(self.device)
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0
            self.cpu_times[name] = self.cpu_times.get(name, 0.0) + time.process_time() - c0
            if self.counter is not None:
                self.flops[name] = self.flops.get(name, 0) + self.counter.get_total_flops() - f0
            if name == "rollout":
                self.last_rollout = out
            return out

        return wrapped

    def reset(self):
        self.times = {}
        self.cpu_times = {}
        self.flops = {}
        self.passes = {}

    def count_weight_passes(self, module) -> int:
        """Count, per phase, how often the decoder layers' weights of `module` are read: once per forward of a
        layer stack, once more when it runs with gradients (its backward reads them again). Returns the bytes one
        pass reads (the layers' parameters, not the embeddings: a lower bound of what a forward moves)."""
        import torch

        self.passes = {}
        stacks = [m for m in module.modules() if isinstance(getattr(m, "layers", None), torch.nn.ModuleList)]
        stacks = [m for m in stacks if not any(m is not o and m in set(o.modules()) for o in stacks)]  # outermost

        def hook(stack, args, kwargs):
            if self.phase is not None:
                self.passes[self.phase] = self.passes.get(self.phase, 0) + (2 if torch.is_grad_enabled() else 1)

        for stack in stacks:
            stack.register_forward_pre_hook(hook, with_kwargs=True)
        # one stack is the shared base every agent and the critic run through (a LoRA team); bytes of its layers
        stack = stacks[0] if stacks else module
        return sum(p.numel() for layer in getattr(stack, "layers", []) for p in layer.parameters())


# ---------------------------------------------------------------------------------------------- one config
def _model_paths(size: str, opts) -> list[str]:
    """The two agents' folders: a real model (`--model`, both agents from it) or two tiny factory models."""
    if opts.model:
        from trl_collm.team.pretrained import resolve_model_name

        return [resolve_model_name(opts.model)] * 2
    from trl_collm.testing import tiny_model_dir

    return [tiny_model_dir(f"bench-qwen2-{size}-s{seed}", arch="qwen2", size=size, seed=seed) for seed in (0, 1)]


def build_trainer(config_name: str, size: str, opts, out_dir: str):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer
    from trl_collm.critics import critic_outputs

    paths = _model_paths(size, opts)
    tok = AutoTokenizer.from_pretrained(paths[0])
    dtype = torch.bfloat16 if opts.dtype == "bfloat16" else torch.float32
    on_cuda = opts.device == "cuda"
    common = dict(
        output_dir=out_dir,
        per_device_train_batch_size=opts.batch,
        num_agents=2,
        response_length=opts.response_length,
        # An id outside the vocabulary is never sampled: every response runs to response_length tokens.
        stop_token_id=len(tok),
        use_cpu=not on_cuda,
        bf16=opts.dtype == "bfloat16",
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        num_sample_generations=0,
        seed=opts.seed,
        disable_tqdm=True,
    )
    if config_name == "collm":
        args = MultiAgentPPOConfig(preset="collm", **common)
    else:
        args = MultiAgentPPOConfig(**common)
    device = "cuda" if on_cuda else "cpu"
    if opts.lora:
        from peft import LoraConfig

        # One base in the chosen dtype; the library adds an adapter per agent and the critic's adapter + head.
        models = AutoModelForCausalLM.from_pretrained(paths[0], dtype=dtype).to(device)
        team_kwargs = dict(peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    else:
        models = [AutoModelForCausalLM.from_pretrained(p, dtype=dtype).to(device) for p in paths]
        # Build the critic ourselves only to give it the same dtype as the actors (the library would load it from
        # agent 0's folder in the checkpoint's dtype); same model class and number of outputs as the default.
        value_model = AutoModelForSequenceClassification.from_pretrained(
            paths[0], num_labels=critic_outputs(args, 2), dtype=dtype
        ).to(device)
        team_kwargs = dict(value_model=value_model)
    from datasets import Dataset

    ds = Dataset.from_dict({"prompt": _prompts(opts.batch, 0)})
    trainer = MultiAgentPPOTrainer(
        args=args,
        processing_class=tok,
        model=models,
        train_dataset=ds,
        reward_funcs=length_reward,
        **team_kwargs,
    )
    trainer._batch_sizes()
    total_iterations = opts.iterations + opts.warmup
    args.total_episodes = total_iterations * args.batch_size
    args.num_total_batches = total_iterations
    trainer.create_optimizer_and_scheduler(
        num_training_steps=total_iterations * trainer.optimizer_steps_per_iteration()
    )
    return trainer


@torch.no_grad()
def bare_generate(trainer, rows: list[dict], device: str) -> tuple[float, float, int]:
    """generate() per agent on the rollout's prompts with the rollout's kwargs; returns (seconds, CPU seconds of this
    process, new tokens)."""
    team = trainer.team
    prompts = [r["prompt"] for r in rows]
    tokens = 0
    _sync(device)
    t0, c0 = time.perf_counter(), time.process_time()
    for a in team.names:
        with team.active(a) as model:  # a separate model, or the shared base with agent a's adapter on
            model.eval()
            ids, mask = team.encode(a, prompts, trainer.accelerator.device)
            kwargs = trainer.sampler.settings.generate_kwargs(team.pad_id(a))
            out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        tokens += out[:, ids.shape[1] :].numel()
    _sync(device)
    return time.perf_counter() - t0, time.process_time() - c0, tokens


def run_config(config_name: str, size: str, opts) -> dict:
    if opts.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(opts.seed)
    with tempfile.TemporaryDirectory(prefix="bench-iter-") as out_dir:
        t_build = time.perf_counter()
        trainer = build_trainer(config_name, size, opts, out_dir)
        t_build = time.perf_counter() - t_build
        timer = PhaseTimer(trainer, opts.device)
        first = trainer.team.model_of(trainer.team.names[0])
        n_params = sum(p.numel() for n, p in first.named_parameters() if "lora_" not in n)
        iter_s, gen_s, tokens, gen_tokens, phases = [], [], [], [], []
        # CPU seconds of this process: on a shared machine, with one thread, about what an idle run takes
        iter_cpu, gen_cpu, phases_cpu = [], [], []
        for i in range(opts.warmup + opts.iterations):
            rows = [{"prompt": p} for p in _prompts(opts.batch, offset=i)]
            timer.reset()
            _sync(opts.device)
            t0, c0 = time.perf_counter(), time.process_time()
            trainer.training_iteration(rows)
            _sync(opts.device)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            roll = timer.last_rollout
            n_tok = generated_tokens(roll)
            g_dt, g_cpu, g_tok = bare_generate(trainer, rows, opts.device)
            if i < opts.warmup:
                continue
            iter_s.append(dt)
            gen_s.append(g_dt)
            iter_cpu.append(dc)
            gen_cpu.append(g_cpu)
            tokens.append(n_tok)
            gen_tokens.append(g_tok)
            phases.append(dict(timer.times, other=dt - sum(timer.times.values())))
            phases_cpu.append(dict(timer.cpu_times, other=dc - sum(timer.cpu_times.values())))
        profile_text = None
        if opts.profile and config_name in opts.profile_configs:
            rows = [{"prompt": p} for p in _prompts(opts.batch, offset=99)]
            prof = cProfile.Profile()
            prof.enable()
            trainer.training_iteration(rows)
            _sync(opts.device)
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(opts.profile_top)
            profile_text = buf.getvalue()
        args = trainer.args
        result = dict(
            size=size,
            config=config_name,
            params_per_agent=n_params,
            actor_dtype=str(next(first.parameters()).dtype),
            critic_dtype=str(next(trainer.critic.unit_parameters()["central"].__iter__()).dtype),
            batch=opts.batch,
            response_length=opts.response_length,
            iterations=len(iter_s),
            optimizer_steps_per_iteration=trainer.optimizer_steps_per_iteration(),
            num_ppo_epochs=args.num_ppo_epochs,
            advantage_level=args.advantage_level,
            policy_loss_type=args.policy_loss_type,
            critic_updates=args.critic_updates,
            kl_coef=args.kl_coef,
            build_s=t_build,
            # Medians (and minima) rather than means: on a shared CPU one slow round would dominate a mean.
            iteration_s=statistics.median(iter_s),
            iteration_s_min=min(iter_s),
            iteration_s_all=iter_s,
            generate_s=statistics.median(gen_s),
            generate_s_min=min(gen_s),
            generate_s_all=gen_s,
            iteration_cpu_s=statistics.median(iter_cpu),
            generate_cpu_s=statistics.median(gen_cpu),
            generated_tokens=sum(tokens) / len(tokens),
            bare_generate_tokens=sum(gen_tokens) / len(gen_tokens),
            phases_s={
                k: statistics.median(p.get(k, 0.0) for p in phases)
                for k in ("rollout", "score_rollout", "update", "other")
            },
            phases_cpu_s={
                k: statistics.median(p.get(k, 0.0) for p in phases_cpu)
                for k in ("rollout", "score_rollout", "update", "other")
            },
            peak_rss_mib=peak_rss_mib(),
            cuda_max_allocated_mib=torch.cuda.max_memory_allocated() / 2**20 if opts.device == "cuda" else None,
        )
        result["episodes_per_s"] = opts.batch / result["iteration_s"]
        result["tokens_per_s"] = result["generated_tokens"] / result["iteration_s"]
        result["ratio"] = result["iteration_s"] / result["generate_s"]
        result["ratio_min"] = result["iteration_s_min"] / result["generate_s_min"]
        result["ratio_cpu"] = result["iteration_cpu_s"] / result["generate_cpu_s"]
        result["profile"] = profile_text
        del trainer, timer, first
    gc.collect()
    return result


# ---------------------------------------------------------------------------------------------- report
def print_table(results: list[dict], opts) -> None:
    head = (
        f"{'size':<6} {'config':<8} {'ep/s':>7} {'gen tok/s':>10} {'iter s':>8} {'gen s':>8} {'iter/gen':>9} "
        f"{'(min)':>6} "
        f"{'rollout':>8} {'score':>7} {'update':>7} {'other':>7} {'steps':>5} {'RSS MiB':>8}"
    )
    if opts.device == "cuda":
        head += f" {'cuda MiB':>9}"
    print(head)
    print("-" * len(head))
    for r in results:
        ph = r["phases_s"]
        line = (
            f"{r['size']:<6} {r['config']:<8} {r['episodes_per_s']:>7.2f} {r['tokens_per_s']:>10.1f} "
            f"{r['iteration_s']:>8.3f} {r['generate_s']:>8.3f} {r['ratio']:>9.2f} {r['ratio_min']:>6.2f} "
            f"{ph['rollout']:>8.3f} {ph['score_rollout']:>7.3f} {ph['update']:>7.3f} {ph['other']:>7.3f} "
            f"{r['optimizer_steps_per_iteration']:>5d} {r['peak_rss_mib']:>8.0f}"
        )
        if opts.device == "cuda":
            line += f" {r['cuda_max_allocated_mib']:>9.0f}"
        print(line)
    print()
    print("ep/s, gen tok/s: episodes and generated tokens (sum of response masks, all agents) per second of iteration.")
    print(
        "iter s: median training_iteration wall time (rollout + scoring + update); gen s: median bare model.generate()"
    )
    print(
        "of the same prompts for every agent, same sampling and max_new_tokens. iter/gen: ratio of medians; (min): "
        "ratio"
    )
    print(
        "of the fastest rounds (less sensitive to a busy machine). rollout/score/update/other: median split of iter s."
    )
    print("steps: optimizer steps per iteration. RSS: process peak so far (cumulative, not per row).")
    print()
    if opts.smoke:
        print(
            "(--smoke: 4-token responses, so fixed per-iteration costs dominate; the target is meant for the "
            "default run)"
        )
    for r in results:
        if r["config"] != "collm":
            continue
        verdict = "OK" if r["ratio"] <= TARGET_RATIO else "ABOVE TARGET"
        if opts.smoke:
            verdict += " (smoke: not meaningful)"
        print(
            f"target ({r['size']}): iteration/generate <= {TARGET_RATIO:g} for the turn-level CC preset: "
            f"{r['ratio']:.2f} -> {verdict}"
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=["tiny", "small", "0.5b"])
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--iterations", type=int, default=3, help="timed iterations (after --warmup)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--batch", type=int, default=8, help="episodes per iteration (per_device_train_batch_size)")
    p.add_argument("--response-length", type=int, default=32)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--json", default=None, help="write the results to this file")
    p.add_argument("--profile", action="store_true", help="cProfile one extra iteration and print the top functions")
    p.add_argument("--profile-configs", nargs="+", default=["collm"], choices=list(CONFIGS))
    p.add_argument("--profile-top", type=int, default=25)
    p.add_argument("--smoke", action="store_true", help="tiny only, 1 iteration, batch 2, response length 4")
    p.add_argument("--model", default=None, help="a model folder or packaged name (e.g. smollm2-135m-instruct)")
    p.add_argument("--lora", action="store_true", help="one LoRA adapter per agent on one shared base")
    opts = p.parse_args(argv)
    if opts.model:
        opts.sizes = [os.path.basename(os.path.normpath(opts.model))[:6]]  # the table's label
    if opts.smoke:
        opts.sizes, opts.iterations, opts.batch, opts.response_length = ["tiny"], 1, 2, 4
    if opts.iterations < 1:
        p.error("--iterations must be >= 1")
    if opts.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch.cuda.is_available() is False")
    if opts.threads:
        torch.set_num_threads(opts.threads)

    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    print(
        f"bench_iteration: torch {torch.__version__}, transformers {transformers.__version__}, python "
        f"{platform.python_version()}, "
        f"device {opts.device}{' (' + torch.cuda.get_device_name() + ')' if opts.device == 'cuda' else ''}, "
        f"dtype {opts.dtype}, threads {torch.get_num_threads()}"
    )
    print(
        f"2 agents ({'LoRA adapters on one shared ' if opts.lora else 'separate '}{opts.model or 'qwen2'} "
        f"model{'' if opts.lora else 's'}) + centralized critic; batch {opts.batch}, response_length "
        f"{opts.response_length}, "
        f"{opts.warmup} warm-up + {opts.iterations} timed iterations per config"
    )
    print()
    results = []
    t_all = time.perf_counter()
    for size in opts.sizes:
        for config_name in opts.configs:
            r = run_config(config_name, size, opts)
            print(
                f"  done {size}/{config_name}: iteration {r['iteration_s']:.3f}s, generate {r['generate_s']:.3f}s "
                f"(CPU {r['iteration_cpu_s']:.3f}s / {r['generate_cpu_s']:.3f}s: ratio {r['ratio_cpu']:.2f}) "
                f"(params/agent {r['params_per_agent']:,}, {r['actor_dtype']}/{r['critic_dtype']}, build "
                f"{r['build_s']:.1f}s)",
                flush=True,
            )
            results.append(r)
    print()
    print_table(results, opts)
    print(f"\ntotal wall time {time.perf_counter() - t_all:.1f}s")
    for r in results:
        if r["profile"]:
            print(f"\n==== cProfile: {r['size']}/{r['config']} (one iteration, sorted by tottime) ====")
            print(r["profile"])
    if opts.json:
        meta = dict(
            torch=torch.__version__,
            transformers=transformers.__version__,
            device=opts.device,
            dtype=opts.dtype,
            threads=torch.get_num_threads(),
            target_ratio=TARGET_RATIO,
            argv=sys.argv[1:],
        )
        with open(opts.json, "w") as f:
            json.dump(
                dict(meta=meta, results=[{k: v for k, v in r.items() if k != "profile"} for r in results]), f, indent=2
            )
        print(f"wrote {opts.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
