"""The real model (SmolLM2-135M-Instruct: 49k vocabulary, pad == eos, 30 layers with grouped-query attention, tied
embeddings) through every path at the smallest sizes: CC, DC and MC on a LoRA team, a separate-model team, save ->
`load_team` -> `play`, resume, `trl-collm eval` and the drop-in script. What toy models hide shows up here.

Kept small for CI (2 cores): coord-penalty's short prompts, 2 rows per iteration, a few new tokens, LoRA r=4 on
q_proj / v_proj. `python -m pytest tests/test_real_model.py --durations=0` prints what each test costs.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re

import pytest
import torch
from conftest import RUN_SETTINGS
from test_dropin import LORA_FLAGS, TEST_PROMPTS, TRAIN_PROMPTS, _run_script

pytestmark = pytest.mark.slow  # the real model through every path (CONTRIBUTING.md: the fast suite leaves it out)

TASK = "coord-penalty"  # prompts of ~35 tokens: the cheapest built-in task for a real model
NEW_TOKENS = 6
PPO_DEFAULTS = dict(response_length=NEW_TOKENS, num_ppo_epochs=1, total_episodes=2)  # one iteration of 2 rows


def _lora():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


def _settings(tmp, **overrides):
    """Run settings shared by the PPO and MC configs here (one thread: 2 shared CI cores)."""
    from trl_collm.tasks import get_task

    kwargs = dict(
        output_dir=str(tmp),
        agent_names=get_task(TASK).agent_names,
        **RUN_SETTINGS,
        seed=0,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
    )
    kwargs.update(overrides)
    return kwargs


def _ppo_trainer(tmp, model, peft_config=None, **overrides):
    from trl_collm import MultiAgentPPOConfig, MultiAgentPPOTrainer
    from trl_collm.tasks import get_task

    task = get_task(TASK)
    args = MultiAgentPPOConfig(**_settings(tmp, **{**PPO_DEFAULTS, **overrides}))
    return MultiAgentPPOTrainer(
        args=args, model=model, env=task.make_env(), train_dataset=task.load_dataset("train", limit=4),
        peft_config=peft_config,
    )  # fmt: skip


def _rows(n=2):
    from trl_collm.tasks import get_task

    ds = get_task(TASK).load_dataset("eval", limit=n)
    return [ds[i] for i in range(len(ds))]


def _play(team):
    """Greedy episodes of `NEW_TOKENS` new tokens, whichever way `play` takes its sampling settings."""
    from trl_collm.inference import play
    from trl_collm.tasks import get_task

    env, rows = get_task(TASK).make_env(), _rows()
    params = inspect.signature(play).parameters
    if "max_new_tokens" in params:
        return play(team, env, rows, max_new_tokens=NEW_TOKENS, greedy=True)
    from trl_collm.generation.sampler import SamplingSettings  # the sampling seam: one settings record

    return play(team, env, rows, settings=SamplingSettings(max_new_tokens=NEW_TOKENS, greedy=True))


def _finite_metrics(history):
    """Every logged float is finite, except an explained variance, which is NaN by definition when the returns are
    constant (with chat prompts both players of the real model often give the same letter: every return is 1)."""
    assert history
    for m in history:
        bad = {
            k: v
            for k, v in m.items()
            if isinstance(v, float) and not math.isfinite(v) and not k.endswith("critic/explained_variance")
        }
        assert not bad, bad


def _lora_b(model, adapter):
    return {n: p.detach().clone() for n, p in model.named_parameters() if f"lora_B.{adapter}." in n}


def _assert_adapters_moved(team):
    for a in team.names:
        lora_b = _lora_b(team.shared_base, a)
        assert lora_b and all(p.abs().sum() > 0 for p in lora_b.values()), a  # lora_B starts at zero


def _base_weights_unchanged(team, folder):
    from safetensors.torch import load_file

    original = load_file(os.path.join(folder, "model.safetensors"))
    base = {
        n.replace("base_model.model.", "").replace(".base_layer", ""): p for n, p in team.shared_base.named_parameters()
    }
    compared = 0
    for name, value in original.items():
        if name in base:
            assert torch.equal(base[name].detach(), value), name
            compared += 1
    assert compared > 200  # 30 layers x 9 tensors and the embeddings, not a few stray names


# ---------------------------------------------------------------------------------------------- CC on a LoRA team
@pytest.fixture(scope="module")
def cc_lora(smollm2_path, tmp_path_factory):
    """A 2-agent CC team sharing one SmolLM2 with an adapter each: 2 iterations, a checkpoint after each."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("real-cc")
    trainer = _ppo_trainer(
        root / "out",
        smollm2_path,
        _lora(),
        total_episodes=4,
        save_strategy="steps",
        save_steps=1,
        critic_type="centralized",
    )
    trainer.train()
    saved = root / "team"
    trainer.save_model(str(saved))
    return {"trainer": trainer, "saved": saved, "out": root / "out"}


