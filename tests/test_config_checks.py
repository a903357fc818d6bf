"""Config mistakes a TRL user makes that used to be accepted silently (or fail late): each refused or warned about
when the config is made, in one line naming the field and the fix."""

from __future__ import annotations

import warnings

import pytest

from trl_collm import MultiAgentPPOConfig


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
