"""Nothing silently wrong, nothing lost (issue 22, parts 1 and 2): explicit fields beat a preset, a resume onto
another base is refused, one run at a time per output_dir, nothing is deleted before the checks that can fail,
saved teams are written atomically, agent names are checked at every entry point, and an unwritable output_dir
fails before training."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import pytest
import torch
import yaml
from trl import TrlParser

from trl_collm import MultiAgentMCConfig, MultiAgentPPOConfig
from trl_collm.trainers import checkpoints
from trl_collm.trainers.presets import plain

from hang_guard import HANG_GUARD_S


def _reward(prompts, completions, **kwargs):
    return [float(len(c) % 3) for c in completions]


BASE = dict(output_dir="unused", use_cpu=True, bf16=False, report_to=[])

# Each field set explicitly to the library's default: the preset would otherwise replace it.
COLLM_AT_DEFAULTS = dict(centralized_value="per_agent_heads", policy_loss_type="ppo", gamma=1.0, kl_coef=0.05)
MAGRPO_AT_DEFAULTS = dict(gamma=1.0, temperature=0.7, beta=0.0, top_p=1.0)


def _defaults(cls, names):
    # a field a preset may fill holds its default wrapped (trainers/presets.py)
    return {f.name: plain(f.default) for f in cls.__dataclass_fields__.values() if f.name in names}


# ---------------------------------------------------------------------------------------------------------------
# a preset never overrides what the user set
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls,preset,explicit",
    [(MultiAgentPPOConfig, "collm", COLLM_AT_DEFAULTS), (MultiAgentMCConfig, "magrpo", MAGRPO_AT_DEFAULTS)],
)
def test_a_field_set_to_its_default_beats_the_preset(cls, preset, explicit):
    assert _defaults(cls, explicit) == explicit  # the point: each value is the library default
    preset_values = cls.presets[preset]
    assert any(preset_values[k] != v for k, v in explicit.items() if k in preset_values)
    args = cls(**BASE, preset=preset, **explicit)
    assert {k: getattr(args, k) for k in explicit} == explicit
    # the fields left unset still get the preset's values
    bare = cls(**BASE, preset=preset)
    for key, value in preset_values.items():
        if key not in explicit and key != "centralized_value":
            assert getattr(args, key) == value == getattr(bare, key), key


def test_preset_on_the_command_line_keeps_flags_and_yaml_keys_at_default_values(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(dict(preset="collm", kl_coef=0.05, gamma=1.0, use_cpu=True, report_to="none")))
    argv = ["--output_dir", str(tmp_path), "--config", str(config), "--policy_loss_type", "ppo"]
    (args,) = TrlParser(MultiAgentPPOConfig).parse_args_and_config(argv)
    assert (args.kl_coef, args.gamma, args.policy_loss_type) == (0.05, 1.0, "ppo")
    assert args.temperature == 0.6 and args.lam == 0.0  # not given: the preset's
    # a plain HfArgumentParser command line (no YAML)
    from transformers import HfArgumentParser

    argv = ["--output_dir", str(tmp_path), "--preset", "collm", "--gamma", "1.0", "--use_cpu", "true"]
    (args,) = HfArgumentParser(MultiAgentPPOConfig).parse_args_into_dataclasses(argv + ["--report_to", "none"])
    assert args.gamma == 1.0 and args.kl_coef == 0.0 and args.temperature == 0.6


# ---------------------------------------------------------------------------------------------------------------
# agent names: one check for agent_names, model={...} keys and team.json
# ---------------------------------------------------------------------------------------------------------------

BAD_NAMES = {
    "/tmp/elsewhere": "path separator",
    "x/y": "path separator",
    "x\\y": "path separator",
    "a\0b": "NUL",
    "a" * 300: "longer than",
    "v1.2": r"'\.'",
    ".": r"'\.'",
    "": "empty",
    "critic": "reserved",
}


@pytest.mark.parametrize("bad", list(BAD_NAMES), ids=[repr(n)[:20] for n in BAD_NAMES])
def test_agent_names_refused_in_the_config(bad):
    with pytest.raises(ValueError, match=r"`agent_names`.*" + BAD_NAMES[bad] + r".*set `agent_names`"):
        MultiAgentPPOConfig(**BASE, agent_names=["ok", bad])


@pytest.mark.parametrize("bad", ["/tmp/elsewhere", "x/y", "a\0b", "v1.2"], ids=["abs", "sep", "nul", "dot"])
def test_agent_names_refused_as_model_dict_keys(tmp_path, make_config, prompts_dataset, qwen_path, bad):
    from trl_collm import MultiAgentPPOTrainer

    args = make_config(tmp_path)
    with pytest.raises(ValueError, match=r"`model` \(a dict name -> model\).*" + BAD_NAMES[bad] + ".*`agent_names`"):
        MultiAgentPPOTrainer(
            args=args, model={"ok": qwen_path, bad: qwen_path}, train_dataset=prompts_dataset, reward_funcs=_reward
        )
    assert not (tmp_path / "out").exists() and not os.path.exists("/tmp/elsewhere")


def test_team_json_with_a_bad_agent_name_or_folder_is_refused(tmp_path):
    from trl_collm.team.saved import TEAM_FILE, read_team_file

    team = {"agents": ["a", "../b"], "layout": "separate", "agent_folders": {"a": "a", "../b": "../b"}}
    (tmp_path / TEAM_FILE).write_text(json.dumps(team))
    with pytest.raises(ValueError, match=re.escape(TEAM_FILE) + r".*'\.\./b'.*path separator"):
        read_team_file(str(tmp_path))
    team = {"agents": ["a", "b"], "layout": "separate", "agent_folders": {"a": "a", "b": "/etc"}}
    (tmp_path / TEAM_FILE).write_text(json.dumps(team))
    with pytest.raises(ValueError, match=re.escape(TEAM_FILE) + r".*'/etc'.*not the agents' own folders"):
        read_team_file(str(tmp_path))


# ---------------------------------------------------------------------------------------------------------------
# one run per output_dir, writable before training, nothing deleted before the checks
# ---------------------------------------------------------------------------------------------------------------


def _trainer(args, qwen_path, prompts_dataset, **kw):
    from trl_collm import MultiAgentPPOTrainer

    return MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=_reward, **kw)


def _holder_process(out) -> subprocess.Popen:
    """Another process holding output_dir's lock, as a running training would."""
    code = (
        "import sys, time; from trl_collm.trainers.output_dir import OutputDirLock; "
        f"OutputDirLock({str(out)!r}).acquire(); print('held', flush=True); time.sleep({2 * HANG_GUARD_S})"
    )
    os.makedirs(out, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_run_into_a_busy_output_dir_is_refused_then_a_crashed_holder_is_taken_over(
    tmp_path, make_config, prompts_dataset, qwen_path
):
    from trl_collm.trainers.output_dir import LOCK_FILE

    out = tmp_path / "out"
    holder = _holder_process(out)
    try:
        tr = _trainer(make_config(tmp_path, save_strategy="steps", save_steps=1), qwen_path, prompts_dataset)
        with pytest.raises(
            RuntimeError, match=rf"in use by another run \(pid {holder.pid} on host {socket.gethostname()}"
        ):
            tr.train()
        assert not checkpoints.complete_checkpoints(str(out))
    finally:
        holder.send_signal(signal.SIGKILL)  # a crash: the lock file stays behind
        holder.wait(timeout=HANG_GUARD_S)
    assert (out / LOCK_FILE).exists()
    tr.train()  # the holder's pid is dead on this host: a stale lock, taken over
    assert [os.path.basename(p) for p in checkpoints.complete_checkpoints(str(out))] == ["checkpoint-1", "checkpoint-2"]
    assert not (out / LOCK_FILE).exists()  # released at the end of the run


def test_two_runs_at_once_in_one_process_and_a_lock_from_another_host(
    tmp_path, make_config, prompts_dataset, qwen_path
):
    from transformers import TrainerCallback

    from trl_collm.trainers.output_dir import LOCK_FILE

    second = _trainer(make_config(tmp_path), qwen_path, prompts_dataset)
    refused = []

    class StartAnotherRun(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            with pytest.raises(RuntimeError, match=rf"in use by another run \(pid {os.getpid()} on host"):
                second.train()
            refused.append(state.global_step)

    first = _trainer(make_config(tmp_path), qwen_path, prompts_dataset, callbacks=[StartAnotherRun()])
    first.train()
    assert refused == [1, 2]
    lock = tmp_path / "out" / LOCK_FILE
    lock.write_text(json.dumps({"pid": 1, "host": "some-other-host"}))  # cannot be checked from here: never stale
    with pytest.raises(RuntimeError, match=r"pid 1 on host some-other-host.*delete .*\.trl_collm\.lock"):
        second.train()
    assert lock.exists()


@pytest.mark.parametrize("where", ["a file", "under a file", "in /proc"])
def test_unwritable_output_dir_fails_before_training(
    tmp_path, make_config, prompts_dataset, qwen_path, monkeypatch, where
):
    import trl_collm.trainers.base as base

    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    out = str({"a file": blocker, "under a file": blocker / "out", "in /proc": "/proc/trl_collm_out"}[where])
    message = re.escape(f"output_dir {out!r} is not a writable folder")
    # at construction, before any model is loaded
    with monkeypatch.context() as m:
        m.setattr(base, "build_team", lambda *a, **k: pytest.fail("the team was built before output_dir was checked"))
        with pytest.raises(PermissionError, match=message):
            _trainer(make_config(tmp_path, output_dir=out), qwen_path, prompts_dataset)
    # and again when train() starts (the folder may have changed since)
    tr = _trainer(make_config(tmp_path, save_strategy="steps", save_steps=1), qwen_path, prompts_dataset)
    tr.args.output_dir = out
    tr.training_iteration = lambda rows: pytest.fail("training started before output_dir was checked")
    with pytest.raises(PermissionError, match=message):
        tr.train()
    assert blocker.read_text() == "not a folder"


def test_overwrite_output_dir_deletes_nothing_when_a_check_fails(tmp_path, make_config, prompts_dataset, qwen_path):
    out = tmp_path / "out"
    _trainer(make_config(tmp_path, save_strategy="steps", save_steps=1), qwen_path, prompts_dataset).train()
    before = checkpoints.complete_checkpoints(str(out))
    assert len(before) == 2
    too_big = make_config(tmp_path, overwrite_output_dir=True, per_device_train_batch_size=len(prompts_dataset) + 1)
    with pytest.raises(ValueError, match="`train_dataset` has .* rows but one rollout batch"):
        _trainer(too_big, qwen_path, prompts_dataset).train()
    assert checkpoints.complete_checkpoints(str(out)) == before  # the old run is still resumable


# ---------------------------------------------------------------------------------------------------------------
# a saved team is whole or refused
# ---------------------------------------------------------------------------------------------------------------


def _weights(team) -> dict:
    return {a: torch.cat([p.detach().flatten() for p in team.model_of(a).parameters()]).clone() for a in team.names}


@pytest.fixture
def two_saves(tmp_path, make_config, prompts_dataset, qwen_path):
    """A trainer whose team is saved in `folder` (weights `old`), then changed in place (weights `new`)."""
    tr = _trainer(make_config(tmp_path, num_agents=2), qwen_path, prompts_dataset)
    folder = tmp_path / "team"
    tr.save_model(str(folder))
    old = _weights(tr.team)
    with torch.no_grad():
        for p in tr.team.parameters():
            p.add_(0.25)
    return tr, folder, old, _weights(tr.team)


def test_full_disk_while_saving_over_a_team_keeps_the_older_team_whole(two_saves, monkeypatch):
    from trl_collm.team.agents import AgentTeam
    from trl_collm.team.saved import load_team

    tr, folder, old, new = two_saves
    save_agent = AgentTeam.save_agent

    def second_agent_hits_a_full_disk(self, name, path, **kw):
        if name == self.names[1]:
            raise OSError(errno.ENOSPC, "No space left on device")
        save_agent(self, name, path, **kw)

    monkeypatch.setattr(AgentTeam, "save_agent", second_agent_hits_a_full_disk)
    with pytest.raises(OSError, match="No space left"):
        tr.save_model(str(folder))
    loaded = _weights(load_team(str(folder)))
    for a in tr.team.names:  # the older team, not one new agent beside one old one
        assert torch.equal(loaded[a], old[a]) and not torch.equal(loaded[a], new[a]), a


def test_save_killed_while_moving_into_place_is_refused_as_incomplete(two_saves, monkeypatch):
    from trl_collm.team import saved

    tr, folder, _, _ = two_saves
    replace = os.replace
    moved = []

    def killed_after_one_move(src, dst):
        if moved:
            raise KeyboardInterrupt  # the process dies between two renames
        if saved.TMP_FOLDER in src:
            moved.append(dst)
        replace(src, dst)

    monkeypatch.setattr(saved.os, "replace", killed_after_one_move)
    with pytest.raises(KeyboardInterrupt):
        tr.save_model(str(folder))
    monkeypatch.setattr(saved.os, "replace", replace)
    with pytest.raises(ValueError, match=re.escape(repr(str(folder))) + " holds an incomplete team"):
        saved.load_team(str(folder))


def test_load_team_refuses_a_folder_mixing_two_saves(two_saves, tmp_path):
    from trl_collm.team.saved import load_team

    tr, folder, _, _ = two_saves
    tr.save_model(str(tmp_path / "newer"))
    victim = tr.team.names[1]
    shutil.rmtree(folder / victim)
    shutil.copytree(tmp_path / "newer" / victim, folder / victim)  # one agent from another save
    with pytest.raises(ValueError, match=re.escape(repr(str(folder))) + f" mixes two saved teams: agent '{victim}'"):
        load_team(str(folder))
    assert set(load_team(str(tmp_path / "newer")).names) == set(tr.team.names)  # a whole team loads


# ---------------------------------------------------------------------------------------------------------------
# a resume onto another base model is refused
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["shared_base", "separate"])
def test_resume_onto_another_base_of_the_same_shapes_is_refused(
    tmp_path, make_config, prompts_dataset, qwen_path, layout
):
    from peft import LoraConfig

    from trl_collm.team.saved import resolve_base_ref
    from trl_collm.testing import tiny_model_dir

    other = tiny_model_dir("tiny-qwen2-seed1", seed=1)  # same architecture and shapes, other weights

    def lora():  # shared_base: one config (adapters on one base); separate: one LoRA model per agent
        cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
        return cfg if layout == "shared_base" else [cfg, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"])]

    args = make_config(tmp_path, num_agents=2, save_strategy="steps", save_steps=1)
    _trainer(args, qwen_path, prompts_dataset, peft_config=lora()).train()
    ck = checkpoints.complete_checkpoints(args.output_dir)[-1]
    recorded = json.loads(open(os.path.join(ck, "team.json")).read())["base"]["agent_0"]["model"]
    assert not os.path.isabs(recorded) and resolve_base_ref(recorded, ck) == qwen_path  # relative to the checkpoint

    resume = make_config(tmp_path, num_agents=2, save_strategy="no", total_episodes=12)
    tr = _trainer(resume, other, prompts_dataset, peft_config=lora())
    with pytest.raises(
        ValueError, match=re.escape(f"on base model {qwen_path!r}, but this run builds it on {other!r}")
    ):
        tr.train(resume_from_checkpoint=ck)
    # the same weights under another path (a local copy of the base) resume
    copy = shutil.copytree(qwen_path, tmp_path / "copy-of-base")
    tr = _trainer(resume, str(copy), prompts_dataset, peft_config=lora())
    tr.train(resume_from_checkpoint=ck)
    assert tr.state.global_step == 3


def test_fingerprint_samples_stay_inside_tensors_above_float32_precision():
    """SmolLM2's embedding has 49,152 x 576 = 28,311,552 elements: a float32 linspace put its last sample at
    index 28,311,552 (out of bounds), so a LoRA team of the real model could not start training."""
    from trl_collm.team.saved import _sample_indices

    for n in (1, 5, 64, 65, 2**24 + 1, 49_152 * 576):
        idx = _sample_indices(n, 64)
        assert len(idx) == min(n, 64) and int(idx[0]) == 0 and int(idx[-1]) == n - 1
        assert bool((idx[1:] > idx[:-1]).all())
