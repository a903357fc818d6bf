"""A new critic type is one class plus a registry line (docs/architecture.md's worked example): a per-agent critic
that reads its own context plus the other agents' messages of the previous turn. Registered, chosen by
`critic_type`, it builds its views, trains, and is saved under its name."""

from __future__ import annotations

import json

import pytest
import torch

from trl_collm import MultiAgentEnv, MultiAgentPPOTrainer, StepResult
from trl_collm.critics import CRITIC_TYPES, DecentralizedCritic, register_critic_type

NAMES = ["alpha", "beta"]
MARKERS = {"alpha": "ALPHA-ONLY", "beta": "BETA-ONLY"}


class OwnPlusMessagesCritic(DecentralizedCritic):
    """One critic per agent: its own context, then what the other agents said at the previous turn."""

    name = "own_plus_messages"

    def views(self, roll, t, agent):
        own = super().views(roll, t, agent)
        if t == 0:
            return own
        previous = roll.turns[t - 1]
        row_of = {int(e): k for k, e in enumerate(previous[agent].episode_ids)}  # episodes still running at t
        views = []
        for view, e in zip(own, roll.turns[t][agent].episode_ids.tolist()):
            said = [f"[{b} said] {previous[b].gen.texts[row_of[e]]}" for b in self.agent_names if b != agent]
            views.append(view + "\n" + "\n".join(said))
        return views


class MarkerEnv(MultiAgentEnv):
    def reset(self, row):
        self.t = 0
        return [f"{MARKERS[a]} start {row['prompt']}" for a in NAMES]

    def step(self, completions):
        self.t += 1
        observations = [f"{MARKERS[a]} turn {self.t}" for a in NAMES]
        return StepResult(reward=[0.5, float(len(completions[1]) % 3)], observations=observations, done=self.t >= 2)


@pytest.fixture
def registered():
    register_critic_type(OwnPlusMessagesCritic)
    yield OwnPlusMessagesCritic
    CRITIC_TYPES.pop(OwnPlusMessagesCritic.name)


def test_a_registered_critic_type_builds_its_views_and_trains(
    tmp_path, make_config, prompts_dataset, qwen_path, registered
):
    args = make_config(tmp_path, agent_names=NAMES, critic_type="own_plus_messages", num_turns=2, total_episodes=4)
    tr = MultiAgentPPOTrainer(args=args, model=qwen_path, train_dataset=prompts_dataset, env=MarkerEnv())
    assert type(tr.critic) is OwnPlusMessagesCritic and sorted(tr.critic.units) == NAMES

    roll = tr.rollout([prompts_dataset[i] for i in range(4)])
    assert roll.turn_mask.all()
    cbs = tr.critic.batches(roll)
    assert sorted((cb.turn, cb.key) for cb in cbs) == [(0, "alpha"), (0, "beta"), (1, "alpha"), (1, "beta")]
    for cb in cbs:
        agent, other = cb.key, [a for a in NAMES if a != cb.key][0]
        turn = roll.turns[cb.turn]
        for k, view in enumerate(cb.views):
            assert view.startswith(turn[agent].contexts[k])  # its own context first
            assert MARKERS[other] not in view  # never the other agent's observations
            if cb.turn == 1:  # ... but the other agent's previous message
                assert view == f"{turn[agent].contexts[k]}\n[{other} said] {roll.turns[0][other].gen.texts[k]}"
            else:
                assert view == turn[agent].contexts[k]

    before = {k: [p.detach().clone() for p in u.own_parameters()] for k, u in tr.critic.units.items()}
    out = tr.train()
    assert out.global_step == 1
    for k, unit in tr.critic.units.items():
        assert any(not torch.equal(b, p) for b, p in zip(before[k], unit.own_parameters())), k
    assert all(torch.isfinite(torch.tensor(out.metrics[f"critic/{a}/loss"])) for a in NAMES)

    tr.save_model(str(tmp_path / "saved"))
    desc = json.loads((tmp_path / "saved" / "team.json").read_text())
    assert desc["critic"]["type"] == "own_plus_messages"
    assert sorted(desc["critic"]["units"]) == NAMES

    # The card describes the registered layout by its own name and docstring, not as a built-in one or critic-free.
    tr.create_model_card(model_name="t")
    card = (tmp_path / "out" / "README.md").read_text()
    assert "'own_plus_messages' critic type: One critic per agent" in card
    assert "Monte-Carlo" not in card and "CoLLM-DC" not in card
    assert OwnPlusMessagesCritic.describe_layout()[0] == "own_plus_messages critic"


def test_built_in_layouts_describe_themselves_for_cards_and_plots():
    from trl_collm.cli.plotting import curve_title
    from trl_collm.critics import CentralizedCritic

    assert CentralizedCritic.describe_layout()[0] == "CoLLM-CC, centralized critic"
    assert DecentralizedCritic.describe_layout()[1].startswith("CoLLM-DC: ")
    title = curve_title("coord-penalty", "ppo", DecentralizedCritic.describe_layout()[0])
    assert title == "coord-penalty: ppo (CoLLM-DC, decentralized critics)"
    assert curve_title("coord-penalty", "mc", None) == "coord-penalty: mc (no critic)"


def test_an_unregistered_critic_type_is_rejected_by_the_config(tmp_path, make_config):
    with pytest.raises(ValueError, match="`critic_type`='own_plus_messages' is not valid"):
        make_config(tmp_path, critic_type="own_plus_messages")
