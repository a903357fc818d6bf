"""A 2-agent CC team of random-init ~0.5B models trained in bf16 for a few iterations on one GPU: plain, or under
DeepSpeed ZeRO-2 / ZeRO-3 with one process. Prints iteration time, generated tokens/s and peak GPU memory (one JSON
line; peak resident CPU memory too). `bash benchmarks/gpu/gpu_zero.sh` runs the three modes one after the other.

    python benchmarks/gpu/gpu_team.py                                             # plain
    accelerate launch --num_processes 1 --config_file trl_collm/accelerate_configs/zero3.yaml benchmarks/gpu/gpu_team.py
    python benchmarks/gpu/gpu_team.py --size tiny --iterations 1                  # a quick check of the script itself

The models come from the offline factory (`trl_collm.testing`, size "0.5b": 24 layers, 1152 hidden, ~0.48B
parameters each; the critic is a value model of the same size). Answers run to the full --response-length.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402


def _timed(fn, seconds: list, cuda: bool):
    def timed(*args, **kwargs):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
        return out

    return timed


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="0.5b")
    p.add_argument("--iterations", type=int, default=4, help="timed iterations (after one warm-up)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--response-length", type=int, default=64)
    p.add_argument("--out", default="/tmp/trl_collm_gpu_team")
    a = p.parse_args()

    from datasets import Dataset

    from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer
    from trl_collm.testing import tiny_model_dir
    from trl_collm.trainers import distributed

    path = tiny_model_dir(f"{a.size}-qwen2", size=a.size)
    under_ds = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    cuda = torch.cuda.is_available()
    args = MultiAgentPPOConfig(
        output_dir=a.out,
        agent_names=["alice", "bob"],
        preset="collm",
        centralized_value="team",
        per_device_train_batch_size=a.batch,
        response_length=a.response_length,
        total_episodes=a.batch * (a.iterations + 1),
        bf16=cuda,
        use_cpu=not (cuda or under_ds),
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        num_sample_generations=0,
        logging_steps=10**6,
        stop_token_id=10**9,  # a stop token that is never sampled: every answer runs full length
        # plain: bf16 weights; DeepSpeed keeps fp32 master weights itself and computes in bf16
        model_init_kwargs=None if (under_ds or not cuda) else {"dtype": "bfloat16"},
    )
    if under_ds:
        args.grad_clip_scope = (
            "global"  # DeepSpeed clips one global norm (the preset's per-module clipping cannot apply)
        )
    reward = lambda prompts, completions, **k: [float(len(c[0]) % 3) for c in completions]  # noqa: E731
    rows = [f"write step {i} of the plan" for i in range(a.batch * 2)]
    trainer = MultiAgentPPOTrainer(
        args=args, model=path, train_dataset=Dataset.from_dict({"prompt": rows}), reward_funcs=reward
    )
    params_per_agent = sum(p.numel() for p in trainer.team.agent_parameters("alice"))  # before ZeRO-3 partitions them
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    phases: dict[str, list[float]] = {}  # seconds per call of rollout / scoring / update
    for phase in ("rollout", "score_rollout", "update"):
        setattr(trainer, phase, _timed(getattr(trainer, phase), phases.setdefault(phase, []), cuda))
    t0 = time.time()
    trainer.train()
    total = time.time() - t0
    history = trainer._metrics_history
    timed = history[1:] or history
    iteration_s = sorted(m["time/iteration_s"] for m in timed)[len(timed) // 2]
    tokens = a.batch * a.response_length * 2  # two agents, full-length answers
    result = dict(
        mode=f"deepspeed-zero{distributed.zero_stage(trainer)}" if under_ds else "plain",
        size=a.size,
        params_per_agent=params_per_agent,
        gpu=torch.cuda.get_device_name(0) if cuda else "cpu",
        dtype="bfloat16" if cuda else "float32",
        batch=a.batch,
        response_length=a.response_length,
        iterations=len(history),
        median_iteration_s=round(iteration_s, 3),
        generated_tokens_per_s=round(tokens / iteration_s, 1),
        episodes_per_s=round(a.batch / iteration_s, 2),
        peak_gpu_mib=round(torch.cuda.max_memory_allocated() / 2**20) if cuda else None,
        peak_rss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),  # Linux: KiB
        total_s=round(total, 1),
        final_score=history[-1]["objective/scores"],
        median_phase_s={k: round(sorted(v[1:] or v)[len(v[1:] or v) // 2], 3) for k, v in phases.items()},
    )
    if trainer.is_world_process_zero():
        print(json.dumps(result))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
