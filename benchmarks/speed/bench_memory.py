"""Peak memory of one training iteration as the team grows: n = 1, 2, 4, 8 agents plus a centralized critic.

Layouts:
- separate: one full model per agent + a full value model as critic (the reference library's structure);
- lora: one frozen shared base, one LoRA adapter per agent, the critic as one more adapter + a value head;
- comlrl: the reference library itself (comlrl 1.4.3's MAACTrainer: n full agents + one full critic), run by
  benchmarks/compare/vs_comlrl/memory_theirs.py in its own virtualenv
  (bash benchmarks/compare/vs_comlrl/setup_env.sh first).

Each configuration runs in a fresh subprocess (peak RSS is per process): build the trainer, run one training
iteration, report the peak RSS and the RSS right after imports (the interpreter + torch baseline).

    python benchmarks/speed/bench_memory.py                     # medium models (~45M params), n = 1 2 4 8, both layouts
    python benchmarks/speed/bench_memory.py --size tiny --agents 1 2 --smoke
    python benchmarks/speed/bench_memory.py --layouts separate lora comlrl   # with the reference library's growth
    python benchmarks/speed/bench_memory.py --model smollm2-135m-instruct --agents 2 --layouts lora   # the real model
    python benchmarks/speed/bench_memory.py --model smollm2-135m-instruct --logprobs --batch 8 --response-length 64

`--model` takes a model folder or a packaged name (`trl_collm.team.pretrained`) instead of the tiny factory's `--size`.
`--logprobs` measures the policy-loss forward + backward alone (one agent of a LoRA team, `--batch` rows of
`--response-length` tokens): the library's `AgentTeam.logprobs` (gather minus logsumexp, entropy without grad)
against the textbook way (log-softmax over the whole vocabulary, gather, entropy with grad), as the peak resident
memory above the level before the call (VmHWM reset through /proc/self/clear_refs).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
COMLRL = os.path.join(os.path.dirname(HERE), "compare", "vs_comlrl")  # the reference library's side


def rss_mib() -> float:
    """Peak resident memory of this process so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mib() -> float:
    """Resident memory now (the baseline: a peak would include transient import-time allocations)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return rss_mib()


def model_path(size: str, model: str | None) -> str:
    """A real model (`--model`: a folder or packaged name) or the tiny factory's model of `size`."""
    if model:
        from trl_collm.team.pretrained import resolve_model_name

        return resolve_model_name(model)
    from trl_collm.testing import tiny_model_dir

    return tiny_model_dir(f"{size}-qwen2", size=size)


