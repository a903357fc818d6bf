"""The command line as a new user meets it: one-line errors with exit status 2 (and --debug tracebacks), the Hub
push checked before training, teams that do not fit a task refused, your own task by import path, pictures of the
building game, a light `import trl_collm`, transformers' load report for value heads explained once, and the
README's usage snippet running on CPU."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from trl_collm.cli import UsageError, main

from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]
CC_CPU = str(ROOT / "examples" / "configs" / "coord-penalty" / "cc-cpu.yaml")
SHORT = [
    "--total_episodes",
    "8",
    "--per_device_train_batch_size",
    "4",
    "--train_limit",
    "8",
    "--eval_limit",
    "4",
    "--disable_tqdm",
    "true",
    "--logging_steps",
    "1",
    "--seed",
    "0",
]


def _one_line_error(capsys, argv, after_training: bool = False) -> str:
    """main(argv) exits with status 2 and its error is one line `trl-collm: error: ...`: the whole of stderr, or,
    for an error after training, the last line after the training's progress output (and no traceback)."""
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    if after_training:
        assert "Traceback" not in err and err.count("trl-collm: error: ") == 1, captured.err[-3000:]
        err = err.splitlines()[-1]
    assert err.startswith("trl-collm: error: ") and "\n" not in err, captured.err[-3000:]
    return err


def _fake_team(
    root: Path,
    model_dir: str,
    agents: list[str],
    num_turns: int = 1,
    response_length: int = 4,
    task: dict | None = None,
) -> Path:
    """A saved-team folder as save_model() writes it (team.json + one model folder per agent, and the task record
    when given), without training."""
    root.mkdir(parents=True, exist_ok=True)
    for a in agents:
        shutil.copytree(model_dir, root / a)
    desc = {
        "format": "trl-collm-team/1",
        "agents": agents,
        "layout": "separate",
        "trainer": "MultiAgentPPOTrainer",
        "num_turns": num_turns,
        "preset": None,
        "agent_folders": {a: a for a in agents},
        "generation": {"response_length": response_length, "temperature": 1.0},
    }
    if task is not None:
        desc["task"] = task
    (root / "team.json").write_text(json.dumps(desc))
    return root


# ---------------------------------------------------------------------------------------------------------------
# import cost
# ---------------------------------------------------------------------------------------------------------------


def test_import_and_the_task_listing_load_no_torch():
    code = (
        "import sys, trl_collm, trl_collm.cli; trl_collm.cli.list_tasks_text(); "
        "print(sorted(m for m in ('torch', 'transformers', 'trl', 'peft', 'datasets') if m in sys.modules))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        timeout=HANG_GUARD_S,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[]"


def test_lazy_public_names():
    import trl_collm
    from trl_collm.trainers import MultiAgentPPOTrainer

    assert trl_collm.MultiAgentPPOTrainer is MultiAgentPPOTrainer
    assert set(trl_collm.__all__) <= set(dir(trl_collm))
    with pytest.raises(AttributeError, match="no_such_name"):
        trl_collm.no_such_name  # noqa: B018


def test_builtin_catalogue_matches_the_registered_tasks():
    from trl_collm.tasks import BUILTIN_TASKS, get_task, list_tasks

    assert sorted(BUILTIN_TASKS) == list_tasks()
    for name, (module, agents, turns, description) in BUILTIN_TASKS.items():
        spec = get_task(name)
        # get_task imports only `trl_collm.tasks.<module>` for this task: the spec must come from there (or from
        # a submodule, should the module become a package)
        assert spec.make_env.__module__.startswith(f"trl_collm.tasks.{module}"), name
        assert (len(spec.agent_names), spec.num_turns, spec.description) == (agents, turns, description), name


# ---------------------------------------------------------------------------------------------------------------
# one-line errors
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--config", "no/such/config.yaml"], ["no/such/config.yaml"]),
        (["--config", CC_CPU, "--learning_rate", "abc"], ["--learning_rate", "abc"]),
        (["--config", CC_CPU, "--critic_type", "central"], ["critic_type"]),
        (["--config", CC_CPU, "--task_options", "{bad"], ["--task_options", "JSON"]),
        (["--config", CC_CPU, "--task_options", "[1, 2]"], ["--task_options", "object"]),
        (["--config", CC_CPU, "--no_such_flag", "1"], ["no_such_flag"]),
        (["--config", CC_CPU, "--agent_models", "tiny"], ["--agent_models", "1 model(s) for 2 agents"]),
        (["--config", CC_CPU, "--train_limit", "4"], ["has 4 rows", "takes 16", "--per_device_train_batch_size"]),
        (["--config", CC_CPU, "--task", "nomodule_xyz:TASK"], ["nomodule_xyz", "PYTHONPATH"]),
        (
            ["--task", "coord-penalty", "--model_name_or_path", "tiny", "--bf16", "true", "--report_to", "none"],
            ["bf16"],
        ),
    ],
)
def test_user_errors_print_one_line_and_exit_2(tmp_path, capsys, extra, expected):
    err = _one_line_error(capsys, ["ppo", "--output_dir", str(tmp_path / "out"), *extra])
    for text in expected:
        assert text in err, err