def test_cc_lora_team_trains_its_adapters_only(cc_lora, smollm2_path):
    trainer = cc_lora["trainer"]
    _finite_metrics(trainer.metrics_history)
    assert len(trainer.metrics_history) == 2
    _assert_adapters_moved(trainer.team)
    _base_weights_unchanged(trainer.team, smollm2_path)
    # tied embeddings survive LoRA wrapping: the output layer is still the input embedding
    inner = trainer.team.shared_base.get_base_model()
    assert inner.lm_head.weight is inner.model.embed_tokens.weight


def test_saved_lora_team_plays_back_what_the_trained_team_plays(cc_lora):
    from trl_collm.inference import load_team

    team = load_team(str(cc_lora["saved"]))
    assert team.layout == "shared_base" and team.names == ["player_1", "player_2"]
    trained = cc_lora["trainer"].team
    assert trained.training  # train() leaves it so; play must switch to eval mode (PEFT's per-row adapters need it)
    before = _play(trained)
    assert trained.training  # and switch back
    after = _play(team)
    assert [t["turns"] for t in after] == [t["turns"] for t in before]
    assert any(turn["agents"]["player_1"]["completion"] for t in after for turn in t["turns"])


def test_resume_from_a_real_model_checkpoint_is_bitwise(cc_lora, smollm2_path, tmp_path):
    straight = cc_lora["trainer"]
    checkpoint = cc_lora["out"] / "checkpoint-1"
    assert checkpoint.is_dir()
    resumed = _ppo_trainer(tmp_path / "out", smollm2_path, _lora(), total_episodes=4, critic_type="centralized")
    resumed.train(resume_from_checkpoint=str(checkpoint))
    from trl_collm.trainers.console import is_wall_clock

    got, want = resumed.metrics_history[-1], straight.metrics_history[-1]
    assert {k: v for k, v in got.items() if not is_wall_clock(k)} == {
        k: v for k, v in want.items() if not is_wall_clock(k)
    }
    for a in straight.team.names:
        mine, theirs = _lora_b(resumed.team.shared_base, a), _lora_b(straight.team.shared_base, a)
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[n], theirs[n]) for n in mine), a


def test_cli_eval_scores_the_saved_real_model_team(cc_lora, capsys):
    from trl_collm.cli import main

    capsys.readouterr()
    code = main(["eval", "--team_dir", str(cc_lora["saved"]), "--task", TASK, "--limit", "2", "--max_new_tokens", "4"])
    assert code == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    summary = json.loads(lines[-1])
    assert summary["task"] == TASK and summary["episodes"] == 2
    assert -1.0 <= summary["mean_return"] <= 1.0  # the penalty game's payoffs are scaled into [-1, 1]