def child(layout: str, n: int, size: str, batch: int, length: int, model: str | None = None) -> dict:
    import torch

    torch.set_num_threads(1)
    from datasets import Dataset
    from peft import LoraConfig

    from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer

    path = model_path(size, model)
    import gc

    gc.collect()
    baseline = current_rss_mib()
    args = MultiAgentPPOConfig(
        output_dir="/tmp/trl_collm_bench_memory",
        agent_names=[f"agent_{i}" for i in range(n)],
        preset="collm",
        centralized_value="team",
        per_device_train_batch_size=batch,
        response_length=length,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        num_sample_generations=0,
    )
    kw = (
        dict(peft_config=LoraConfig(r=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
        if layout == "lora"
        else {}
    )
    reward = lambda prompts, completions, **k: [float(len(c[0]) % 3) for c in completions]  # noqa: E731
    trainer = MultiAgentPPOTrainer(
        args=args,
        model=path,
        train_dataset=Dataset.from_dict({"prompt": ["write a plan"] * batch}),
        reward_funcs=reward,
        **kw,
    )
    built = rss_mib()
    trainer._batch_sizes()
    trainer.create_optimizer_and_scheduler(num_training_steps=1)
    t0 = time.time()
    trainer.training_iteration([{"prompt": f"write plan {i}"} for i in range(batch)])
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.model.parameters())
    return dict(
        layout=layout,
        agents=n,
        size=size,
        baseline_rss_mib=baseline,
        built_rss_mib=built,
        peak_rss_mib=rss_mib(),
        iteration_s=time.time() - t0,
        trainable_params=trainable,
        total_params=total,
    )


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="medium")
    p.add_argument("--agents", nargs="+", type=int, default=[1, 2, 4, 8])
    p.add_argument("--layouts", nargs="+", default=["separate", "lora"], choices=["separate", "lora", "comlrl"])
    p.add_argument(
        "--theirs-python",
        default=os.path.join(COMLRL, ".venv-comlrl", "bin", "python"),
        help="the comlrl virtualenv's interpreter (layout comlrl)",
    )
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--response-length", type=int, default=16)
    p.add_argument("--json", default=None)
    p.add_argument("--smoke", action="store_true", help="tiny models, n = 1 2")
    p.add_argument("--model", default=None, help="a model folder or packaged name (e.g. smollm2-135m-instruct)")
    p.add_argument("--logprobs", action="store_true", help="measure the policy-loss forward + backward alone")
    p.add_argument("--child", nargs=2, metavar=("LAYOUT", "N"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.smoke:
        a.size, a.agents = "tiny", [1, 2]
    if a.child and a.child[0] in LOGPROB_VARIANTS:
        print(json.dumps(child_logprobs(a.child[0], a.size, a.batch, a.response_length, a.model)))
        return
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]), a.size, a.batch, a.response_length, a.model)))
        return
    # Build the model once, outside the measured processes.
    path = model_path(a.size, a.model)
    label = os.path.basename(os.path.normpath(a.model)) if a.model else a.size
    if a.logprobs:
        logprobs_table(a, label)
        return
    if "comlrl" in a.layouts and not os.path.exists(a.theirs_python):
        setup = "bash benchmarks/compare/vs_comlrl/setup_env.sh"
        p.error(f"{a.theirs_python} not found: run `{setup}` first (layout comlrl)")
    results = []
    for layout in a.layouts:
        for n in a.agents:
            cmd = [
                sys.executable,
                __file__,
                "--child",
                layout,
                str(n),
                "--size",
                a.size,
                "--batch",
                str(a.batch),
                "--response-length",
                str(a.response_length),
                *(["--model", a.model] if a.model else []),
            ]
            if layout == "comlrl":
                cmd = [
                    a.theirs_python,
                    os.path.join(COMLRL, "memory_theirs.py"),
                    "--agents",
                    str(n),
                    "--model",
                    path,
                    "--batch",
                    str(a.batch),
                    "--length",
                    str(a.response_length),
                ]
            out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
            if out.returncode != 0:
                print(out.stderr[-2000:], file=sys.stderr)
                raise SystemExit(f"child {layout} n={n} failed")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row.setdefault("size", label)
            results.append(row)
            print(f"  done {layout} n={n}: peak {row['peak_rss_mib']:.0f} MiB", flush=True)
    print(
        f"\nmodel {label}; one training iteration (CC critic, preset collm, batch {a.batch}, {a.response_length} "
        "tokens)\n"
    )
    print(
        f"{'layout':9s} {'n':>2s} {'peak MiB':>9s} {'x n=1':>6s} {'above idle':>11s} {'x n=1':>6s} "
        f"{'trainable M':>12s} {'iter s':>7s}"
    )
    for layout in a.layouts:
        rows = [r for r in results if r["layout"] == layout]
        first_peak = rows[0]["peak_rss_mib"]
        first_above = rows[0]["peak_rss_mib"] - rows[0]["baseline_rss_mib"]
        for r in rows:
            above = r["peak_rss_mib"] - r["baseline_rss_mib"]
            print(
                f"{layout:9s} {r['agents']:2d} {r['peak_rss_mib']:9.0f} {r['peak_rss_mib'] / first_peak:6.2f} "
                f"{above:11.0f} "
                f"{above / first_above:6.2f} {r['trainable_params'] / 1e6:12.2f} {r['iteration_s']:7.2f}"
            )
        last = rows[-1]
        if layout == "lora":
            ratio = last["peak_rss_mib"] / first_peak
            print(
                f"goal (lora): peak memory of n={last['agents']} <= 1.3x n={rows[0]['agents']}: {ratio:.2f} -> "
                f"{'OK' if ratio <= 1.3 else 'MISSED'}"
            )
    print("peak: the process's peak RSS; above idle: peak minus the RSS after imports (interpreter, torch, libraries)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


# ---------------------------------------------------------------------------------------------- --logprobs
LOGPROB_VARIANTS = ("library", "full-softmax")


def _reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM, so the next peak is this section's alone."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_rss_now_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def child_logprobs(variant: str, size: str, batch: int, length: int, model: str | None) -> dict:
    """Peak memory of one policy-loss forward + backward of agent 0 of a 1-agent LoRA team."""
    import gc

    import torch
    from datasets import Dataset
    from peft import LoraConfig

    from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer
    from trl_collm.team.prefix import position_ids_from_mask

    torch.set_num_threads(1)
    args = MultiAgentPPOConfig(
        output_dir="/tmp/trl_collm_bench_memory", num_agents=1, use_cpu=True, bf16=False, report_to=[],
        save_strategy="no", disable_tqdm=True, num_sample_generations=0, response_length=length,
    )  # fmt: skip
    trainer = MultiAgentPPOTrainer(
        args=args,
        model=model_path(size, model),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        train_dataset=Dataset.from_dict({"prompt": ["x"]}),
        reward_funcs=lambda prompts, completions, **k: [0.0] * len(prompts),
    )
    team, agent = trainer.team, trainer.team.names[0]
    query, query_mask = team.encode(agent, ["Summarize the post in one sentence for the team."] * batch, "cpu")
    vocab = team.model_of(agent).config.vocab_size
    response = torch.randint(3, vocab, (batch, length), generator=torch.Generator().manual_seed(0))
    response_mask = torch.ones_like(response, dtype=torch.bool)
    gc.collect()
    before = current_rss_mib()
    _reset_peak_rss()
    t0 = time.time()
    if variant == "library":
        logp, entropy = team.logprobs(agent, query, query_mask, response, response_mask, 1.0, with_entropy=True)
    else:  # the textbook way: the whole (B, L, vocab) log-softmax, and the entropy on the graph
        ids = torch.cat([query, response], 1)
        mask = torch.cat([query_mask.long(), response_mask.long()], 1)
        with team.active(agent) as m:
            logits = m(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
        full = torch.log_softmax(logits[:, query.shape[1] - 1 : -1].float(), dim=-1)
        logp = full.gather(-1, response.unsqueeze(-1)).squeeze(-1)
        entropy = -(full.exp() * full).sum(-1)
    logged = float(entropy.mean())  # what the trainer logs
    (-logp.mean()).backward()
    return dict(
        variant=variant,
        batch=batch,
        response_length=length,
        vocab=vocab,
        logits_mib=batch * length * vocab * 4 / 2**20,
        before_rss_mib=before,
        peak_above_mib=_peak_rss_now_mib() - before,
        seconds=time.time() - t0,
        entropy=logged,
    )


def logprobs_table(a, label: str) -> None:
    rows = []
    for variant in LOGPROB_VARIANTS:
        cmd = [sys.executable, __file__, "--child", variant, "0", "--size", a.size, "--batch", str(a.batch),
               "--response-length", str(a.response_length), *(["--model", a.model] if a.model else [])]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if out.returncode != 0:
            print(out.stderr[-2000:], file=sys.stderr)
            raise SystemExit(f"child {variant} failed")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    r0 = rows[0]
    print(
        f"\nmodel {label}; policy-loss forward + backward of one agent, {r0['batch']} rows x {r0['response_length']} "
        f"tokens, vocabulary {r0['vocab']:,} (the float32 logits alone: {r0['logits_mib']:.0f} MiB)\n"
    )
    print(f"{'variant':13s} {'peak above MiB':>15s} {'x logits':>9s} {'seconds':>8s} {'entropy':>8s}")
    for r in rows:
        print(
            f"{r['variant']:13s} {r['peak_above_mib']:15.0f} {r['peak_above_mib'] / r['logits_mib']:9.2f} "
            f"{r['seconds']:8.2f} {r['entropy']:8.4f}"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