def test_report_to_tensorboard_without_tensorboard_is_one_line(tmp_path, capsys, monkeypatch):
    """The GPU configs log to TensorBoard: without the package the CLI says which extra to install, before any
    model loads (transformers would fail in the trainer's __init__)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a, **k: None if name.startswith("tensorboard") else real(name, *a, **k),
    )
    err = _one_line_error(
        capsys, ["ppo", "--config", CC_CPU, "--report_to", "tensorboard", "--output_dir", str(tmp_path / "out")]
    )
    assert "pip install 'trl-collm[tensorboard]'" in err and "--report_to none" in err
    # the extra exists (tomllib is Python 3.11+, the package supports 3.10: read the line)
    assert re.search(r'^tensorboard = \["tensorboard>=', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)


def test_a_missing_model_is_one_line(tmp_path, capsys, model_cache):
    err = _one_line_error(
        capsys,
        [
            "ppo",
            "--config",
            CC_CPU,
            "--output_dir",
            str(tmp_path / "out"),
            "--model_name_or_path",
            str(tmp_path / "no-such-model"),
        ],
    )
    assert "no-such-model" in err


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(UsageError) as info:
        main(["ppo", "--config", str(tmp_path / "missing.yaml"), "--debug"])
    assert isinstance(info.value.__cause__, FileNotFoundError)
    env = dict(os.environ, TRL_COLLM_DEBUG="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "trl_collm.cli", "eval", "--team_dir", str(tmp_path), "--task", "coord-penalty"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=HANG_GUARD_S, env=env, cwd=ROOT)
    assert res.returncode == 1 and "Traceback (most recent call last)" in res.stderr and "UsageError" in res.stderr
    env.pop("TRL_COLLM_DEBUG")
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=HANG_GUARD_S, env=env, cwd=ROOT)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "team.json" in res.stderr


def test_a_bug_during_training_keeps_its_traceback(tmp_path, monkeypatch, model_cache):
    """Only argument / config / set-up errors become one line: an error raised while training is not the user's."""
    from trl_collm.trainers import MultiAgentPPOTrainer

    def broken_train(self, *a, **k):
        raise ValueError("a bug inside train()")

    monkeypatch.setattr(MultiAgentPPOTrainer, "train", broken_train)
    with pytest.raises(ValueError, match="a bug inside train"):
        main(["ppo", "--config", CC_CPU, "--output_dir", str(tmp_path / "out"), *SHORT])


# ---------------------------------------------------------------------------------------------------------------
# push_to_hub
# ---------------------------------------------------------------------------------------------------------------


