"""Quickstart: train a 2-agent team with a centralized critic (CoLLM-CC), offline on CPU, in about a minute
(about 21 s of CPU time; docs/quickstart.md has the measurement).

The task is the penalty game (`trl_collm.tasks.coordination`): both players answer at once without seeing each
other; A/A and C/C pay 1, A/C and C/A cost 1, B/B pays 0.2, the rest 0. The two players must learn to agree on one
of the two optima. The agents are random-initialised tiny models built offline (no download), so what they learn is
pure coordination. A random team scores about 0.05; the optimum is 1.

    python examples/quickstart.py                        # trains, saves the team, writes learning_curve.png
    python examples/quickstart.py --critic decentralized # CoLLM-DC instead
    python examples/quickstart.py --episodes 512         # shorter
"""

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer  # noqa: E402
from trl_collm.cli import write_curve  # noqa: E402
from trl_collm.tasks import get_task  # noqa: E402
from trl_collm.testing import tiny_model_dir  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=1024)
    parser.add_argument("--output-dir", default="outputs/quickstart")
    parser.add_argument("--critic", choices=["centralized", "decentralized"], default="centralized")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    cli = parser.parse_args()

    # The models are tiny: one intra-op thread is as fast as more, and on a CPU shared with other jobs it avoids
    # OpenMP threads waiting on each other.
    torch.set_num_threads(cli.threads)
    task = get_task("coord-penalty")
    model_path = tiny_model_dir("tiny-qwen2")  # tokenizer trained in-process + random-init Qwen2, cached on disk
    args = MultiAgentPPOConfig(
        output_dir=cli.output_dir,
        agent_names=task.agent_names,
        critic_type=cli.critic,
        learning_rate=1e-2,
        per_device_train_batch_size=16,
        num_ppo_epochs=2,
        response_length=2,  # the first character of the answer is the action
        temperature=1.0,
        kl_coef=0.0,
        total_episodes=cli.episodes,
        logging_steps=8,
        save_strategy="no",
        report_to=[],
        num_sample_generations=0,
        use_cpu=True,
        bf16=False,
        seed=cli.seed,
    )
    trainer = MultiAgentPPOTrainer(
        args=args,
        model=model_path,
        train_dataset=task.load_dataset("train"),
        eval_dataset=task.load_dataset("eval"),
        env=task.make_env(),
    )
    trainer.train()
    trainer.save_model(cli.output_dir)
    label = "CoLLM-CC, centralized critic" if cli.critic == "centralized" else "CoLLM-DC, decentralized critics"
    write_curve(trainer._metrics_history, cli.output_dir, f"quickstart: penalty game, 2 agents ({label})")
    scores = [m["objective/scores"] for m in trainer._metrics_history]
    k = min(5, len(scores))
    print(f"team score (mean of {k} iterations): first {sum(scores[:k]) / k:.3f} -> last {sum(scores[-k:]) / k:.3f}")
    print(f"greedy evaluation on held-out rounds: {trainer.evaluate(greedy=True)['eval_return']:.3f} (optimum 1.0)")
    print(f"saved the team and its learning curve in {cli.output_dir}/")


if __name__ == "__main__":
    main()
