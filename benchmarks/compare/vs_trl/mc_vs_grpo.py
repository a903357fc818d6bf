"""MultiAgentMCTrainer with one agent against TRL's GRPOTrainer: same task, model, reward, G, completion length,
prompts per step, learning rate and beta = 0, side by side, alternating runs.

    python benchmarks/compare/vs_trl/mc_vs_grpo.py                          # tiny model, 3 rounds, CPU
    python benchmarks/compare/vs_trl/mc_vs_grpo.py --size small --rounds 2 --json docs/data/vs_trl_mc_grpo_cpu.json
    python benchmarks/compare/vs_trl/mc_vs_grpo.py --model smollm2-135m-instruct --lora --dtype bf16 \\
        --steps 6 --prompts 2 --group 4 --completion-length 24 --rounds 2 --sides ours trl   # the real model

Each run is a fresh process (`--side ours|ours-plain|trl`), so its peak RSS is its own. Both sides sample G
completions of exactly --completion-length tokens per prompt (a stop token that is never sampled), reward them with
the same function (the share of the letter "e" in the text), normalise within the group by mean and std, and take one
optimizer step per batch (AdamW, the same learning rate, no KL, no reference model, activation checkpointing off).
`--loss-type` (default "grpo") is the same on both sides: GRPO's loss (each completion's token mean, averaged over
completions); with one optimizer step per generation neither side computes old log-probs (the ratio is 1 and its
gradient is the policy gradient's). Ours can also run "reinforce" (TRL then keeps "grpo"; the normalisations differ,
which changes the gradient's scale, not the work). `ours-plain` is ours with `share_prompt_prefix=False`.

`--model` takes a packaged model's name (`smollm2-135m-instruct`, resolved by trl_collm) or a folder; without it the
offline factory's random-init Qwen2 of `--size`. `--lora` puts the same LoraConfig on both sides (r 8, alpha 16,
q_proj / v_proj, no dropout). `--dtype bf16` trains under bf16 autocast on both sides (`bf16=True`, CPU included);
the weights stay float32.

Reported per side: CPU seconds per completion over `train()` (time.process_time in the child, --threads torch
threads; median over rounds), completions per wall second, peak RSS, the CPU seconds by phase (rollout: sampling,
reward and advantages; loss: the update's forwards and backwards; optimizer: AdamW's steps; other: the rest, e.g.
gradient clipping, logging) from timers wrapped around each trainer's own methods, the dtype the decoder's matmuls
ran in per phase, and the mean reward per step (learning curve, averaged over rounds). `--profile N` runs one more
pass per side (--profile-steps steps) under torch.profiler and prints each phase's N most expensive operators (self
CPU time).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))  # benchmarks/compare/<this folder>
PROMPTS = [
    f"Write {w} words about the {t}:" for w in ("three", "five", "seven", "ten") for t in ("sea", "tree", "cat", "city")
]
PHASES = ("rollout", "loss", "optimizer")


def reward_text(text: str) -> float:
    return text.count("e") / max(1, len(text))


class PhaseTimer:
    """CPU seconds (time.process_time) spent in named phases, each exclusive of the phases nested in it, optionally
    labelled for torch.profiler (record_function) so that operators can be charged to their phase."""

    def __init__(self, label_for_profiler: bool = False):
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.stack: list[list] = []  # [name, start, nested seconds, record_function or None]
        self.label = label_for_profiler

    @property
    def current(self) -> str:
        return self.stack[-1][0] if self.stack else "other"

    def begin(self, name: str) -> None:
        rf = None
        if self.label:
            import torch

            rf = torch.profiler.record_function(f"phase::{name}")
            rf.__enter__()
        self.stack.append([name, time.process_time(), 0.0, rf])

    def end(self) -> None:
        name, start, nested, rf = self.stack.pop()
        if rf is not None:
            rf.__exit__(None, None, None)
        spent = time.process_time() - start
        self.cpu[name] += spent - nested
        self.calls[name] += 1
        if self.stack:
            self.stack[-1][2] += spent

    def wrap(self, obj, method: str, name: str) -> None:
        """Times `obj.method` (an instance attribute shadows the class's, so the trainer's own calls go through it)."""
        fn = getattr(obj, method)

        def timed(*args, **kwargs):
            self.begin(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self.end()

        setattr(obj, method, timed)

    def time_optimizer_steps(self) -> None:
        """Every optimizer's step(), through torch's global hooks (the optimizer is built inside train())."""
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(lambda opt, args, kwargs: self.begin("optimizer"))
        register_optimizer_step_post_hook(lambda opt, args, kwargs: self.end())


def watch_matmul_dtype(model, timer: PhaseTimer, seen: dict) -> None:
    """Records, per phase, the dtype of the first decoder layer's MLP down-projection output (a frozen linear on
    both sides): bfloat16 when that phase's matmuls ran under bf16 autocast."""
    for name, module in model.named_modules():
        if name.endswith("layers.0.mlp.down_proj"):
            module.register_forward_hook(lambda m, i, out: seen.setdefault(timer.current, set()).add(str(out.dtype)))
            return