def test_push_offline_or_without_token_fails_before_any_model_loads(tmp_path, capsys, monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants

    out = tmp_path / "out"
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    err = _one_line_error(capsys, ["ppo", "--config", CC_CPU, "--output_dir", str(out), "--push_to_hub", "true"])
    assert "--push_to_hub" in err and "HF_HUB_OFFLINE" in err
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    err = _one_line_error(capsys, ["ppo", "--config", CC_CPU, "--output_dir", str(out), "--push_to_hub", "true"])
    assert "--push_to_hub" in err and "token" in err and "--hub_token" in err
    assert not out.exists()


class _FakeApi:
    def __init__(self, fail: bool):
        self.fail, self.uploaded = fail, None

    def create_repo(self, repo_id, **kw):
        if self.fail:
            raise OSError("cannot reach huggingface.co")
        return type("Repo", (), {"repo_id": f"me/{repo_id}"})()

    def upload_folder(self, repo_id, folder_path, **kw):
        self.uploaded = (
            repo_id,
            sorted(os.path.relpath(os.path.join(r, f), folder_path) for r, _, fs in os.walk(folder_path) for f in fs),
        )
        self.card = Path(folder_path, "README.md").read_text()


@pytest.mark.parametrize("fail", [True, False])
def test_push_happens_after_training(tmp_path, capsys, monkeypatch, model_cache, fail):
    """The trainer is built without creating the repo; the team is trained and saved, then pushed. A failing push
    is one line that says where the saved team is."""
    import transformers.trainer as hf_trainer
    from huggingface_hub import constants

    api = _FakeApi(fail)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_trainer, "hf_api", lambda: api)
    out = tmp_path / "pushed-team"
    argv = [
        "ppo",
        "--config",
        CC_CPU,
        "--output_dir",
        str(out),
        "--push_to_hub",
        "true",
        "--hub_token",
        "hf_fake",
        *SHORT,
    ]
    if fail:
        err = _one_line_error(capsys, argv, after_training=True)
        assert f"saved in {out}" in err and "cannot reach huggingface.co" in err
    else:
        assert main(argv) == 0
        repo, files = api.uploaded
        assert repo == "me/pushed-team" and {"team.json", "README.md", "player_1/model.safetensors"} <= set(files)
        assert "None" not in api.card and "me/pushed-team" in api.card
    assert (out / "team.json").is_file() and (out / "README.md").is_file()


# ---------------------------------------------------------------------------------------------------------------
# eval / play refuse a team that does not fit the task
# ---------------------------------------------------------------------------------------------------------------


def test_eval_refuses_teams_that_do_not_fit(tmp_path, capsys, qwen_path):
    coord = _fake_team(tmp_path / "coord", qwen_path, ["player_1", "player_2"], num_turns=1)
    err = _one_line_error(capsys, ["eval", "--team_dir", str(coord), "--task", "building-str"])
    assert "['player_1', 'player_2']" in err and "['builder_a', 'builder_b']" in err and "building-str" in err

    trio = _fake_team(tmp_path / "trio", qwen_path, ["agent_1", "agent_2", "agent_3"], num_turns=1)
    err = _one_line_error(capsys, ["play", "--team_dir", str(trio), "--task", "coord-penalty"])
    assert "has 2 agents" in err and "has 3" in err
    # ... but the same team fits the 3-agent variant of coord-numbers
    capsys.readouterr()
    assert (
        main(
            [
                "eval",
                "--team_dir",
                str(trio),
                "--task",
                "coord-numbers",
                "--task_options",
                '{"num_agents": 3}',
                "--limit",
                "2",
            ]
        )
        == 0
    )

    long = _fake_team(tmp_path / "long", qwen_path, ["player_1", "player_2"], num_turns=4)
    err = _one_line_error(capsys, ["eval", "--team_dir", str(long), "--task", "coord-penalty"])
    assert "trained for 4 turn(s)" in err and "runs 1" in err
    short = _fake_team(tmp_path / "short", qwen_path, ["player_1", "player_2"], num_turns=2)
    err = _one_line_error(capsys, ["eval", "--team_dir", str(short), "--task", "coord-repeated"])
    assert "--task_options '{\"turns\": 2}'" in err

    shutil.rmtree(coord / "player_2")
    err = _one_line_error(capsys, ["eval", "--team_dir", str(coord), "--task", "coord-penalty"])
    assert "player_2" in err and "missing" in err
    (coord / "player_1" / "config.json").unlink()
    shutil.copytree(qwen_path, coord / "player_2")
    err = _one_line_error(capsys, ["eval", "--team_dir", str(coord), "--task", "coord-penalty"])
    assert "player_1" in err and "config.json" in err


