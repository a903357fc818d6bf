"""Every config field is documented in its class's "Parameters" docstring (TRL's shape), under its own name."""

from __future__ import annotations

import re

import pytest

from trl_collm import MultiAgentMCConfig, MultiAgentPPOConfig, TeamConfig
from trl_collm.trainers.backend_fields import GenerationBackendFields


@pytest.mark.parametrize("cls", [TeamConfig, GenerationBackendFields, MultiAgentPPOConfig, MultiAgentMCConfig])
def test_every_own_field_is_documented(cls):
    doc = cls.__doc__
    assert "Parameters:" in doc
    documented = re.findall(r"^        (\w+) \(`", doc, flags=re.M)
    own = list(cls.__dict__["__annotations__"])
    assert sorted(documented) == sorted(own), set(documented) ^ set(own)
