"""What the critics read (critics/views.py): the pure view functions, the views the trainer builds from a real
rollout, and a centralized critic's joint view cut to the critic's context, where every agent keeps the latest part
of its context (the old cut kept only the end of the joined text and so lost the first agents' contexts whole)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch import nn

from trl_collm.chat import history_context
from trl_collm.critics.layouts import CentralizedCritic
from trl_collm.critics.views import centralized_view, decentralized_view, fair_share
from trl_collm.team.modeling import truncate_left
from trl_collm.testing import build_tokenizer

NAMES = ["alpha", "beta"]
MARKERS = {"alpha": "ALPHA-marker", "beta": "BETA-marker"}


# ---------------------------------------------------------------------------------------------------------------
# Pure string functions
# ---------------------------------------------------------------------------------------------------------------


def test_decentralized_view_is_the_agents_own_context():
    ctx = "ALPHA-marker: solve 2 + 3"
    assert decentralized_view(ctx) == ctx


def test_centralized_view_tags_every_agent():
    text = centralized_view(NAMES, ["ALPHA-marker ctx", "BETA-marker ctx"])
    assert text == "[alpha] ALPHA-marker ctx\n\n[beta] BETA-marker ctx"


def test_centralized_view_with_joint_action_and_target():
    text = centralized_view(NAMES, ["ca", "cb"], actions=["x = 1", "y = 2"], target_agent="beta")
    assert text == (
        "[alpha] ca\n\n[beta] cb\n\n[joint action]\n[alpha action] x = 1\n[beta action] y = 2\n\n[value for beta]"
    )


def test_centralized_view_keeps_agent_order():
    a = centralized_view(["beta", "alpha"], ["cb", "ca"])
    assert a.index("[beta] cb") < a.index("[alpha] ca")


def test_centralized_view_rejects_count_mismatch():
    with pytest.raises(ValueError, match="1 contexts for 2 agents"):
        centralized_view(NAMES, ["only one"])


def test_history_context_interleaves_observations_and_actions():
    assert history_context(["o0", "o1", "o2"], ["a0", "a1"]) == "o0\na0\no1\na1\no2"
    assert history_context(["o0"], []) == "o0"
    with pytest.raises(ValueError, match="one more observation"):
        history_context(["o0", "o1"], ["a0", "a1"])


# ---------------------------------------------------------------------------------------------------------------
# Views the trainer builds from a rollout
# ---------------------------------------------------------------------------------------------------------------


def _formatters():
    return {a: (lambda row, m=m: f"{m} {row['prompt']}") for a, m in MARKERS.items()}


def _reward(prompts, completions, **kw):
    return [float(len(c[0]) % 3) for c in completions]


def _trainer(tmp_path, make_config, prompts_dataset, qwen_path, **cfg):
    from trl_collm import MultiAgentPPOTrainer

    args = make_config(tmp_path, agent_names=NAMES, **cfg)
    return MultiAgentPPOTrainer(
        args=args, model=qwen_path, train_dataset=prompts_dataset, reward_funcs=_reward, prompt_formatters=_formatters()
    )


def _rows(ds, k=4):
    return [ds[i] for i in range(k)]


def test_dc_critic_views_never_contain_another_agents_text(tmp_path, make_config, prompts_dataset, qwen_path):
    tr = _trainer(tmp_path, make_config, prompts_dataset, qwen_path, critic_type="decentralized")
    roll = tr.rollout(_rows(prompts_dataset))
    cbs = tr.critic.batches(roll)
    turn = roll.turns[0]
    assert sorted(cb.key for cb in cbs) == sorted(NAMES)  # one critic per agent
    for cb in cbs:
        (agent,) = cb.agents
        assert cb.key == agent
        other = [a for a in NAMES if a != agent][0]
        assert len(cb.views) == len(turn[agent].contexts) == 4
        for k, view in enumerate(cb.views):
            assert view == turn[agent].contexts[k]  # exactly what the policy was prompted with
            assert MARKERS[agent] in view
            assert MARKERS[other] not in view
            assert turn[other].contexts[k] not in view


def test_cc_critic_views_contain_every_agents_context(tmp_path, make_config, prompts_dataset, qwen_path):
    tr = _trainer(
        tmp_path, make_config, prompts_dataset, qwen_path, critic_type="centralized", critic_sees_joint_action=True
    )
    roll = tr.rollout(_rows(prompts_dataset))
    cbs = tr.critic.batches(roll)
    turn = roll.turns[0]
    assert len(cbs) == 1 and cbs[0].key == "central" and cbs[0].agents == NAMES  # per_agent_heads: one view, n values
    for k, view in enumerate(cbs[0].views):
        contexts = [turn[a].contexts[k] for a in NAMES]
        actions = [turn[a].gen.texts[k] for a in NAMES]
        for a, m in MARKERS.items():
            assert m in view
            assert f"[{a}] {turn[a].contexts[k]}" in view
            assert f"[{a} action] {turn[a].gen.texts[k]}" in view
        assert view == centralized_view(NAMES, contexts, actions)


def test_cc_agent_tagged_views_name_the_valued_agent(tmp_path, make_config, prompts_dataset, qwen_path):
    tr = _trainer(tmp_path, make_config, prompts_dataset, qwen_path, centralized_value="agent_tagged")
    roll = tr.rollout(_rows(prompts_dataset))
    cbs = tr.critic.batches(roll)
    assert [cb.agents for cb in cbs] == [["alpha"], ["beta"]]
    for cb in cbs:
        target = cb.agents[0]
        for view in cb.views:
            assert all(m in view for m in MARKERS.values())
            assert view.endswith(f"[value for {target}]")


def test_dc_history_views_stay_private_over_turns(tmp_path, make_config, prompts_dataset, qwen_path):
    """Multi-turn, agent_context='history': agent i's critic sees its own past observations, never the other's."""
    from trl_collm import MultiAgentEnv, MultiAgentPPOTrainer, StepResult

    class MarkerEnv(MultiAgentEnv):
        def reset(self, row):
            self.t = 0
            return [f"{MARKERS[a]} start {row['prompt']}" for a in NAMES]

        def step(self, completions):
            self.t += 1
            return StepResult(reward=0.5, observations=[f"{MARKERS[a]} turn {self.t}" for a in NAMES], done=self.t >= 2)

    args = make_config(tmp_path, agent_names=NAMES, critic_type="decentralized", num_turns=2, agent_context="history")
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, env=MarkerEnv())
    roll = tr.rollout(_rows(prompts_dataset))
    assert roll.turn_mask.all()
    cbs = tr.critic.batches(roll)
    assert sorted((cb.turn, cb.key) for cb in cbs) == [(0, "alpha"), (0, "beta"), (1, "alpha"), (1, "beta")]
    for cb in cbs:
        agent = cb.key
        other = [a for a in NAMES if a != agent][0]
        for k, view in enumerate(cb.views):
            assert view == roll.turns[cb.turn][agent].contexts[k]
            assert MARKERS[other] not in view
            if cb.turn == 1:
                # history: own first observation, own completion, new observation
                assert view.startswith(f"{MARKERS[agent]} start")
                assert view.endswith(f"{MARKERS[agent]} turn 1")
                assert view.count(MARKERS[agent]) == 2


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