def model_path(a) -> str:
    if a.model:
        from trl_collm.team.pretrained import resolve_model_name

        return resolve_model_name(a.model)
    from trl_collm.testing import tiny_model_dir

    return tiny_model_dir(f"{a.size}-qwen2", size=a.size) if a.size != "tiny" else tiny_model_dir("tiny-qwen2")


def build_trainer(a, path: str, tok, data, out: str):
    common = {
        "output_dir": out,
        "learning_rate": a.lr,
        "temperature": 1.0,
        "top_p": 1.0,
        "use_cpu": True,
        "bf16": a.dtype == "bf16",
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 1,
        "seed": a.seed,
        "disable_tqdm": True,
        "weight_decay": 0.0,
        "gradient_checkpointing": False,  # TRL turns it on by default; ours does not checkpoint
    }
    peft_config = None
    if a.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
        )
    never = len(tok)  # a token id the model never samples: every completion runs to the full length
    if a.side == "trl":
        from trl import GRPOConfig, GRPOTrainer

        def reward(prompts, completions, **kwargs):
            return [reward_text(c) for c in completions]

        args = GRPOConfig(
            num_generations=a.group,
            per_device_train_batch_size=a.prompts * a.group,
            max_completion_length=a.completion_length,
            beta=0.0,
            loss_type="grpo",
            scale_rewards="group",
            max_steps=a.steps,
            generation_kwargs={"eos_token_id": never},
            **common,
        )
        return GRPOTrainer(
            model=path,
            reward_funcs=reward,
            args=args,
            train_dataset=data,
            processing_class=tok,
            peft_config=peft_config,
        )
    from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer

    def reward(prompts, completions, **kwargs):  # a one-agent team hands each episode's text as a string
        return [reward_text(c if isinstance(c, str) else c[0]) for c in completions]

    args = MultiAgentMCConfig(
        num_agents=1,
        num_generations=a.group,
        per_device_train_batch_size=a.prompts,
        response_length=a.completion_length,
        beta=0.0,
        loss_type=a.loss_type,
        # GRPO's group std (unbiased, + 1e-4) with a GRPO loss type; the older std scaling with reinforce
        **({"scale_rewards": "group"} if a.loss_type != "reinforce" else {"scale_advantages": True}),
        total_episodes=a.prompts * a.steps,
        stop_token_id=never,
        share_prompt_prefix=a.side != "ours-plain",
        **common,
    )
    return MultiAgentMCTrainer(args=args, model=path, reward_funcs=reward, train_dataset=data, peft_config=peft_config)


def time_phases(trainer, side: str, timer: PhaseTimer) -> None:
    if side == "trl":  # training_step draws a new generation batch when its buffer is empty, then forward + backward
        timer.wrap(trainer, "_generate_and_score_completions", "rollout")
        timer.wrap(trainer, "training_step", "loss")
    else:  # one iteration = sample (generate + reward), score_tree (advantages), the update's _accumulate
        timer.wrap(trainer, "sample", "rollout")
        timer.wrap(trainer, "score_tree", "rollout")
        timer.wrap(trainer, "_accumulate", "loss")
    timer.time_optimizer_steps()


def profile_table(prof, top: int) -> dict[str, list]:
    """Self CPU ms per operator, charged to the innermost phase label above it; each phase's `top` operators."""
    per: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for evt in prof.events():
        if evt.name.startswith("phase::"):
            continue
        phase, up = "other", evt.cpu_parent
        while up is not None:
            if up.name.startswith("phase::"):
                phase = up.name[len("phase::") :]
                break
            up = up.cpu_parent
        per[phase][evt.name] += evt.self_cpu_time_total / 1000
    return {
        phase: [[name, round(ms, 1)] for name, ms in sorted(ops.items(), key=lambda kv: -kv[1])[:top]]
        + [["(all operators)", round(sum(ops.values()), 1)]]
        for phase, ops in per.items()
    }


