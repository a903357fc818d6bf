"""Fail loudly, lose nothing: non-finite numbers never reach weights or checkpoints, every numeric config field is
range-checked where it enters, files the library reads fail with a message naming the file, and a second run never
silently overwrites the checkpoints of a first."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import typing
from typing import Annotated

import pytest
import torch
from transformers import HfArgumentParser

from trl_collm import MultiAgentMCConfig, MultiAgentPPOConfig, MultiAgentPPOTrainer
from trl_collm.trainers import checkpoints
from trl_collm.trainers.ranges import INHERITED_RANGES, UNIT, Range


def ok_reward(prompts, completions, **kwargs):
    return [float(len(c[0]) % 3) - float(len(c[-1]) % 2) for c in completions]


def _all_finite(model: torch.nn.Module) -> bool:
    return all(torch.isfinite(p).all() for p in model.parameters())


# ---------------------------------------------------------------------------------------------------------------
# 3. every numeric config field is checked for range and finiteness
# ---------------------------------------------------------------------------------------------------------------

BASE = dict(output_dir="unused", use_cpu=True, bf16=False, report_to=[])


def _numeric_fields(cls):
    """Fields whose default is a float or an int (not a bool), or whose annotation says float/int."""
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        ann = str(f.type)
        if "bool" in ann or "Callable" in ann:
            continue
        if re.search(r"\b(float|int)\b", ann) and not re.search(r"\b(str|list|dict)\b", ann):
            out.append(f.name)
    return out


@pytest.mark.parametrize("cls", [MultiAgentPPOConfig, MultiAgentMCConfig])
def test_every_float_field_rejects_nan_and_inf(cls):
    names = [n for n in _numeric_fields(cls) if "float" in str({f.name: f.type for f in dataclasses.fields(cls)}[n])]
    assert {"learning_rate", "gamma", "temperature"} <= set(names)  # the walk finds the fields it should
    accepted = []
    for name in names:
        for bad in (math.nan, math.inf):
            try:
                cls(**BASE, **{name: bad})
            except ValueError as e:
                assert name in str(e), f"the error for {name}={bad} does not name the field: {e}"
            else:
                accepted.append((name, bad))
    assert not accepted, f"non-finite values accepted silently: {accepted}"


@pytest.mark.parametrize("cls", [MultiAgentPPOConfig, MultiAgentMCConfig])
def test_every_numeric_field_rejects_absurd_negatives(cls):
    """-1e9 is out of range for every numeric field we expose except the few that are genuinely signed."""
    signed = {
        "missing_eos_penalty",
        "early_termination_threshold",
        "seed",
        "data_seed",
        "local_rank",
        "stop_token_id",
        "max_steps",
        "eval_steps",
        "logging_steps",
        "save_steps",
        "warmup_steps",
        "warmup_ratio",
        "past_index",
        "ddp_timeout",
        "torch_compile",
        "hub_revision",
        "accelerator_config",
    }
    accepted = []
    for name in _numeric_fields(cls):
        if name in signed:
            continue
        try:
            cls(**BASE, **{name: -(10**9)})
        except (ValueError, TypeError):
            pass
        else:
            accepted.append(name)
    assert not accepted, f"-1e9 accepted silently for {accepted}"


@pytest.mark.parametrize(
    "cls,overrides,field",
    [
        (MultiAgentPPOConfig, dict(kl_coef=math.nan), "kl_coef"),
        (MultiAgentPPOConfig, dict(vf_coef=-1.0), "vf_coef"),
        (MultiAgentPPOConfig, dict(critic_learning_rate=-1.0), "critic_learning_rate"),
        (MultiAgentPPOConfig, dict(total_episodes=-4), "total_episodes"),
        (MultiAgentPPOConfig, dict(per_device_train_batch_size=0), "per_device_train_batch_size"),
        (MultiAgentPPOConfig, dict(learning_rate=-1e-5), "learning_rate"),
        (MultiAgentPPOConfig, dict(max_grad_norm=math.inf), "max_grad_norm"),
        (MultiAgentPPOConfig, dict(cliprange_value=-0.2), "cliprange_value"),
        (MultiAgentPPOConfig, dict(top_p=1.5), "top_p"),
        (MultiAgentPPOConfig, dict(top_k=-1), "top_k"),  # 0 is "off", as in TRL (tests/test_trl_user.py)
        (MultiAgentPPOConfig, dict(max_nonfinite_steps=0), "max_nonfinite_steps"),
        (MultiAgentMCConfig, dict(beta=math.nan), "beta"),
        (MultiAgentMCConfig, dict(epsilon=math.inf), "epsilon"),
        (MultiAgentMCConfig, dict(per_device_train_batch_size=0), "per_device_train_batch_size"),
    ],
)
def test_config_bad_value_names_the_field(cls, overrides, field):
    with pytest.raises(ValueError, match=re.escape(f"`{field}`")):
        cls(**BASE, **overrides)


def test_good_configs_still_parse():
    """Values at the edges of their ranges are kept as given (0 coefficients, a negative penalty, the fewest MC
    samples a baseline allows), and the preset still fills what was not given."""
    ppo = MultiAgentPPOConfig(**BASE, kl_coef=0.0, vf_coef=0.0, total_episodes=8, missing_eos_penalty=-1.0, top_k=5)
    assert (ppo.kl_coef, ppo.vf_coef, ppo.total_episodes, ppo.missing_eos_penalty, ppo.top_k) == (0.0, 0.0, 8, -1.0, 5)
    mc = MultiAgentMCConfig(**BASE, beta=0.0, num_generations=2)
    assert (mc.beta, mc.num_generations) == (0.0, 2)
    collm = MultiAgentPPOConfig(**BASE, preset="collm")
    assert (collm.preset, collm.gamma, collm.lam, collm.policy_loss_type) == ("collm", 0.9, 0.0, "reinforce")


# ---------------------------------------------------------------------------------------------------------------
# 2. non-finite rewards, losses and weights
# ---------------------------------------------------------------------------------------------------------------


def test_reward_that_overflows_float32_is_rejected(tmp_path, make_config, prompts_dataset, qwen_path):
    def huge(prompts, completions, **kwargs):
        return [1e39 if i == 2 else 1.0 for i in range(len(completions))]

    args = make_config(tmp_path, num_agents=2)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=huge)
    with pytest.raises(ValueError, match=r"reward function 'huge'.*1e\+39.*episode 2.*float32"):
        tr.train()
    assert not _any_checkpoint(tmp_path / "out")


def test_reward_weights_whose_product_overflows_are_rejected(tmp_path, make_config, prompts_dataset, qwen_path):
    def big(prompts, completions, **kwargs):
        return [1e30 for _ in completions]

    args = make_config(tmp_path, num_agents=2, reward_weights=[1e10])
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=big)
    with pytest.raises(ValueError, match=r"reward_weights.*'big'.*episode 0"):
        tr.train()


def _any_checkpoint(out) -> bool:
    return os.path.isdir(out) and any(n.startswith("checkpoint-") for n in os.listdir(out))


def test_exploding_updates_are_skipped_and_counted_then_stop(tmp_path, make_config, prompts_dataset, qwen_path):
    """A learning rate so large that the first update makes the next losses non-finite: the poisoned steps are
    skipped (weights stay finite, no checkpoint holds NaN) and the run stops with a clear error."""
    args = make_config(
        tmp_path,
        num_agents=2,
        learning_rate=1e30,
        total_episodes=40,
        max_nonfinite_steps=3,
        save_strategy="steps",
        save_steps=1,
        num_ppo_epochs=4,
        max_grad_norm=None,
    )
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    with pytest.raises(
        FloatingPointError, match=r"(optimizer steps in a row.*max_nonfinite_steps|weights have diverged)"
    ):
        tr.train()
    assert _all_finite(tr.model)
    skipped = [m.get("train/nonfinite_steps_skipped", 0) for m in tr._metrics_history]
    assert sum(skipped) + tr.nonfinite_steps.in_a_row >= 1
    for ck in checkpoints.complete_checkpoints(str(tmp_path / "out")):
        state = torch.load(os.path.join(ck, checkpoints.STATE_FILE), map_location="cpu", weights_only=False)
        assert all(torch.isfinite(v).all() for v in state["params"].values()), ck


def test_one_nonfinite_loss_is_skipped_and_training_continues(tmp_path, make_config, prompts_dataset, qwen_path):
    """kl_coef is fine, but a poisoned step (forced through the loss) is skipped: the weights do not change on that
    step, the counter says so, and the next steps train normally."""
    args = make_config(tmp_path, num_agents=2, total_episodes=12, num_ppo_epochs=1)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    calls = {"n": 0}
    original = tr.step_losses

    def poisoned(*a, **k):
        for loss, *rest in original(*a, **k):
            calls["n"] += 1
            if calls["n"] == 1:
                loss = loss * float("nan")
            yield (loss, *rest)

    tr.step_losses = poisoned
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters() if p.requires_grad}
    tr.train()
    hist = tr._metrics_history
    assert hist[0]["train/nonfinite_steps_skipped"] == 1
    assert all(m["train/nonfinite_steps_skipped"] == 0 for m in hist[1:])
    assert _all_finite(tr.model)
    changed = [n for n, p in tr.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert changed, "the later steps must still train"


def test_checkpoint_is_never_written_from_nonfinite_weights(tmp_path, make_config, prompts_dataset, qwen_path):
    args = make_config(tmp_path, num_agents=2)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    tr.train()
    name, param = next((n, p) for n, p in tr.model.named_parameters() if p.requires_grad)
    with torch.no_grad():
        param.view(-1)[0] = float("nan")
    with pytest.raises(FloatingPointError, match=re.escape(name)):
        checkpoints.save_checkpoint(tr, str(tmp_path / "out"))
    assert not _any_checkpoint(tmp_path / "out")
    assert not any(n.endswith(".tmp") for n in os.listdir(tmp_path / "out"))


def _trained_checkpoint(tmp_path, make_config, prompts_dataset, qwen_path, **cfg):
    args = make_config(tmp_path, num_agents=2, save_strategy="steps", save_steps=1, **cfg)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    tr.train()
    found = checkpoints.complete_checkpoints(str(tmp_path / "out"))
    assert found
    return args, found[-1]


def test_resume_refuses_a_poisoned_checkpoint(tmp_path, make_config, prompts_dataset, qwen_path):
    args, ck = _trained_checkpoint(tmp_path, make_config, prompts_dataset, qwen_path)
    path = os.path.join(ck, checkpoints.STATE_FILE)
    state = torch.load(path, map_location="cpu", weights_only=False)
    key = next(iter(state["params"]))
    state["params"][key].view(-1)[0] = float("inf")
    torch.save(state, path)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    with pytest.raises(ValueError, match=re.escape(ck) + ".*non-finite.*" + re.escape(key)):
        tr.train(resume_from_checkpoint=ck)


def test_resume_from_a_truncated_checkpoint_names_the_file(tmp_path, make_config, prompts_dataset, qwen_path):
    args, ck = _trained_checkpoint(tmp_path, make_config, prompts_dataset, qwen_path)
    path = os.path.join(ck, checkpoints.STATE_FILE)
    with open(path, "r+b") as f:
        f.truncate(100)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    with pytest.raises(ValueError, match=re.escape(path) + ".*(damaged|cannot be read)"):
        tr.train(resume_from_checkpoint=ck)


def test_resume_into_a_different_team_names_the_mismatch(tmp_path, make_config, prompts_dataset, qwen_path):
    _, ck = _trained_checkpoint(tmp_path, make_config, prompts_dataset, qwen_path)
    args = make_config(tmp_path, num_agents=3, save_strategy="no")
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    with pytest.raises(ValueError, match=re.escape(ck) + ".*does not match this team"):
        tr.train(resume_from_checkpoint=ck)


# ---------------------------------------------------------------------------------------------------------------
# files the library reads
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def saved_team(tmp_path, make_config, prompts_dataset, qwen_path):
    args = make_config(tmp_path, num_agents=2)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    folder = tmp_path / "team"
    tr.save_model(str(folder))
    return folder


@pytest.mark.parametrize(
    "damage,match",
    [
        (lambda d: d.pop("layout"), r"team\.json.*'layout'"),
        (lambda d: d.pop("agents"), r"team\.json.*'agents'"),
        (lambda d: d.__setitem__("agent_folders", {}), r"team\.json.*agent_folders"),
    ],
)
def test_load_team_with_a_damaged_team_file(saved_team, damage, match):
    from trl_collm.inference import load_team

    path = saved_team / "team.json"
    desc = json.loads(path.read_text())
    damage(desc)
    path.write_text(json.dumps(desc))
    with pytest.raises(ValueError, match=match):
        load_team(str(saved_team))


def test_load_team_with_invalid_json(saved_team):
    from trl_collm.inference import load_team

    (saved_team / "team.json").write_text('{"agents": ["a", ')
    with pytest.raises(ValueError, match=re.escape(str(saved_team / "team.json")) + ".*not valid JSON"):
        load_team(str(saved_team))


def test_load_team_with_a_missing_agent_folder(saved_team):
    import shutil

    from trl_collm.inference import load_team

    desc = json.loads((saved_team / "team.json").read_text())
    victim = desc["agents"][1]
    shutil.rmtree(saved_team / desc["agent_folders"][victim])
    with pytest.raises(ValueError, match=f"agent '{victim}'.*missing"):
        load_team(str(saved_team))


# ---------------------------------------------------------------------------------------------------------------
# 4. a second run never clobbers a first
# ---------------------------------------------------------------------------------------------------------------


def test_second_run_refuses_to_overwrite_checkpoints(tmp_path, make_config, prompts_dataset, qwen_path):
    args, ck = _trained_checkpoint(tmp_path, make_config, prompts_dataset, qwen_path)
    before = os.path.getmtime(os.path.join(ck, checkpoints.STATE_FILE))
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    with pytest.raises(ValueError, match=r"resume_from_checkpoint.*overwrite_output_dir"):
        tr.train()
    assert os.path.getmtime(os.path.join(ck, checkpoints.STATE_FILE)) == before


def test_second_run_with_overwrite_output_dir_starts_over(tmp_path, make_config, prompts_dataset, qwen_path):
    args, ck = _trained_checkpoint(tmp_path, make_config, prompts_dataset, qwen_path, total_episodes=12)
    assert os.path.basename(ck) == "checkpoint-3"
    args2 = make_config(tmp_path, num_agents=2, save_strategy="steps", save_steps=1, overwrite_output_dir=True)
    tr = MultiAgentPPOTrainer(args=args2, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    tr.train()
    names = [os.path.basename(p) for p in checkpoints.complete_checkpoints(str(tmp_path / "out"))]
    assert names == ["checkpoint-1", "checkpoint-2"]  # the old run's checkpoint-3 cannot be resumed by mistake


def test_resume_true_continues(tmp_path, make_config, prompts_dataset, qwen_path):
    args, ck = _trained_checkpoint(tmp_path, make_config, prompts_dataset, qwen_path)
    args2 = make_config(tmp_path, num_agents=2, save_strategy="steps", save_steps=1, total_episodes=12)
    tr = MultiAgentPPOTrainer(args=args2, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    tr.train(resume_from_checkpoint=True)
    assert tr.state.global_step == 3


# ---------------------------------------------------------------------------------------------------------------
# 5. the collm preset is the reference rule, team value included
# ---------------------------------------------------------------------------------------------------------------


def test_collm_preset_trains_one_team_value():
    args = MultiAgentPPOConfig(**BASE, preset="collm")
    assert args.centralized_value == "team"
    assert (
        MultiAgentPPOConfig(**BASE, preset="collm", centralized_value="agent_tagged").centralized_value
        == "agent_tagged"
    )
    # per-agent rewards need a value per agent: the preset leaves the default there instead of failing
    assert MultiAgentPPOConfig(**BASE, preset="collm", reward_type="per_agent").centralized_value == "per_agent_heads"


# ---------------------------------------------------------------------------------------------------------------
# 1. tokenizers as real families ship them (the script path is in tests/test_dropin.py)
# ---------------------------------------------------------------------------------------------------------------


def test_pad_equal_to_eos_keeps_the_eos_in_the_action(tmp_path, make_config, prompts_dataset):
    """Qwen-shaped tokenizers use one id for pad and eos: the first eos ends (and belongs to) the action, and what
    generate() appends after it is padding."""
    from trl_collm.testing import save_tiny_model

    path = save_tiny_model(tmp_path, "qwen-family", family="qwen")
    args = make_config(tmp_path, num_agents=1, advantage_level="turn")
    tr = MultiAgentPPOTrainer(args=args, model=path, train_dataset=prompts_dataset, reward_funcs=ok_reward)
    tok = tr.team.tokenizers["policy"]
    assert tok.pad_token_id == tok.eos_token_id
    eos, a, b = tok.eos_token_id, 40, 41
    q_ids, q_mask = tr.team.encode("policy", ["hello there"], "cpu")
    gen = tr.sampler._finish("policy", q_ids, q_mask, torch.tensor([[a, b, eos, eos, eos]]), None)
    assert gen.response_mask.tolist() == [[True, True, True, False, False]]
    assert bool(gen.ended[0])
    tr.train()  # and a whole run works with it


def test_pad_without_an_embedding_row_never_reaches_a_model(tmp_path, make_config, prompts_dataset):
    """A pad token added after the model was built (Llama shape: no spare rows) is replaced by an id the model can
    embed wherever padding is written, for the policy, the critic and generation alike."""
    from transformers import AutoTokenizer

    from trl_collm.team.modeling import input_pad_id
    from trl_collm.testing import save_tiny_model

    path = save_tiny_model(tmp_path, "llama-family", family="llama")
    tok = AutoTokenizer.from_pretrained(path)
    tok.add_special_tokens({"pad_token": "[PAD]"})
    args = make_config(tmp_path, num_agents=2, critic_type="decentralized")
    tr = MultiAgentPPOTrainer(
        args=args, model=path, processing_class=tok, train_dataset=prompts_dataset, reward_funcs=ok_reward
    )
    rows = tr.team.model_of("agent_0").get_input_embeddings().num_embeddings
    assert tok.pad_token_id == rows  # one past the table
    assert tr.team.pad_id("agent_0") == tok.eos_token_id
    assert input_pad_id(tok, tr.team.model_of("agent_0")) == tok.eos_token_id
    ids, mask = tr.team.encode("agent_0", ["a", "a much longer prompt than that"], "cpu")
    assert int(ids.max()) < rows and int(ids[0, 0]) == tok.eos_token_id and int(mask[0, 0]) == 0
    tr.train()


# ---------------------------------------------------------------------------------------------------------------
# a field's range lives beside the field (its annotation), read by the one checker
# ---------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _WithMix(MultiAgentPPOConfig):
    """A user's config: one new field, its range in its annotation."""

    mix: Annotated[float, UNIT] = dataclasses.field(default=0.5, metadata={"help": "a new weight in [0, 1]"})