def test_logprobs_equal_the_full_log_softmax_and_keep_no_entropy_graph(cc_lora):
    """The 49k-vocabulary log-softmax is never materialised for the loss (gather minus logsumexp), yet the numbers are
    the textbook ones; the logged entropy holds no autograd graph (it kept 2 full-vocabulary tensors alive)."""
    from trl_collm.team.prefix import position_ids_from_mask

    team = cc_lora["trainer"].team
    a = team.names[0]
    query, query_mask = team.encode(a, ["Name a colour.", "Say hi to the whole team."], "cpu")
    response = torch.tensor([[504, 3458, 314, 2], [253, 1345, 28, 2]])
    response_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    ids = torch.cat([query, response], 1)
    mask = torch.cat([query_mask.long(), response_mask.long()], 1)
    for temperature in (1.0, 0.7):
        logp, entropy = team.logprobs(a, query, query_mask, response, response_mask, temperature, with_entropy=True)
        assert logp.requires_grad and not entropy.requires_grad
        with team.active(a) as model, torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
        full = torch.log_softmax(logits[:, query.shape[1] - 1 : -1] / temperature, dim=-1)
        expected = full.gather(-1, response.unsqueeze(-1)).squeeze(-1).masked_fill(~response_mask, 0.0)
        torch.testing.assert_close(logp.detach(), expected, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(entropy, -(full.exp() * full).sum(-1), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------- DC and MC
def test_dc_lora_team_trains(smollm2_path, tmp_path):
    trainer = _ppo_trainer(tmp_path, smollm2_path, _lora(), critic_type="decentralized")
    trainer.train()
    _finite_metrics(trainer.metrics_history)
    assert sorted(trainer.critic.units) == ["player_1", "player_2"]
    _assert_adapters_moved(trainer.team)


def test_mc_lora_team_trains(smollm2_path, tmp_path):
    from trl_collm import MultiAgentMCConfig, MultiAgentMCTrainer
    from trl_collm.tasks import get_task

    task = get_task(TASK)
    args = MultiAgentMCConfig(
        # 4 samples: with 2, both can earn the same reward (no advantage, an adapter that never moves) by the draw
        **_settings(tmp_path, per_device_train_batch_size=1, num_generations=4, total_episodes=1),
        response_length=NEW_TOKENS,
    )
    trainer = MultiAgentMCTrainer(
        args=args, model=smollm2_path, env=task.make_env(), train_dataset=task.load_dataset("train", limit=2),
        peft_config=_lora(),
    )  # fmt: skip
    trainer.train()
    _finite_metrics(trainer.metrics_history)
    assert trainer.critic is None
    _assert_adapters_moved(trainer.team)


# ---------------------------------------------------------------------------------------------- separate models
def test_separate_model_team_trains_saves_and_plays_back(smollm2_path, tmp_path):
    """Two full copies, fully fine-tuned (SGD and no KL: no optimizer state, no reference copies)."""
    from safetensors.torch import load_file

    from trl_collm.inference import load_team

    trainer = _ppo_trainer(tmp_path / "out", [smollm2_path, smollm2_path], optim="sgd", kl_coef=0.0)
    trainer.train()
    _finite_metrics(trainer.metrics_history)
    team = trainer.team
    assert team.layout == "separate" and team.model_of("player_1") is not team.model_of("player_2")
    original = load_file(os.path.join(smollm2_path, "model.safetensors"))
    trained = dict(team.model_of("player_1").named_parameters())
    assert not torch.equal(
        trained["model.layers.0.self_attn.q_proj.weight"].detach(), original["model.layers.0.self_attn.q_proj.weight"]
    )
    saved = tmp_path / "team"
    trainer.save_model(str(saved))
    loaded = load_team(str(saved))
    for a in team.names:
        model = loaded.model_of(a)
        assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied after the round trip
        torch.testing.assert_close(
            model.model.embed_tokens.weight, team.model_of(a).model.embed_tokens.weight, rtol=0, atol=0
        )
    assert [t["turns"] for t in _play(loaded)] == [t["turns"] for t in _play(team)]


# ---------------------------------------------------------------------------------------------- drop-in script
def test_dropin_script_with_the_real_tokenizer(smollm2_path, tmp_path):
    """examples/ppo.py with SmolLM2 as policy, reward and value model: its tokenizer gains a "[PAD]" id past the
    embedding table (TRL's script does that), which must never reach a model."""

    data = tmp_path / "data"
    data.mkdir()
    for split, prompts in (("train", TRAIN_PROMPTS[:4]), ("test", TEST_PROMPTS[:2])):
        (data / f"{split}.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    assets = {"root": tmp_path, "sft": smollm2_path, "reward": smollm2_path, "data": str(data)}
    out = tmp_path / "out"
    proc = _run_script(assets, out, [*LORA_FLAGS, "--total_episodes", "2", "--response_length", "4"])
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert len(re.findall(r"^iteration 1/1 ", proc.stdout, flags=re.M)) == 1, proc.stdout[-4000:]  # the console line
    assert proc.stdout.count("-- episode ") == 2, proc.stdout[-4000:]  # generate_completions() on the test split
    assert (out / "adapter_config.json").is_file()


def test_the_smollm2_example_reports_paired_held_out_scores_and_saves_a_team(smollm2_name, tmp_path):
    """examples/smollm2_team.py at its smallest: one thread chosen as the CLI does, the held-out plays before and
    after with their count and standard error, the paired change, texts with word counts, a team that loads back."""
    import re
    import subprocess
    import sys

    from trl_collm.team.saved import load_team

    out = tmp_path / "team"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, os.path.join(root, "examples", "smollm2_team.py"), "--iterations", "1", "--posts", "1"]
    cmd += ["--eval-posts", "2", "--response-length", "4", "--output-dir", str(out)]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = proc.stdout
    assert "1 torch thread(s)" in text, text[:500]
    scores = re.findall(r"held-out team score (\d\.\d+) \+- (\d\.\d+) \(SE, 2 plays at temperature 1", text)
    assert len(scores) == 3, text  # before, then before again beside after
    assert re.search(r"change, paired play by play: [+-]\d\.\d+ \+- \d\.\d+ \(SE\): (beyond|within) noise", text)
    assert len(re.findall(r"\[post [12]\] (concise|detailed) \(\d+ words\): ", text)) == 8  # 2 posts x 2 x before/after
    assert "iteration 1: sampled team score" in proc.stderr + text
    # the training bar opens when training does: the held-out plays before it must not count in its ETA
    assert proc.stderr.index("training:") > proc.stderr.rindex("held-out plays, before"), proc.stderr[-4000:]
    team = load_team(str(out))
    assert team.names == ["concise", "detailed"]


@pytest.mark.parametrize("workload", ["cc", "mc"])  # MC's phases are other methods (sample / score_tree / run_updates)
def test_the_workload_benchmark_reports_each_phase_per_generated_token(smollm2_name, tmp_path, workload):
    """benchmarks/speed/bench_workload.py --smoke (issue 28's workload at its smallest): a measurement in a fresh
    process, its phases no larger than the whole, the JSON it writes."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "bench.json"
    script = os.path.join(root, "benchmarks", "speed", "bench_workload.py")
    from trl_collm.hardware import cpu_has_native_bf16

    # bf16 where the CPU has it; on an AVX2-only CPU bf16 is emulated (~1 GFLOP/s: this smoke took 7 min there),
    # so float32, whose label is checked the same way
    compute, autocast = ("bf16", "bfloat16") if cpu_has_native_bf16() else ("fp32", "off")
    cmd = [sys.executable, script, "--smoke", "--workload", workload, "--compute", compute, "--json", str(out)]
    # CC counts the FLOPs; MC measures the memory / compute trade's switch instead. Not both in one run: with
    # checkpointing the smoke's update forwards every prompt token again (the kept prefill is off) and runs at
    # ~1.3x its floor, too close for a roofline measured on a busy machine (it once read 1547 ms against 1437).
    checkpointing = workload == "mc"
    cmd += ["--activation-checkpointing"] if checkpointing else ["--count-flops"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (row,) = json.loads(out.read_text())["rows"]
    ms = row["ms_per_token"]
    # the label is what the update ran under (it once said bf16 while the child trained in float32)
    assert row["compute"] == compute and row["autocast"] == [autocast] and row["rounds"] == 1
    # checked by the driver against the child's models (their layer stacks' gradient_checkpointing)
    assert row["activation_checkpointing"] is checkpointing
    assert row["peak_rss_mib"] > 500  # the child's own peak: the real model alone is ~520 MiB in float32
    assert ms["total"] >= ms["rollout"] + ms["score_rollout"] + ms["update"] - 1e-6
    assert ms["rollout"] > 0 and ms["update"] > 0
    assert ms["generate"] > 0 and "GFLOP/s" in proc.stdout and "1.00x" in proc.stdout
    if checkpointing:
        assert "gflop_per_token" not in row
        return
    # the counted arithmetic: every phase's share of the iteration's, and the floor is below what was measured
    # (the floor assumes every FLOP at the best GEMM's rate; ~1.9x below it at this size)
    g, floor = row["gflop_per_token"], row["floor_ms_per_token"]
    assert g["rollout"] > 0 and g["update"] > 0 and g["generate"] > 0
    assert g["total"] >= g["rollout"] + g["score_rollout"] + g["update"] - 1e-9
    assert 0 < floor["total"] < ms["total"] and "measured/floor" in proc.stdout
    # the weights each phase reads: the rollout decodes (a forward per new token) and the update runs with gradients
    mb = row["weight_mb_per_token"]
    assert (
        mb["rollout"] > 0 and mb["update"] > 0 and {floor["rollout_bound"], floor["update_bound"]} <= {"flops", "bytes"}
    )
