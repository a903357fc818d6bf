"""Peak memory of comlrl 1.4.3's MAACTrainer (n agents, one shared critic) over one update; prints one JSON line.

The reference side of `benchmarks/speed/bench_memory.py --layouts ... comlrl`: runs in
benchmarks/compare/vs_comlrl/.venv-comlrl.
Every agent is a full copy of the model at --model and the critic is one more (a CausalLMWithValueHead on the same
folder), as comlrl builds them; `batch` prompts, one actor step per agent and one critic step per agent over them,
answers run to --length tokens (the stop token is set outside the vocabulary). Fields as bench_memory.py's child.

    .venv-comlrl/bin/python memory_theirs.py --agents 4 --model .models/medium-qwen2 --batch 4 --length 16
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(os.path.dirname(HERE)), "speed")]  # bench_memory.py
import common  # noqa: E402  (HF_HUB_OFFLINE, WANDB_MODE before the libraries load)
from bench_memory import current_rss_mib, rss_mib  # noqa: E402  (the same measures as the trl_collm layouts; stdlib only)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--length", type=int, default=16)
    opts = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    import transformers
    from comlrl.trainers.actor_critic import MAACConfig, MAACTrainer
    from datasets import Dataset
    from transformers import AutoTokenizer

    transformers.logging.set_verbosity_error()
    tok = AutoTokenizer.from_pretrained(opts.model)
    n = opts.agents
    gc.collect()
    baseline = current_rss_mib()

    def reward(*completions, **kwargs):  # comlrl passes one list of answers per agent
        return [float(len(c[0]) % 3) for c in zip(*completions)]

    args = MAACConfig(
        agent_learning_rate=1e-5,
        critic_learning_rate=1e-5,
        rollout_buffer_size=opts.batch,
        max_new_tokens=opts.length,
        num_train_epochs=1,
        num_agents=n,
        num_generations=1,
        num_turns=1,
        critic_type="v",
        eval_interval=0,
        early_termination_threshold=None,
        agent_devices="cpu",
        critic_devices="cpu",
    )
    formatters = [lambda row, i=i: f"agent {i}: write plan {row['i']}" for i in range(n)]
    trainer = MAACTrainer(
        agents=[opts.model] * n,
        critics=[opts.model],
        tokenizer=[tok] * n,
        reward_func=reward,
        formatters=formatters,
        args=args,
        train_dataset=Dataset.from_dict({"i": list(range(opts.batch))}),
    )
    for agent in trainer.agents:
        agent.model.generation_config.eos_token_id = len(tok)  # never sampled: answers run to --length
    trainer.verbose = False
    built = rss_mib()
    t0 = time.time()
    trainer.train()
    modules = list(trainer.agents) + list(trainer.critics)
    params = [p for m in modules for p in m.parameters()]
    common.emit(
        dict(
            layout="comlrl",
            agents=n,
            baseline_rss_mib=baseline,
            built_rss_mib=built,
            peak_rss_mib=rss_mib(),
            iteration_s=time.time() - t0,
            trainable_params=sum(p.numel() for p in params if p.requires_grad),
            total_params=sum(p.numel() for p in params),
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
