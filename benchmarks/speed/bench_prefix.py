"""What `share_prompt_prefix` buys on the built-in tasks' real prompt shapes, measured side by side.

For each (task, trainer) case it builds the same 2-agent team twice, once with `share_prompt_prefix=True` (the
default) and once with False, and times training iterations on the same dataset rows, alternating the two run by
run (one warm-up iteration each, then `--iterations` timed ones). It also reports how many tokens the shared-prefix
cuts skipped out of the tokens the training forwards would otherwise compute (counted in `trl_collm.team.prefix`).

Cases (offline tiny random-init Qwen2 models, 16 new tokens per answer, batch 8 episodes):
- writing-summary, MC (G = 4): ~1,200-token prompts (instructions + a post); the G samples of a prompt repeat rows;
  as two separate models, and as two LoRA adapters on one base (one joint generate() over both adapters);
- code-humaneval, CC PPO: 2 turns, prompts = team instructions + a HumanEval problem (+ test feedback at turn 2);
- coord-penalty, CC PPO: short prompts behind one instruction (the vs-comlrl task's shape).

    python benchmarks/speed/bench_prefix.py                      # tiny, 3 timed iterations per side (~3 min on 2 cores)
    python benchmarks/speed/bench_prefix.py --sizes tiny small --iterations 2
    python benchmarks/speed/bench_prefix.py --smoke              # seconds; for CI

Prints a table and writes JSON with `--json PATH`. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CASES = {  # name: (task, trainer, team layout)
    "writing-summary/mc": ("writing-summary", "mc", "separate"),
    "writing-summary/mc-lora": ("writing-summary", "mc", "lora"),
    "code-humaneval/cc": ("code-humaneval", "cc", "separate"),
    "coord-penalty/cc": ("coord-penalty", "cc", "separate"),
}


class TokenCounter:
    """Wraps trl_collm.team.prefix.plan_split: tokens the forwards were given, and how many the chosen cut skipped."""

    def __init__(self):
        import trl_collm.team.prefix as prefix

        self.prefix, self.plain_split = prefix, prefix.plan_split
        self.total = self.saved = 0
        prefix.plan_split = self

    def __call__(self, ids, mask, *args, **kwargs):
        split = self.plain_split(ids, mask, *args, **kwargs)
        self.total += int(mask.sum())
        self.saved += split.saved_tokens if split is not None else 0
        return split

    def reset(self):
        self.total = self.saved = 0


def build(case: str, size: str, share: bool, opts, out_dir: str):
    from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer, MultiAgentPPOConfig, MultiAgentPPOTrainer
    from trl_collm.tasks import get_task
    from trl_collm.testing import tiny_model_dir

    task_name, kind, layout = CASES[case]
    task = get_task(task_name)
    paths = [tiny_model_dir(f"bench-qwen2-{size}-s{seed}", arch="qwen2", size=size, seed=seed) for seed in (0, 1)]
    team = dict(model=paths)
    if layout == "lora":
        from peft import LoraConfig

        team = dict(model=paths[0], peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    rows = task.load_dataset("train", limit=opts.batch * (opts.iterations + 1))
    common = dict(
        output_dir=out_dir,
        agent_names=list(task.agent_names),
        num_turns=task.num_turns,
        response_length=opts.response_length,
        learning_rate=1e-5,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        num_sample_generations=0,
        disable_tqdm=True,
        seed=0,
        share_prompt_prefix=share,
    )
    if kind == "mc":
        args = MultiAgentMCConfig(num_generations=4, per_device_train_batch_size=max(1, opts.batch // 4), **common)
        trainer = MultiAgentMCTrainer(args=args, train_dataset=rows, env=task.make_env(), **team)
    else:
        args = MultiAgentPPOConfig(preset="collm", per_device_train_batch_size=opts.batch, **common)
        trainer = MultiAgentPPOTrainer(args=args, train_dataset=rows, env=task.make_env(), **team)
    # training_iteration() outside train() needs the batch sizes and the optimizer that train() would set up.
    trainer._batch_sizes()
    trainer.create_optimizer_and_scheduler(
        num_training_steps=(opts.iterations + 1) * trainer.optimizer_steps_per_iteration()
    )
    return trainer, list(rows)


def time_iterations(trainer, rows, per_iteration: int, iterations: int, counter: TokenCounter) -> dict:
    trainer.training_iteration(rows[:per_iteration])  # warm-up: allocator, first-call costs
    counter.reset()
    times = []
    for i in range(1, iterations + 1):
        t0 = time.perf_counter()
        trainer.training_iteration(rows[i * per_iteration : (i + 1) * per_iteration])
        times.append(time.perf_counter() - t0)
    return dict(iteration_s=statistics.median(times), all_s=times, tokens=counter.total, saved=counter.saved)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--sizes", nargs="+", default=["tiny"], choices=["tiny", "small", "medium"])
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--batch", type=int, default=8, help="episodes per iteration (MC: prompts x G)")
    p.add_argument("--response-length", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None)
    p.add_argument("--smoke", action="store_true", help="one case per kind, 1 iteration, batch 4, 4 tokens")
    opts = p.parse_args(argv)
    if opts.smoke:
        opts.cases, opts.iterations, opts.batch, opts.response_length = (
            ["coord-penalty/cc", "writing-summary/mc"],
            1,
            4,
            4,
        )
    import torch
    import transformers

    torch.set_num_threads(opts.threads)
    transformers.logging.set_verbosity_error()
    counter = TokenCounter()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-prefix-") as tmp:
        for size in opts.sizes:
            for case in opts.cases:
                row = dict(case=case, size=size)
                for share in (True, False):  # alternating: one side right after the other, same rows and seed
                    trainer, rows = build(
                        case, size, share, opts, os.path.join(tmp, f"{case.replace('/', '-')}-{share}")
                    )
                    per_iteration = trainer.args.per_device_train_batch_size
                    row["shared" if share else "plain"] = time_iterations(
                        trainer, rows, per_iteration, opts.iterations, counter
                    )
                    del trainer
                sh, pl = row["shared"], row["plain"]
                row["speedup"] = pl["iteration_s"] / sh["iteration_s"]
                row["saved_fraction"] = sh["saved"] / sh["tokens"] if sh["tokens"] else 0.0
                results.append(row)
                print(
                    f"{size:5s} {case:20s} shared {sh['iteration_s']:7.3f}s  plain {pl['iteration_s']:7.3f}s  "
                    f"speed-up {row['speedup']:.2f}x  tokens skipped {100 * row['saved_fraction']:.0f}%",
                    flush=True,
                )
    print()
    print("| size | task / trainer | iteration s, shared | iteration s, plain | speed-up | forward tokens skipped |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['size']} | {r['case']} | {r['shared']['iteration_s']:.3f} | {r['plain']['iteration_s']:.3f} | "
            f"**{r['speedup']:.2f}x** | {100 * r['saved_fraction']:.0f}% |"
        )
    meta = dict(
        command="python benchmarks/speed/bench_prefix.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        machine=f"{platform.machine()}, {os.cpu_count()} cores",
        torch=torch.__version__,
        threads=opts.threads,
        batch=opts.batch,
        response_length=opts.response_length,
        iterations=opts.iterations,
    )
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(dict(meta=meta, results=results), f, indent=2)
        print(f"\nwrote {opts.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
