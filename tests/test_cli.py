"""The `trl-collm` command line: ppo / mc training from a YAML config with overrides, eval, play, tasks, errors,
and every example config under examples/configs parsing into the right dataclasses (parse only)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trl_collm import MultiAgentMCConfig, MultiAgentPPOConfig
from trl_collm.cli import TaskArguments, main
from trl_collm.tasks import get_task, list_tasks

from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "examples" / "configs"
HAS_MPL = importlib.util.find_spec("matplotlib") is not None
# The penalty game's payoffs, scaled by 1/10: the team return of any joint action lies in [-1, 1].
PENALTY_MIN, PENALTY_MAX = -1.0, 1.0

FAST = ["--disable_tqdm", "true", "--logging_steps", "1", "--train_limit", "16", "--eval_limit", "4", "--seed", "0"]


def _last_json(text: str) -> dict:
    lines = [ln for ln in text.strip().splitlines() if ln.startswith("{")]
    assert lines, text[-2000:]
    return json.loads(lines[-1])


def _check_team_folder(out: Path, agents, critic: bool):
    assert (out / "team.json").is_file()
    desc = json.loads((out / "team.json").read_text())
    assert desc["agents"] == agents
    for a in agents:
        assert (out / desc["agent_folders"][a]).is_dir(), a
    assert (out / "critic").exists() == critic
    curve = json.loads((out / "learning_curve.json").read_text())
    assert curve and all({"episode", "score"} <= set(p) for p in curve)
    assert all(PENALTY_MIN <= p["score"] <= PENALTY_MAX for p in curve)
    assert (out / "learning_curve.png").is_file() == HAS_MPL


@pytest.fixture(scope="module")
def trained(tmp_path_factory, model_cache, qwen_path):
    """One cc team (ppo) and one mc team, each trained for 2 short iterations from the example configs."""
    root = tmp_path_factory.mktemp("cli")
    ppo_out, mc_out = root / "ppo", root / "mc"
    assert (
        main(
            [
                "ppo",
                "--config",
                str(CONFIGS / "coord-penalty" / "cc-cpu.yaml"),
                "--total_episodes",
                "16",
                "--per_device_train_batch_size",
                "8",
                "--output_dir",
                str(ppo_out),
                "--eval_strategy",  # the card then carries the evaluation the run measured
                "steps",
                "--eval_steps",
                "1",
                *FAST,
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "mc",
                "--config",
                str(CONFIGS / "coord-penalty" / "mc-cpu.yaml"),
                "--total_episodes",
                "4",
                "--per_device_train_batch_size",
                "2",
                "--num_generations",
                "2",
                "--output_dir",
                str(mc_out),
                *FAST,
            ]
        )
        == 0
    )
    return {"ppo": ppo_out, "mc": mc_out}


def test_ppo_writes_the_team_and_the_learning_curve(trained, capsys):
    _check_team_folder(trained["ppo"], ["player_1", "player_2"], critic=True)


def test_mc_writes_the_team_and_the_learning_curve(trained):
    _check_team_folder(trained["mc"], ["player_1", "player_2"], critic=False)


@pytest.mark.parametrize("kind", ["ppo", "mc"])
def test_eval_prints_a_json_summary(trained, capsys, kind):
    capsys.readouterr()
    assert (
        main(
            [
                "eval",
                "--team_dir",
                str(trained[kind]),
                "--task",
                "coord-penalty",
                "--limit",
                "4",
                "--max_new_tokens",
                "2",
            ]
        )
        == 0
    )
    summary = _last_json(capsys.readouterr().out)
    assert summary["task"] == "coord-penalty" and summary["episodes"] == 4
    assert PENALTY_MIN <= summary["mean_return"] <= PENALTY_MAX
    assert summary["percent_of_max"] == pytest.approx(
        100.0 * summary["mean_return"] / get_task("coord-penalty").max_reward
    )


@pytest.mark.parametrize("kind", ["ppo", "mc"])
def test_the_cli_writes_a_team_card(trained, kind):
    """README.md names the team, each agent's base model, the task, algorithm and critic, the last metrics and
    shows the team loader; nothing in it is 'None' (TRL's single-model card said 'Model Card for None')."""
    out = trained[kind]
    card = (out / "README.md").read_text()
    desc = json.loads((out / "team.json").read_text())
    assert "None" not in card and "huggingface.co/None" not in card and "pipeline(" not in card
    assert card.startswith("---\n") and f"# {out.name}\n" in card
    for agent in ["player_1", "player_2"]:
        assert re.search(rf"\| {agent} \| `[^`]*tiny-qwen2[^`]*` \(local\) \| `{agent}` \|", card), agent
    assert "`coord-penalty`" in card and "RewardFunctionEnv" in card
    trainer = "MultiAgentPPOTrainer" if kind == "ppo" else "MultiAgentMCTrainer"
    assert f"`{trainer}`" in card
    if kind == "ppo":
        assert "CoLLM-CC" in card and "| critic | centralized" in card and "saved under `critic/`" in card
    else:
        assert "| critic | none" in card
    last = json.loads((out / "learning_curve.json").read_text())[-1]
    assert f"| `objective/scores` | {last['score']:.4g} |" in card
    assert "from trl_collm.inference import load_team, play" in card and "get_task('coord-penalty')" in card
    assert "response_length=2" in card and desc["generation"]["response_length"] == 2
    # portable: no path of the training machine (the output folder, the tiny model's cache folder)
    assert str(out) not in card and os.path.expanduser("~") not in card and "/tmp/" not in card
    assert desc["task"] == {"name": "coord-penalty", "ref": "coord-penalty", "options": {}, "dataset_source": None}
    if kind == "ppo":  # evaluated every step: the card reports the evaluation at the step of the saved weights
        assert "Evaluation on the task's eval split at step 2, the step of the saved weights" in card
        assert re.search(r"\| `eval_return` \| -?[0-9.e-]+ \|", card)


def test_the_card_snippet_runs(trained, monkeypatch):
    """The card's 'Run the team' code, as written, loads and plays the team from inside its folder."""
    card = (trained["ppo"] / "README.md").read_text()
    code = re.search(r"## Run the team\n\n```python\n(.*?)```", card, re.DOTALL).group(1)
    assert "load_team('.')" in code  # the card's own folder: the snippet works wherever the folder is copied
    monkeypatch.chdir(trained["ppo"])
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the card's own snippet
    assert len(scope["transcripts"]) == 4
    assert set(scope["transcripts"][0]["turns"][0]["agents"]) == {"player_1", "player_2"}


def test_team_json_records_generation_settings_and_eval_uses_them(trained, capsys, monkeypatch):
    from trl_collm import inference

    desc = json.loads((trained["ppo"] / "team.json").read_text())
    gen = desc["generation"]
    # cc-cpu.yaml: response_length 2, temperature 1.0; the prompt limit is the tiny model's context minus the answer
    assert gen["response_length"] == 2 and gen["temperature"] == 1.0 and gen["top_p"] == 1.0
    assert desc["prompts"]["max_prompt_length"] == {"player_1": 2048 - 2, "player_2": 2048 - 2}
    seen = []
    real_play = inference.play

    def spy(team, env, rows, **kw):
        seen.append(dict(kw, prompt_limits=dict(kw["prompts"].max_prompt_length)))
        return real_play(team, env, rows, **kw)

    monkeypatch.setattr(inference, "play", spy)
    base = ["eval", "--team_dir", str(trained["ppo"]), "--task", "coord-penalty", "--limit", "2"]
    assert main(base) == 0 and main([*base, "--sample"]) == 0
    assert main([*base, "--max_new_tokens", "3", "--sample", "--temperature", "0.5"]) == 0
    assert [(s["settings"].max_new_tokens, s["settings"].greedy, s["settings"].temperature) for s in seen] == [
        (2, True, 1.0),
        (2, False, 1.0),
        (3, False, 0.5),
    ]
    assert seen[0]["prompt_limits"] == desc["prompts"]["max_prompt_length"]


def test_eval_samples_with_the_saved_top_p_top_k_and_stop_token(trained, tmp_path, monkeypatch):
    """`eval --sample` draws with every setting team.json records, not only the length and the temperature."""
    import shutil

    from trl_collm import inference
    from trl_collm.generation.sampler import SamplingSettings

    team_dir = tmp_path / "team"
    shutil.copytree(trained["ppo"], team_dir)
    desc = json.loads((team_dir / "team.json").read_text())
    desc["generation"].update(top_p=0.9, top_k=5, stop_token_id=9)
    (team_dir / "team.json").write_text(json.dumps(desc))
    seen = []
    real_play = inference.play
    monkeypatch.setattr(inference, "play", lambda *a, **kw: seen.append(kw["settings"]) or real_play(*a, **kw))
    assert main(["eval", "--team_dir", str(team_dir), "--task", "coord-penalty", "--limit", "2", "--sample"]) == 0
    assert seen == [SamplingSettings(max_new_tokens=2, temperature=1.0, top_p=0.9, top_k=5, stop_token_ids=(9,))]


def test_eval_refuses_a_coordination_team_on_the_building_game(trained, capsys):
    err = _one_line_error(capsys, ["eval", "--team_dir", str(trained["ppo"]), "--task", "building-str"])
    assert "--task building-str" in err and "trained on task 'coord-penalty'" in err


def test_play_prints_both_agents_prompts_and_answers(trained, capsys):
    capsys.readouterr()
    assert (
        main(
            [
                "play",
                "--team_dir",
                str(trained["ppo"]),
                "--task",
                "coord-penalty",
                "--limit",
                "2",
                "--max_new_tokens",
                "2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("=== episode") == 2
    for i, agent in enumerate(["player_1", "player_2"]):
        assert f"[{agent}] prompt:" in out and f"[{agent}] answer:" in out
        assert f"You are player {i + 1} of a two-player penalty game" in out
    assert "reward" in out
    assert "mean_return" in _last_json(out)


def _listed(out: str) -> list[str]:
    """The task names of `trl-collm tasks`: the first word of each line before the blank line (notes follow it)."""
    return [line.split()[0] for line in out.strip().split("\n\n")[0].splitlines()]


def test_tasks_lists_every_task(capsys):
    capsys.readouterr()
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    listed = _listed(out)
    assert listed == list_tasks()
    assert "MODULE:NAME" in out and "TaskSpec" in out and "--agent_models" in out
    for name in [
        "writing-summary",
        "writing-intro",
        "code-humaneval",
        "building-str",
        "building-house",
        "coord-climbing",
        "coord-penalty",
        "coord-numbers",
        "coord-repeated",
    ]:
        assert name in listed


def test_tasks_in_a_real_subprocess():
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    script = Path(sys.executable).parent / "trl-collm"
    cmd = [str(script), "tasks"] if script.exists() else [sys.executable, "-m", "trl_collm.cli", "tasks"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env, timeout=HANG_GUARD_S, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert _listed(res.stdout) == list_tasks()


def _one_line_error(capsys, argv) -> str:
    """main(argv) must exit with status 2 and print exactly one line, `trl-collm: error: ...`, on stderr."""
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("trl-collm: error: ") and "\n" not in err, captured.err[-2000:]
    return err


def test_help_and_unknown_command(capsys):
    assert main([]) == 0
    assert "usage: trl-collm" in capsys.readouterr().out
    err = _one_line_error(capsys, ["trian"])
    assert "unknown command 'trian'" in err and "ppo" in err


def test_unknown_task_is_a_clear_error(tmp_path, capsys):
    err = _one_line_error(
        capsys, ["ppo", "--task", "no-such-task", "--output_dir", str(tmp_path), "--use_cpu", "true", "--bf16", "false"]
    )
    assert "unknown task 'no-such-task'" in err and "coord-penalty" in err and "MODULE:NAME" in err
    err = _one_line_error(
        capsys,
        [
            "mc",
            "--config",
            str(CONFIGS / "coord-penalty" / "mc-cpu.yaml"),
            "--task",
            "no-such-task",
            "--output_dir",
            str(tmp_path),
        ],
    )
    assert "unknown task 'no-such-task'" in err
    assert "unknown task 'no-such-task'" in _one_line_error(
        capsys, ["eval", "--team_dir", str(tmp_path), "--task", "no-such-task"]
    )


def test_eval_of_a_folder_without_a_team(tmp_path, capsys):
    err = _one_line_error(capsys, ["eval", "--team_dir", str(tmp_path), "--task", "coord-penalty"])
    assert "--team_dir" in err and "team.json" in err


# ---------------------------------------------------------------------------------------------------------------
# Example configs: parse only
# ---------------------------------------------------------------------------------------------------------------

YAMLS = sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.glob("*/*.yaml"))


def _parse(rel: str, *extra: str):
    from trl import ModelConfig, TrlParser

    config_cls = MultiAgentMCConfig if Path(rel).name.startswith("mc-") else MultiAgentPPOConfig
    parser = TrlParser((TaskArguments, config_cls, ModelConfig))
    return parser.parse_args_and_config(["--config", str(CONFIGS / rel), *extra])


def test_every_task_has_all_six_configs_and_they_are_up_to_date():
    expected = {f"{t}/{a}-{d}.yaml" for t in list_tasks() for a in ("cc", "dc", "mc") for d in ("gpu", "cpu")}
    assert expected <= set(YAMLS), sorted(expected - set(YAMLS))
    spec = importlib.util.spec_from_file_location("make_configs", CONFIGS / "make_configs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    generated = module.all_configs()
    assert set(generated) == expected
    stale = [rel for rel, text in generated.items() if (CONFIGS / rel).read_text() != text]
    assert not stale, f"run python examples/configs/make_configs.py: {stale}"


@pytest.mark.parametrize("rel", [y for y in YAMLS if y.endswith("-cpu.yaml")])
def test_cpu_config_parses(rel, model_cache):
    task_args, args, model_args = _parse(rel)
    algo = Path(rel).name.split("-")[0]
    assert isinstance(args, MultiAgentMCConfig if algo == "mc" else MultiAgentPPOConfig)
    assert isinstance(task_args, TaskArguments)
    spec = get_task(task_args.task)
    assert task_args.task == Path(rel).parent.name
    assert args.num_turns == spec.num_turns
    assert model_args.model_name_or_path == "tiny" and not model_args.use_peft
    assert args.use_cpu and not args.bf16
    assert args.report_to in ([], ["none"]) and args.save_strategy == "no"
    assert task_args.train_limit and task_args.eval_limit
    assert task_args.train_limit >= args.per_device_train_batch_size
    if algo == "cc":
        assert args.critic_type == "centralized"
    elif algo == "dc":
        assert args.critic_type == "decentralized"
    if task_args.task_options:
        assert isinstance(json.loads(task_args.task_options), dict)
    # The dataset the config names loads, with at least one rollout batch of rows.
    ds = spec.load_dataset("train", source=task_args.dataset_source, limit=task_args.train_limit)
    assert len(ds) >= args.per_device_train_batch_size


@pytest.mark.parametrize("rel", [y for y in YAMLS if y.endswith("-gpu.yaml")])
def test_gpu_config_parses(rel):
    raw = yaml.safe_load((CONFIGS / rel).read_text())
    assert raw["bf16"] is True and raw["use_peft"] is True
    # This machine may have no GPU: transformers refuses bf16 there, so parse with the flag overridden.
    task_args, args, model_args = _parse(rel, "--bf16", "false")
    algo = Path(rel).name.split("-")[0]
    assert isinstance(args, MultiAgentMCConfig if algo == "mc" else MultiAgentPPOConfig)
    spec = get_task(task_args.task)
    assert task_args.task == Path(rel).parent.name
    assert args.num_turns == spec.num_turns
    assert args.output_dir == f"outputs/{task_args.task}-{algo}"
    assert model_args.use_peft and model_args.lora_r == 16 and model_args.lora_target_modules == "all-linear"
    assert model_args.model_name_or_path != "tiny" and "/" in model_args.model_name_or_path
    assert args.report_to == ["tensorboard"]
    if algo == "mc":
        assert args.preset == "magrpo"
    else:
        assert args.preset == "collm" and args.policy_loss_type == "reinforce"
        assert args.critic_type == ("centralized" if algo == "cc" else "decentralized")
        if algo == "cc":
            assert args.centralized_value == "team"


def test_cli_rejects_a_num_turns_that_contradicts_the_task(tmp_path, capsys):
    err = _one_line_error(
        capsys,
        [
            "ppo",
            "--task",
            "coord-repeated",
            "--model_name_or_path",
            "tiny",
            "--num_turns",
            "2",
            "--output_dir",
            str(tmp_path),
            "--use_cpu",
            "--bf16",
            "false",
            "--report_to",
            "none",
        ],
    )
    assert "--num_turns 2" in err and "coord-repeated" in err and "--task_options" in err