def test_render_is_refused_for_a_task_without_pictures(tmp_path, capsys, qwen_path):
    coord = _fake_team(tmp_path / "coord", qwen_path, ["player_1", "player_2"], num_turns=1)
    err = _one_line_error(
        capsys, ["play", "--team_dir", str(coord), "--task", "coord-penalty", "--render", str(tmp_path / "png")]
    )
    assert "--render" in err and "building game" in err


@pytest.mark.skipif(__import__("importlib").util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_play_renders_the_building_game_per_turn(tmp_path, capsys, qwen_path):
    team = _fake_team(tmp_path / "builders", qwen_path, ["builder_a", "builder_b"], num_turns=4, response_length=6)
    out = tmp_path / "png"
    capsys.readouterr()
    assert (
        main(
            [
                "play",
                "--team_dir",
                str(team),
                "--task",
                "building-str",
                "--dataset_source",
                "I",
                "--limit",
                "1",
                "--task_options",
                '{"max_listed": 4}',
                "--render",
                str(out),
            ]
        )
        == 0
    )
    assert "rendered 5 PNG(s)" in capsys.readouterr().out
    for t in range(5):
        data = (out / f"episode_0_turn_{t}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", data[16:24])
        assert width >= 250 and height >= 300


def test_one_letter_render_keeps_title_and_legend_inside(tmp_path):
    """A narrow (one-letter) world with a long title and a 6-entry legend: nothing drawn touches the picture's
    border (a cut-off title or legend would run into it), and the picture holds the title's text."""
    pytest.importorskip("matplotlib")
    import matplotlib.image as mpimg

    from trl_collm.tasks.voxel import World, render_png, string_target

    target = string_target("I")
    world = World(target.size)
    world.place((0, 0, 0), "red_wool"), world.place((1, 0, 0), "blue_wool"), world.place((2, 0, 0), "yellow_wool")
    world.place((3, 0, 0), "green_wool"), world.place((0, 1, 0), "green_wool")  # (0, 1) is outside the target
    title = "I: turn 4/4, score 1.23, IoU 100%, Adj 100% (a long title)"
    path = render_png(world, tmp_path / "I.png", target=target, title=title, dpi=100)
    pixels = mpimg.imread(path)[..., :3]
    border = [pixels[:3], pixels[-3:], pixels[:, :3], pixels[:, -3:]]
    assert all((b > 0.99).all() for b in border), "something is drawn up to the edge: cut off"
    height, width = pixels.shape[:2]
    assert width >= 0.06 * len(title) * 100  # at least the title's width at 10 pt (~0.6 em per character)
    assert height >= 300


# ---------------------------------------------------------------------------------------------------------------
# your own task
# ---------------------------------------------------------------------------------------------------------------

MY_TASKS = """
from datasets import Dataset

from trl_collm import RewardFunctionEnv
from trl_collm.tasks import TaskSpec


def same_first_letter(prompts, completions, **columns):
    return [float(a[:1] == b[:1]) for a, b in completions]


def make_env(**options):
    formatters = [lambda row: f"left {row['n']}", lambda row: f"right {row['n']}"]
    return RewardFunctionEnv([same_first_letter], formatters=formatters)


def load_dataset(split="train", source=None, limit=None):
    n = limit or 8
    return Dataset.from_dict({"n": list(range(n))})


TASK = TaskSpec("same-letter", "Both agents start with the same letter.", ["left", "right"], 1, make_env, load_dataset,
                max_reward=1.0)


def make_task():
    return TASK


NOT_A_TASK = 3
"""


def test_your_own_task_by_import_path(tmp_path, capsys, monkeypatch, model_cache):
    (tmp_path / "my_tasks.py").write_text(MY_TASKS)
    out = tmp_path / "team"
    assert (
        main(
            [
                "ppo",
                "--task",
                f"{tmp_path / 'my_tasks.py'}:make_task",
                "--model_name_or_path",
                "tiny",
                "--use_cpu",
                "true",
                "--bf16",
                "false",
                "--report_to",
                "none",
                "--response_length",
                "2",
                "--output_dir",
                str(out),
                "--save_strategy",
                "no",
                "--num_sample_generations",
                "0",
                *SHORT,
            ]
        )
        == 0
    )
    desc = json.loads((out / "team.json").read_text())
    assert desc["agents"] == ["left", "right"]
    card = (out / "README.md").read_text()
    assert "get_task('my_tasks.py:make_task')" in card and str(tmp_path) not in card  # portable: no local path
    # team.json keeps the reference as given: eval finds the task without --task
    assert desc["task"]["ref"] == f"{tmp_path / 'my_tasks.py'}:make_task" and desc["task"]["name"] == "same-letter"
    capsys.readouterr()
    assert main(["eval", "--team_dir", str(out), "--limit", "2"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["task"] == "same-letter"
    # the module form, found in the current directory as `python -m` would
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["eval", "--team_dir", str(out), "--task", "my_tasks:TASK", "--limit", "2"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["task"] == "same-letter" and summary["episodes"] == 2 and 0.0 <= summary["mean_return"] <= 1.0
    assert "no attribute 'NOPE'" in _one_line_error(capsys, ["eval", "--team_dir", str(out), "--task", "my_tasks:NOPE"])
    err = _one_line_error(capsys, ["eval", "--team_dir", str(out), "--task", "my_tasks:NOT_A_TASK"])
    assert "not a trl_collm.tasks.TaskSpec" in err
    err = _one_line_error(capsys, ["eval", "--team_dir", str(out), "--task", "missing_file.py:TASK"])
    assert "no file 'missing_file.py'" in err


# ---------------------------------------------------------------------------------------------------------------
# quiet loading
# ---------------------------------------------------------------------------------------------------------------


def test_value_model_load_report_is_one_explained_line(caplog, qwen_path):
    """A value model made from a causal LM: transformers' LOAD REPORT table (missing `score`, unexpected
    `lm_head`) is replaced by one line, once per process; another model's report is untouched."""
    from transformers import AutoModelForSequenceClassification

    from trl_collm.team import load_report

    for f in list(logging_filters()):
        f.explained = False
    with caplog.at_level("WARNING", logger=load_report.LOGGER_NAME):
        for _ in range(2):
            AutoModelForSequenceClassification.from_pretrained(qwen_path, num_labels=1)
    messages = [r.getMessage() for r in caplog.records if r.name == load_report.LOGGER_NAME]
    assert not any("LOAD REPORT" in m for m in messages)
    assert sum("value head `score` is new" in m for m in messages) == 1
    other = "Foo LOAD REPORT from: x\nKey | Status\nbar.weight | MISSING |\n"
    assert not load_report.is_value_head_report(other)


def logging_filters():
    import logging

    from trl_collm.team.load_report import LOGGER_NAME, ValueHeadReportFilter

    return [f for f in logging.getLogger(LOGGER_NAME).filters if isinstance(f, ValueHeadReportFilter)]


# ---------------------------------------------------------------------------------------------------------------
# the README's usage snippet
# ---------------------------------------------------------------------------------------------------------------


def test_readme_usage_snippet_runs_on_cpu(tmp_path, monkeypatch, qwen_path):
    """The snippet exactly as written, with a tiny saved model in place of the Hub model (no use_cpu / bf16 flags:
    the config's defaults must work on a CPU-only machine)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only defaults")
    text = (ROOT / "README.md").read_text()
    snippet = re.search(r"## Usage\n+```python\n(.*?)```", text, re.DOTALL).group(1)
    assert snippet.count('"Qwen/Qwen3-1.7B"') == 1
    monkeypatch.chdir(tmp_path)
    code = snippet.replace('"Qwen/Qwen3-1.7B"', repr(qwen_path))
    exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - the README's own snippet
    desc = json.loads((tmp_path / "team" / "team.json").read_text())
    assert desc["agents"] == ["alice", "bob"] and desc["layout"] == "shared_base"
    for folder in ("alice", "bob", "critic"):
        assert (tmp_path / "team" / folder / "adapter_config.json").is_file(), folder


def test_task_options_a_task_does_not_know_are_refused_even_behind_star_star_options(tmp_path, capsys):
    """coord-penalty's make_env takes **options and ignored them: `{"bogus": 1}` trained and landed in team.json."""
    from trl_collm.cli.common import _check_options
    from trl_collm.tasks import TaskSpec, get_task

    err = _one_line_error(capsys, ["ppo", "--config", CC_CPU, "--task_options", '{"bogus": 1}'])
    assert "task 'coord-penalty' takes no option 'bogus' (its options: none); drop it" in err
    with pytest.raises(UsageError, match=r"takes no option 'num_turns' \(its options: \['sparse', 'turns'\]\)"):
        _check_options(get_task("coord-repeated"), {"num_turns": 2})  # its length option is `turns`
    _check_options(get_task("coord-repeated"), {"turns": 2, "sparse": False})  # named parameters
    _check_options(get_task("building-str"), {"max_listed": 4})  # **options forwarded, documented in TaskSpec.options

    def make_env(**options):
        return None

    def load_dataset(split="train", source=None, limit=None):
        return None

    mine = TaskSpec("mine", "a user's task", ["a", "b"], 1, make_env, load_dataset)
    with pytest.raises(UsageError, match=r"takes no option 'level'.*name it in make_env's signature or TaskSpec"):
        _check_options(mine, {"level": 3})
    mine.options = {"level": "how hard"}  # declared: passed on through **options
    _check_options(mine, {"level": 3})


def test_validation_errors_are_said_before_transformers_or_torch_is_imported(tmp_path):
    """A wrong task, model folder, config key, flag or flag value costs a YAML parse, not the ~5 CPU s of importing
    transformers and torch; an unknown task option costs the task module (torch, never transformers). The config-key
    and flag checks read what the last parser build kept (here the --help calls)."""
    (tmp_path / "typo.yaml").write_text("task: coord-penalty\nlearnin_rate: 0.1\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRL_COLLM_CACHE=str(tmp_path / "cache"))
    prime = "from trl_collm.cli import main; main(['ppo', '--help']); main(['mc', '--help'])"
    subprocess.run([sys.executable, "-c", prime], capture_output=True, env=env, cwd=ROOT, timeout=HANG_GUARD_S)
    cases = [
        ["ppo", "--config", CC_CPU, "--task", "nosuch"],
        ["ppo", "--config", CC_CPU, "--model_name_or_path", "./no/such/folder"],
        ["ppo", "--config", str(tmp_path / "typo.yaml")],
        ["mc", "--config", CC_CPU],
        ["ppo", "--config", CC_CPU, "--bad_flag", "1"],
        ["mc", "--loss_type", "foo"],
        ["ppo", "--config", CC_CPU, "--learning_rate"],
        ["ppo", "--config", CC_CPU, "--task_options", '{"bogus": 1}'],
    ]
    code = (
        "import contextlib, io, json, sys; from trl_collm.cli import main\n"
        f"out = []\nfor argv in {cases!r}:\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        code = main(argv)\n"
        "    out.append([code, err.getvalue().strip(), 'transformers' in sys.modules, 'torch' in sys.modules])\n"
        "print(json.dumps(out))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=HANG_GUARD_S
    )
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert [g[0] for g in got] == [2] * 8 and all(g[1].count("\n") == 0 for g in got), got
    assert "unknown task 'nosuch'" in got[0][1] and "./no/such/folder: no such folder" in got[1][1]
    assert "`learnin_rate` is not an option of trl-collm ppo" in got[2][1]
    assert "not an option of trl-collm mc but of trl-collm ppo: run `trl-collm ppo --config" in got[3][1]
    assert "--bad_flag is not an option" in got[4][1] and "`loss_type`='foo' is not valid" in got[5][1]
    assert "argument --learning_rate/--learning-rate: expected one argument" in got[6][1]
    assert "takes no option 'bogus'" in got[7][1]
    assert [g[2:] for g in got[:7]] == [[False, False]] * 7  # neither transformers nor torch for these
    assert got[7][2] is False  # the task's module brought torch, still no transformers
