"""The whole-model gathering of ZeRO-3 runs (trainers/zero3_gathering.py), in one process against fake partitioned
parameters: a partitioned parameter holds no data (forwards through it fail) until the unit holding it is gathered.
The 2-process DeepSpeed runs in test_deepspeed.py check the same class end to end against 1-process training."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("deepspeed")

from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus  # noqa: E402

from trl_collm.testing import build_causal_lm, build_tokenizer  # noqa: E402
from trl_collm.trainers.zero3_gathering import Zero3Gathering  # noqa: E402


class FakeHook:
    def __init__(self, log):
        self.log = log

    def remove(self):
        self.log.append("removed")


class FakeOffload:
    """What Zero3Gathering uses of DeepSpeedZeRoOffload: the module, its hook handles, re-registration."""

    def __init__(self, module, log):
        self.module = module
        self.log = log
        self.forward_hooks = [FakeHook(log)]
        self.backward_hooks = [FakeHook(log)]

    def _register_deepspeed_module(self, module):
        self.log.append("registered")
        self.forward_hooks, self.backward_hooks = [FakeHook(self.log)], [FakeHook(self.log)]


class FakeEngine:
    def __init__(self, module, log):
        self.optimizer = type("Opt", (), {"parameter_offload": FakeOffload(module, log)})()


def partition_like_zero3(module: nn.Module, collectives: list) -> None:
    """Give every parameter ZeRO-3's attributes; `partition` empties it, `all_gather_coalesced` restores it (one
    entry in `collectives` per call, with how many parameters it moved)."""
    full = {id(p): p.data.clone() for p in module.parameters()}

    def all_gather_coalesced(params):
        collectives.append(len(params))
        for p in params:
            assert p.ds_status == ZeroParamStatus.NOT_AVAILABLE
            p.data = full[id(p)]
            p.ds_status = ZeroParamStatus.AVAILABLE
        return type("Handle", (), {"wait": lambda self: None})()

    def partition(param_list, has_been_updated=False):
        for p in param_list:
            full[id(p)] = p.data
            p.data = torch.empty(0, dtype=p.dtype)
            p.ds_status = ZeroParamStatus.NOT_AVAILABLE

    for p in module.parameters():
        p.ds_active_sub_modules = set()
        p.all_gather_coalesced = all_gather_coalesced
        p.partition = partition
    partition(list(module.parameters()))


class Team(nn.Module):
    def __init__(self):
        super().__init__()
        tok = build_tokenizer()
        self.policies = nn.ModuleDict({"a": build_causal_lm(tok, seed=0), "b": build_causal_lm(tok, seed=1)})
        self.head = nn.Linear(self.policies["a"].config.hidden_size, 1)


def _setup():
    torch.manual_seed(0)
    team, reference = Team(), Team()
    reference.load_state_dict(team.state_dict())
    log, collectives = [], []
    partition_like_zero3(team, collectives)
    gathering = Zero3Gathering([FakeEngine(team, log)])
    gathering.install()
    ids = torch.randint(0, 100, (2, 5))
    return team, reference, gathering, log, collectives, ids


def _status(team, name):
    return {p.ds_status for p in team.policies[name].parameters()}


def test_units_are_the_models_and_install_swaps_the_hooks():
    team, _, gathering, log, _, _ = _setup()
    # one unit per agent model (a PreTrainedModel, however many layers), one for the head
    assert len(gathering.units) == 3
    assert sorted(len(u) for u in gathering.units) == sorted(
        [len(list(team.policies["a"].parameters())), len(list(team.policies["b"].parameters())), 2]
    )
    assert log == ["removed", "removed"]  # DeepSpeed's forward and backward module hooks came off
    gathering.uninstall()
    assert log[-1] == "registered"


def test_no_grad_forwards_keep_one_model_whole_and_match_full_weights():
    team, reference, gathering, _, collectives, ids = _setup()
    with torch.no_grad():
        out_a = team.policies["a"](ids).logits
        assert _status(team, "a") == {ZeroParamStatus.AVAILABLE}
        out_a2 = team.policies["a"](ids).logits  # same model again: no second gather
        assert len(collectives) == 1
        out_b = team.policies["b"](ids).logits
        # moving to b released a (no backward can need it); one collective per model, not per module
        assert _status(team, "a") == {ZeroParamStatus.NOT_AVAILABLE}
        assert _status(team, "b") == {ZeroParamStatus.AVAILABLE}
        assert collectives == [len(list(team.policies["a"].parameters())), len(list(team.policies["b"].parameters()))]
        torch.testing.assert_close(out_a, reference.policies["a"](ids).logits)
        torch.testing.assert_close(out_a2, out_a)
        torch.testing.assert_close(out_b, reference.policies["b"](ids).logits)
    assert gathering.gathers == 2


def test_a_loss_keeps_its_models_through_backward_then_release_partitions_them():
    team, reference, gathering, _, collectives, ids = _setup()

    def loss_of(t):
        hidden = t.policies["a"](ids, output_hidden_states=True).hidden_states[-1]
        other = t.policies["b"](ids).logits.mean()
        return t.head(hidden).mean() + other

    loss = loss_of(team)
    # both models and the head are whole while the loss waits for its backward, though a and b were used in turn
    assert _status(team, "a") == _status(team, "b") == {ZeroParamStatus.AVAILABLE}
    loss.backward()
    expected = loss_of(reference)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for p, q in zip(team.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    gathering.release()
    assert {p.ds_status for p in team.parameters()} == {ZeroParamStatus.NOT_AVAILABLE}
    assert len(collectives) == 3
    # a no-grad pass afterwards gathers again (the step may have changed the shards)
    with torch.no_grad():
        team.policies["a"](ids)
    assert len(collectives) == 4


def test_a_no_grad_pass_inside_a_loss_does_not_release_the_loss_models():
    team, _, gathering, _, _, ids = _setup()
    loss = team.policies["a"](ids).logits.mean()
    with torch.no_grad():  # e.g. a prefix computed without gradients while a's loss waits for its backward
        team.policies["b"](ids)
    assert _status(team, "a") == {ZeroParamStatus.AVAILABLE}
    loss.backward()  # would fail on emptied weights had a been released
    assert all(p.grad is not None for p in team.policies["a"].parameters() if p.requires_grad)
    gathering.release()


def test_a_parameter_shared_by_two_modules_belongs_to_one_unit():
    shared = nn.Linear(4, 4)
    root = nn.ModuleDict({"x": nn.Sequential(shared), "y": nn.Sequential(shared, nn.Linear(4, 2))})
    collectives = []
    partition_like_zero3(root, collectives)
    gathering = Zero3Gathering([FakeEngine(root, [])])
    owned = [id(p) for unit in gathering.units for p in unit]
    assert len(owned) == len(set(owned)) == len(list(root.parameters()))
    gathering.install()
    with torch.no_grad():
        out = root["y"](torch.ones(1, 4))
    assert out.shape == (1, 2)
