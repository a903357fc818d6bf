"""The console line (progress, ETA, a few keys as numbers) and the per-phase throughput metrics."""

from __future__ import annotations

import types

import torch

from trl_collm.trainers.console import CONSOLE_KEYS, PhaseClock, console_line


def test_the_console_line_shows_progress_eta_and_a_few_keys_as_numbers():
    logs = {"objective/scores": 0.123456, "loss/policy_avg": -2.0, "episode": 32, "a/objective/scores": 0.5}
    line = console_line(logs, step=4, max_steps=10, elapsed=8.0, started_at_step=0)
    # 4 iterations in 8 s: 2 s each, 6 left -> 12 s; 0.123456 kept as a number of 4 significant digits
    assert (
        line == "iteration 4/10 (40%) | 2 s/it | ETA 12s | objective/scores 0.1235 | loss/policy_avg -2.0 | episode 32"
    )
    assert "a/objective/scores" not in line  # per-agent keys stay in the logs, not on the console
    # A resumed run paces itself from its restart (step 6 of a run that restarted at 5: 1 iteration in 30 s)
    assert "ETA 2m00s" in console_line({}, step=6, max_steps=10, elapsed=30.0, started_at_step=5)
    assert (
        console_line({"eval_objective/scores": 1.0}, 1, 2, 0.0, 1) == "iteration 1/2 (50%) | eval_objective/scores 1.0"
    )
    # disable_tqdm=True: the numbers only
    assert console_line(logs, 4, 10, 8.0, 0, progress=False).startswith("objective/scores 0.1235 | ")


def test_phase_clock_splits_an_iteration_and_counts_tokens():
    clock = PhaseClock()
    clock.seconds["generation"], clock.seconds["update"] = 2.0, 3.0
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)  # 5 generated tokens
    clock.count({"a": types.SimpleNamespace(response_mask=mask), "b": types.SimpleNamespace(response_mask=mask)})
    assert clock.metrics(iteration_s=10.0, episodes=4) == {
        "time/generation_s": 2.0,
        "time/scoring_s": 5.0,  # the rest of the 10 s
        "time/update_s": 3.0,
        "throughput/tokens_per_s": 5.0,  # 10 tokens in 2 s of generation
        "throughput/episodes_per_s": 0.4,
    }
    clock.reset()
    assert clock.tokens == 0 and clock.metrics(1.0, 1)["time/update_s"] == 0.0


def test_training_logs_throughput_and_prints_one_line_per_iteration(tmp_path, make_config, qwen_path, capsys):
    from datasets import Dataset

    from trl_collm import MultiAgentPPOTrainer

    args = make_config(
        tmp_path, agent_names=["alice", "bob"], per_device_train_batch_size=2, total_episodes=4, disable_tqdm=False
    )
    trainer = MultiAgentPPOTrainer(
        args=args,
        model=qwen_path,
        train_dataset=Dataset.from_dict({"prompt": ["one two", "three four"]}),
        reward_funcs=lambda prompts, completions, **kw: [float(len(a) > len(b)) for a, b in completions],
    )
    capsys.readouterr()
    trainer.train()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("iteration ")]
    assert [line.split(" | ")[0] for line in lines] == ["iteration 1/2 (50%)", "iteration 2/2 (100%)"]
    assert "ETA 0s" in lines[1] and "'" not in lines[1] and len(lines[1]) < 400  # numbers, not a 2,000-char dict
    for m in trainer.metrics_history:
        phases = m["time/generation_s"] + m["time/scoring_s"] + m["time/update_s"]
        assert m["time/generation_s"] > 0 and m["time/update_s"] > 0
        assert abs(phases - m["time/iteration_s"]) < 1e-6 * max(1.0, m["time/iteration_s"])  # the split adds up
        # every agent generates 6 tokens at most per episode (response_length): 2 agents x 2 episodes
        assert 0 < m["throughput/tokens_per_s"] * m["time/generation_s"] <= 2 * 2 * 6 + 1e-6
    assert set(CONSOLE_KEYS) <= set(trainer.state.log_history[-1]) | {"eval_objective/scores"}