def test_a_range_declared_beside_a_new_field_is_enforced_and_the_cli_still_parses():
    """The checker enforces a subclass field's annotated range, and HfArgumentParser (TrlParser, the CLI) still
    builds a parser for the class (a `metadata` key would make argparse refuse it)."""
    with pytest.raises(ValueError, match=re.escape("`mix` must be in [0, 1], got 1.5.")):
        _WithMix(**BASE, mix=1.5)
    (args,) = HfArgumentParser(_WithMix).parse_args_into_dataclasses(
        ["--output_dir", "unused", "--use_cpu", "true", "--bf16", "false", "--report_to", "none", "--mix", "0.25"]
    )
    assert args.mix == 0.25


@pytest.mark.parametrize("cls", [MultiAgentPPOConfig, MultiAgentMCConfig])
def test_every_numeric_field_we_declare_states_its_range(cls):
    """Every int / float field carries its range beside it, except TrainingArguments' (in `INHERITED_RANGES`)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    numeric = [n for n in _numeric_fields(cls) if n not in INHERITED_RANGES]
    assert {"gamma", "learning_rate", "lam" if cls is MultiAgentPPOConfig else "epsilon"} <= set(numeric)
    missing = [n for n in numeric if not any(isinstance(m, Range) for m in getattr(hints[n], "__metadata__", ()))]
    assert not missing, f"numeric fields without Annotated[..., <range>]: {missing}"


def test_critic_config_checked_once_per_config(monkeypatch):
    from trl_collm.critics import layouts
    from trl_collm.trainers import ppo_config

    calls = []
    original = layouts.check_critic_config
    monkeypatch.setattr(ppo_config, "check_critic_config", lambda args: calls.append(1) or original(args))
    MultiAgentPPOConfig(**BASE)
    assert len(calls) == 1
