"""Quickstart: train a 2-agent team with a centralized critic (CoLLM-CC), offline on CPU, in about a minute.

The task is a small division-of-labour game: both agents answer the same prompt on their own (decentralized
execution) and the team shares one reward, the mean of alice's share of vowels and bob's share of non-vowel
characters. Each agent only controls its half, so the shared critic has to learn whose text moved the score.
A random team scores about 0.5; the maximum is 1. The agents are random-initialised tiny models built offline.

    python examples/quickstart.py                 # trains, saves the team, writes a learning curve PNG
    python examples/quickstart.py --episodes 256  # shorter
"""

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from datasets import Dataset  # noqa: E402

from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer  # noqa: E402
from trl_collm.testing import tiny_model_dir  # noqa: E402


VOWELS = set("aeiouAEIOU")


def vowel_share(text: str) -> float:
    letters = [c for c in text if not c.isspace()]
    return sum(c in VOWELS for c in letters) / len(letters) if letters else 0.0


def division_of_labour(prompts, completions, **kwargs):
    """Joint reward in [0, 1]: alice should write vowels, bob everything but vowels."""
    return [0.5 * vowel_share(alice) + 0.5 * (1.0 - vowel_share(bob)) for alice, bob in completions]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=768)
    parser.add_argument("--output-dir", default="outputs/quickstart")
    parser.add_argument("--critic", choices=["centralized", "decentralized"], default="centralized")
    cli = parser.parse_args()

    model_path = tiny_model_dir("tiny-qwen2")  # tokenizer trained in-process + random-init Qwen2, cached on disk
    prompts = [f"round {i}: pick a word" for i in range(64)]
    args = MultiAgentPPOConfig(
        output_dir=cli.output_dir,
        agent_names=["alice", "bob"],
        critic_type=cli.critic,
        learning_rate=1e-2,
        per_device_train_batch_size=16,
        num_ppo_epochs=2,
        response_length=4,
        temperature=1.0,
        kl_coef=0.0,
        total_episodes=cli.episodes,
        logging_steps=8,
        save_strategy="no",
        report_to=[],
        num_sample_generations=0,
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    trainer = MultiAgentPPOTrainer(
        args=args, model=model_path, train_dataset=Dataset.from_dict({"prompt": prompts}), reward_funcs=division_of_labour,
    )
    trainer.train()
    trainer.save_model(cli.output_dir)
    history = [{"episode": m["episode"], "score": m["objective/scores"]} for m in trainer._metrics_history]
    with open(os.path.join(cli.output_dir, "learning_curve.json"), "w") as f:
        json.dump(history, f, indent=1)
    first = sum(h["score"] for h in history[:5]) / min(5, len(history))
    last = sum(h["score"] for h in history[-5:]) / min(5, len(history))
    print(f"mean team score: first 5 iterations {first:.3f} -> last 5 iterations {last:.3f}")
    try:
        from trl_collm.plotting import plot_learning_curve

        png = plot_learning_curve(history, os.path.join(cli.output_dir, "learning_curve.png"), title="quickstart: division of labour (2 agents, CC)")
        print(f"saved the team and {png}")
    except ImportError:
        print("matplotlib is not installed: skipped the PNG (pip install 'trl-collm[plot]')")


if __name__ == "__main__":
    main()
