"""Train a small 2-agent CC team with a checkpoint every iteration; used by tests/test_resume.py.

    python train_for_resume.py OUTPUT_DIR [--resume] [--hold_after_save STEP] [--report_to tensorboard]
Writes OUTPUT_DIR/metrics.json (the per-iteration metrics) at the end.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer  # noqa: E402
from trl_collm.testing import tiny_model_dir  # noqa: E402


class HoldAfterSave(TrainerCallback):
    """Stops the run (sleeping, never finishing) once checkpoint-STEP is saved, so that a test kills it exactly
    there however slow the machine is: no window to hit, no clock to race."""

    def __init__(self, step):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            time.sleep(10**6)  # killed by the test long before


def reward(prompts, completions, **kw):
    return [float(len(a) % 3) - float(len(b) % 2) for a, b in completions]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("output_dir")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--hold_after_save", type=int, default=None)
    p.add_argument("--report_to", default="none")
    p.add_argument("--iterations", type=int, default=5)
    cli = p.parse_args()
    torch.set_num_threads(1)
    args = MultiAgentPPOConfig(
        output_dir=cli.output_dir,
        agent_names=["alice", "bob"],
        per_device_train_batch_size=2,
        response_length=5,
        total_episodes=2 * cli.iterations,
        num_ppo_epochs=2,
        learning_rate=1e-3,
        save_strategy="steps",
        save_steps=1,
        save_total_limit=3,
        logging_steps=1,
        report_to=cli.report_to,
        num_sample_generations=0,
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
        value_normalization=True,
    )
    dataset = Dataset.from_dict({"prompt": [f"prompt number {i}" for i in range(7)]})
    trainer = MultiAgentPPOTrainer(
        args=args,
        model=tiny_model_dir("tiny-qwen2"),
        train_dataset=dataset,
        reward_funcs=reward,
        callbacks=[HoldAfterSave(cli.hold_after_save)] if cli.hold_after_save else None,
    )
    trainer.train(resume_from_checkpoint=True if cli.resume else None)
    with open(os.path.join(cli.output_dir, "metrics.json"), "w") as f:
        json.dump(trainer._metrics_history, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
