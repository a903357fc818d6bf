"""Config checks (trainers/ranges.py and the configs' validation): every numeric field is checked for range and
finiteness where it enters, a field's range lives beside the field, and the critic options are checked once."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
import warnings
from typing import Annotated

import pytest
from transformers import HfArgumentParser

from trl_collm import MultiAgentMCConfig, MultiAgentPPOConfig
from trl_collm.trainers.ranges import INHERITED_RANGES, UNIT, Range

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
        (MultiAgentPPOConfig, dict(top_k=-1), "top_k"),  # 0 is "off", as in TRL (tests/test_trl_compat.py)
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
    """Every int / float field carries its range beside it, except TrainingArguments' (in `INHERITED_RANGES`) and
    GRPOConfig's refused fields, whose one accepted value is GRPO's default (`grpo_fields.check_grpo_fields`)."""
    from trl_collm.trainers.grpo_fields import GRPORefusedFields

    hints = typing.get_type_hints(cls, include_extras=True)
    refused = set(GRPORefusedFields.__dataclass_fields__)
    numeric = [n for n in _numeric_fields(cls) if n not in INHERITED_RANGES and n not in refused]
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


# ---------------------------------------------------------------------------------------------------------------
# mistakes a TRL user makes that used to be accepted silently (or fail late): refused or warned where the config is
# made, in one line naming the field and the fix
# ---------------------------------------------------------------------------------------------------------------


def _config(tmp_path, **kw):
    return MultiAgentPPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kw)


def test_decentralized_critic_refuses_a_centralized_value_mode(tmp_path):
    with pytest.raises(ValueError, match=r"`centralized_value`='team' applies to critic_type='centralized' only"):
        _config(tmp_path, bf16=False, critic_type="decentralized", centralized_value="team")
    with pytest.raises(ValueError, match="agent_tagged"):
        _config(tmp_path, bf16=False, critic_type="decentralized", centralized_value="agent_tagged")
    # The reference preset sets centralized_value='team' for its centralized critic: with a DC critic the preset
    # leaves the field alone, so `preset='collm'` still combines with critic_type='decentralized'.
    dc = _config(tmp_path, bf16=False, critic_type="decentralized", preset="collm")
    assert dc.centralized_value == "per_agent_heads" and dc.gamma == 0.9  # the rest of the preset applied
    assert _config(tmp_path, bf16=False, preset="collm").centralized_value == "team"  # CC: as before


def test_a_decentralized_critic_says_own_values_in_its_description(tmp_path):
    from trl_collm.critics import DecentralizedCritic

    critic = DecentralizedCritic(["a", "b"], _config(tmp_path, bf16=False, critic_type="decentralized"), False)
    assert critic.describe()["value_mode"] == "own"  # team.json and the card: not the CC field's default


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [("learning_rate", "1e-3", "learning_rate=0.001"), ("num_ppo_epochs", "two", "num_ppo_epochs=a number")],
)
def test_a_number_given_as_a_string_is_refused_where_the_config_is_made(tmp_path, field, value, shown):
    with pytest.raises(ValueError, match=rf"`{field}`='{value}' is a string; pass a number \({shown}\)") as info:
        _config(tmp_path, bf16=False, **{field: value})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("native", [False, True])
def test_bf16_on_a_cpu_without_native_bf16_warns_once(tmp_path, monkeypatch, native):
    import trl_collm.hardware as hardware

    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: native)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _config(tmp_path, bf16=True)
        _config(tmp_path, bf16=False)
    slow = [str(w.message) for w in seen if "native bf16" in str(w.message)]
    if native:
        assert slow == []
    else:
        assert len(slow) == 1 and "about 6x slower than float32" in slow[0] and "bf16=False" in slow[0]
        assert "\n" not in slow[0]