def run_side(a) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer

    torch.set_num_threads(a.threads)
    path = model_path(a)
    tok = AutoTokenizer.from_pretrained(path)
    data = Dataset.from_dict({"prompt": (PROMPTS * (1 + a.prompts * a.steps // len(PROMPTS)))[: a.prompts * a.steps]})
    out = tempfile.mkdtemp(prefix=f"vs-trl-{a.side}-")
    torch.manual_seed(a.seed)
    trainer = build_trainer(a, path, tok, data, out)
    timer = PhaseTimer(label_for_profiler=a.profile > 0)
    time_phases(trainer, a.side, timer)
    seen: dict[str, set] = {}
    watch_matmul_dtype(trainer.model, timer, seen)
    prof = None
    if a.profile:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        prof.__enter__()
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    if prof is not None:
        prof.__exit__(None, None, None)
    if a.side == "trl":
        curve = [h["reward"] for h in trainer.state.log_history if "reward" in h]
        length = statistics.mean(
            h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h
        )
    else:
        curve = [h["objective/scores"] for h in trainer.metrics_history]
        length = statistics.mean(h["response_length"] for h in trainer.metrics_history)
    # Both generate exactly --completion-length tokens (the stop token is never sampled); TRL's loss mask also ends at
    # the tokenizer's EOS when the model samples it mid-way (rarely), so its mean length can be slightly lower.
    assert length > 0.9 * a.completion_length, (
        f"{a.side}: completions averaged {length} tokens of {a.completion_length}"
    )
    completions = a.steps * a.prompts * a.group
    phases = {p: timer.cpu.get(p, 0.0) for p in PHASES}
    phases["other"] = cpu - sum(phases.values())
    return {
        "side": a.side,
        "train_s": seconds,
        "train_cpu_s": cpu,
        "completions": completions,
        "cpu_s_per_completion": cpu / completions,
        "completions_per_s": completions / seconds,
        "phase_cpu_s": phases,
        "phase_calls": dict(timer.calls),
        "matmul_dtype_by_phase": {k: sorted(v) for k, v in seen.items()},
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "reward_curve": curve,
        "mean_completion_tokens": length,
        "profile_top_ops_ms": profile_table(prof, a.profile) if prof is not None else None,
    }


def cpu_line() -> dict:
    from trl_collm.hardware import cpu_description, cpu_flags, cpu_has_native_bf16

    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8")
    model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    return {
        "model": model,
        "description": cpu_description(),
        "flags": [f for f in wanted if f in cpu_flags()],
        "native_bf16": cpu_has_native_bf16(),
        "cores": os.cpu_count(),
    }


def summarise(runs: dict[str, list[dict]]) -> dict:
    summary = {}
    for side, rs in runs.items():
        if not rs:
            continue
        curves = [r["reward_curve"] for r in rs]
        summary[side] = {
            "cpu_s_per_completion": statistics.median(r["cpu_s_per_completion"] for r in rs),
            "cpu_s_per_completion_runs": [round(r["cpu_s_per_completion"], 4) for r in rs],
            "train_cpu_s": statistics.median(r["train_cpu_s"] for r in rs),
            "completions_per_s": statistics.median(r["completions_per_s"] for r in rs),
            "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in rs),
            "phase_cpu_s_per_completion": {
                p: statistics.median(r["phase_cpu_s"][p] / r["completions"] for r in rs) for p in (*PHASES, "other")
            },
            "matmul_dtype_by_phase": rs[0]["matmul_dtype_by_phase"],
            "reward_curve": [statistics.mean(c[i] for c in curves) for i in range(min(len(c) for c in curves))],
        }
    return summary


def print_summary(summary: dict) -> None:
    base = summary.get("trl", {}).get("cpu_s_per_completion")
    print(
        f"\n{'side':<11} {'CPU s/compl':>11} {'TRL / this':>10} {'compl/wall s':>12} {'peak RSS MiB':>12}"
        f"  {'rollout':>7} {'loss':>6} {'optim':>6} {'other':>6}  (CPU s per completion)"
    )
    for side, s in summary.items():
        ratio = f"{base / s['cpu_s_per_completion']:.2f}" if base else "-"
        ph = s["phase_cpu_s_per_completion"]
        print(
            f"{side:<11} {s['cpu_s_per_completion']:>11.3f} {ratio:>10} {s['completions_per_s']:>12.2f}"
            f" {s['peak_rss_mib']:>12.0f}  {ph['rollout']:>7.3f} {ph['loss']:>6.3f} {ph['optimizer']:>6.3f}"
            f" {ph['other']:>6.3f}"
        )
    for side, s in summary.items():
        dtypes = ", ".join(f"{k}: {'/'.join(v)}" for k, v in sorted(s["matmul_dtype_by_phase"].items()))
        curve = " ".join(f"{v:.3f}" for v in s["reward_curve"])
        print(f"{side:<11} matmul dtype by phase: {dtypes}; reward per step (mean of rounds): {curve}")


def print_profile(side: str, table: dict) -> None:
    print(f"\nprofile, {side} (self CPU ms per operator, by phase; under the profiler, so slower than the timed runs):")
    for phase in (*PHASES, "other"):
        ops = table.get(phase)
        if ops:
            print(f"  {phase}: " + "; ".join(f"{name} {ms:.0f}" for name, ms in ops))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", choices=["ours", "ours-plain", "trl"], default=None, help="(internal) run one side")
    p.add_argument("--sides", nargs="+", default=["ours", "trl", "ours-plain"])
    p.add_argument("--size", default="tiny", help="the factory's random-init model (without --model)")
    p.add_argument("--model", default=None, help="a packaged model's name (smollm2-135m-instruct) or a folder")
    p.add_argument("--lora", action="store_true", help="LoRA r 8, alpha 16 on q_proj / v_proj, on both sides")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="bf16: bf16 autocast on both sides")
    p.add_argument("--loss-type", choices=["grpo", "reinforce"], default="grpo", help="ours' loss (TRL: grpo)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--group", type=int, default=4, help="G: completions per prompt")
    p.add_argument("--completion-length", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", type=int, default=0, help="after the rounds, one profiled run per side: top N ops")
    p.add_argument("--profile-steps", type=int, default=2, help="steps of the profiled run (its events fill memory)")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if a.side:
        print(json.dumps(run_side(a)))
        return
    cpu = cpu_line()
    print(f"CPU: {cpu['model']}, {cpu['cores']} cores; flags: {' '.join(cpu['flags'])}; {cpu['description']}")
    if a.dtype == "bf16" and not cpu["native_bf16"]:
        print("warning: this CPU has no native bf16: bf16 autocast is emulated (slow) on both sides", flush=True)
    skip = ("side", "sides", "rounds", "json", "profile", "profile_steps", "lora", "model")
    forwarded = [f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items() if k not in skip]
    forwarded += (["--lora"] if a.lora else []) + ([f"--model={a.model}"] if a.model else [])
    env = dict(
        os.environ,
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        WANDB_MODE="disabled",
        OMP_NUM_THREADS=str(a.threads),
    )

    def child(side: str, extra: list[str]) -> dict:
        proc = subprocess.run(
            [sys.executable, __file__, "--side", side, *forwarded, *extra],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise SystemExit(f"{side} failed:\n{proc.stderr[-4000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    runs: dict[str, list[dict]] = {s: [] for s in a.sides}
    for r in range(a.rounds):
        for side in a.sides if r % 2 == 0 else list(reversed(a.sides)):  # alternate who goes first
            runs[side].append(child(side, []))
            last = runs[side][-1]
            print(
                f"round {r} {side}: {last['cpu_s_per_completion']:.3f} CPU s per completion "
                f"({last['train_cpu_s']:.1f} CPU s, {last['train_s']:.1f} wall s)",
                flush=True,
            )
    summary = summarise(runs)
    print_summary(summary)
    record = {"args": vars(a), "cpu": cpu, "summary": summary, "runs": runs, "profiles": {}}
    save(a.json, record)
    for side in a.sides if a.profile else []:
        record["profiles"][side] = child(side, [f"--profile={a.profile}", f"--steps={a.profile_steps}"])
        print_profile(side, record["profiles"][side]["profile_top_ops_ms"])
        save(a.json, record)


def save(path: str | None, record: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
