"""A centralized critic's joint view, cut to the critic's context: every agent keeps the latest part of its context
(the old cut kept only the end of the joined text and so lost the first agents' contexts whole)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch import nn

from trl_collm.critics.layouts import CentralizedCritic
from trl_collm.critics.views import centralized_view, fair_share
from trl_collm.team.modeling import truncate_left
from trl_collm.testing import build_tokenizer


@pytest.mark.parametrize(
    "lengths,budget,expected",
    [
        ([10, 20], 100, [10, 20]),  # fits: untouched
        ([10, 100, 100], 110, [10, 50, 50]),  # the short one keeps all; the long ones split the rest
        ([5, 7], 3, [2, 1]),  # an odd token goes to the first long context
        ([40, 40, 40], 0, [0, 0, 0]),
        ([3, 50, 8], 30, [3, 19, 8]),  # 3 and 8 fit their shares; 50 gets 30 - 11 = 19
    ],
)
def test_fair_share(lengths, budget, expected):
    keep = fair_share(lengths, budget)
    assert keep == expected
    assert sum(keep) <= max(budget, 0) or sum(lengths) <= budget


class _Unit(nn.Module):
    def __init__(self, tokenizer, max_tokens):
        super().__init__()
        self.tokenizer, self.max_tokens = tokenizer, max_tokens


def test_cut_view_keeps_every_agents_latest_words():
    tok = build_tokenizer()
    names = ["builder_a", "builder_b"]
    contexts = [
        " ".join(f"red{i}" for i in range(80)) + " LAST_A",
        " ".join(f"blue{i}" for i in range(80)) + " LAST_B",
    ]
    args = SimpleNamespace(centralized_value="team", critic_sees_joint_action=False)
    critic = CentralizedCritic(names, args, token_level=False)
    limit = 120
    critic.units["central"] = _Unit(tok, limit)
    full = tok(centralized_view(names, contexts), add_special_tokens=False)["input_ids"]
    assert len(full) > limit
    with pytest.warns(UserWarning):  # the old cut: the end of the joined text only
        old = tok.decode(truncate_left(full, limit, "critic view"))
    assert "builder_a" not in old and "LAST_A" not in old

    with pytest.warns(UserWarning, match="keeping the last"):
        fitted = critic._fit(contexts, None)
    view = centralized_view(names, fitted)
    assert len(tok(view, add_special_tokens=False)["input_ids"]) <= limit
    for name, text, last in zip(names, fitted, ("LAST_A", "LAST_B")):
        assert f"[{name}]" in view and text.split()[-1] == last
    # both contexts were cut, and by about the same amount (they were the same length)
    kept = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in fitted]
    assert all(k < len(tok(c, add_special_tokens=False)["input_ids"]) for k, c in zip(kept, contexts))
    assert abs(kept[0] - kept[1]) <= 4

    short = ["tiny", "small"]
    assert critic._fit(short, None) == short  # views that fit are not touched
