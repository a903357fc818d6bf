"""Tests for trl_collm.algorithms.

Expected values are worked out by hand (arithmetic in comments) rather than
recomputed with the formula under test.
"""

import ast
import math
from pathlib import Path

import pytest
import torch

from trl_collm import algorithms as A

T = torch.tensor


def close(actual, expected, atol=1e-5):
    actual = torch.as_tensor(actual, dtype=torch.float64)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=atol, rtol=0), (actual, expected)


# --------------------------------------------------------------------------- #
# module hygiene
# --------------------------------------------------------------------------- #
def test_module_imports_only_torch_math_typing():
    # The package (algorithms/: its face and its modules) imports torch and its own modules, nothing else of ours.
    roots = set()
    for path in sorted(Path(A.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots.add(node.module.split(".")[0])
            elif isinstance(node, ast.ImportFrom):  # relative: only a sibling module of the package
                assert node.level == 1 and node.module in {"masked", "returns", "losses"}, (path.name, node.module)
    assert roots <= {"torch", "math", "typing"}, roots


# --------------------------------------------------------------------------- #
# masked statistics
# --------------------------------------------------------------------------- #
def test_masked_mean_all_and_dim():
    x = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = T([[1, 1, 0], [0, 0, 0]])
    # (1 + 2) / 2
    close(A.masked_mean(x, mask), 1.5)
    # row 0: 1.5 ; row 1 has no valid entry -> 0 (not NaN)
    close(A.masked_mean(x, mask, dim=1), [1.5, 0.0])
    # no mask: 21 / 6
    close(A.masked_mean(x), 3.5)


def test_masked_mean_ignores_nan_padding():
    x = T([1.0, 3.0, float("nan")])
    mask = T([True, True, False])
    close(A.masked_mean(x, mask), 2.0)


def test_masked_var_biased_unbiased_and_singleton():
    x = T([1.0, 2.0, 3.0, 4.0, 1000.0])
    mask = T([1, 1, 1, 1, 0])
    # deviations from 2.5: 2.25+0.25+0.25+2.25 = 5
    close(A.masked_var(x, mask, unbiased=False), 5 / 4)
    close(A.masked_var(x, mask, unbiased=True), 5 / 3)
    # a single valid entry: no n/(n-1) correction, just 0 variance (not inf/nan)
    close(A.masked_var(x, T([1, 0, 0, 0, 0]), unbiased=True), 0.0)


# --------------------------------------------------------------------------- #
# whiten
# --------------------------------------------------------------------------- #
def test_whiten_values_unbiased_and_biased():
    x = T([1.0, 2.0, 3.0, 4.0])
    # mean 2.5, unbiased var 5/3, std 1.2909944
    close(A.whiten(x, eps=0.0), [-1.1618950, -0.3872983, 0.3872983, 1.1618950])
    # biased var 1.25, std 1.1180340
    close(A.whiten(x, unbiased=False, eps=0.0), [-1.3416408, -0.4472136, 0.4472136, 1.3416408])
    # shift_mean=False adds the mean 2.5 back
    close(
        A.whiten(x, shift_mean=False, eps=0.0),
        [1.3381050, 2.1127017, 2.8872983, 3.6618950],
    )


def test_whiten_masked_entries_do_not_matter():
    mask = T([1, 1, 1, 1, 0])
    a = A.whiten(T([1.0, 2.0, 3.0, 4.0, 100.0]), mask, eps=0.0)
    b = A.whiten(T([1.0, 2.0, 3.0, 4.0, -5e6]), mask, eps=0.0)
    c = A.whiten(T([1.0, 2.0, 3.0, 4.0, float("nan")]), mask, eps=0.0)
    expected = [-1.1618950, -0.3872983, 0.3872983, 1.1618950, 0.0]
    close(a, expected)
    close(b, expected)
    close(c, expected)


def test_whiten_keeps_dtype_bf16():
    x = T([1.0, 2.0, 3.0, 4.0], dtype=torch.bfloat16)
    out = A.whiten(x)
    assert out.dtype == torch.bfloat16
    close(out.float(), [-1.1618950, -0.3872983, 0.3872983, 1.1618950], atol=2e-2)


# --------------------------------------------------------------------------- #
# zscore_by_group
# --------------------------------------------------------------------------- #
# index:      0    1    2     3     4     5    6       7    8
X_G = T([1.0, 3.0, 10.0, 20.0, 30.0, 7.0, 1000.0, 4.0, 99.0])
G_G = T([0, 0, 1, 1, 1, 2, 0, 3, 3])
M_G = T([1, 1, 1, 1, 1, 1, 0, 1, 0])
# group 0 valid: [1, 3]        mean 2,  pop var 1,      unbiased var 2
# group 1 valid: [10, 20, 30]  mean 20, pop var 200/3,  unbiased var 100
# group 2 valid: [7]           singleton -> unchanged
# group 3 valid: [4] (99 masked) -> singleton -> unchanged


def test_zscore_by_group_population():
    out = A.zscore_by_group(X_G, G_G, M_G, eps=0.0)
    # group 1 std = sqrt(66.6667) = 8.1649658 -> 10/8.1649658 = 1.2247449
    close(out, [-1.0, 1.0, -1.2247449, 0.0, 1.2247449, 7.0, 0.0, 4.0, 0.0])


def test_zscore_by_group_unbiased():
    out = A.zscore_by_group(X_G, G_G, M_G, unbiased=True, eps=0.0)
    # group 0 std sqrt(2) = 1.4142136 ; group 1 std 10
    close(out, [-0.7071068, 0.7071068, -1.0, 0.0, 1.0, 7.0, 0.0, 4.0, 0.0])


def test_zscore_by_group_std_floor():
    out = A.zscore_by_group(X_G, G_G, M_G, std_floor=2.0)
    # group 0 std 1 floored to 2 -> +-0.5 ; group 1 std 8.16 above the floor
    close(out, [-0.5, 0.5, -1.2247449, 0.0, 1.2247449, 7.0, 0.0, 4.0, 0.0])


def test_zscore_by_group_masked_value_and_id_irrelevant_2d():
    x2 = X_G.clone()
    x2[6] = -12345.0  # masked entry in group 0
    g2 = G_G.clone()
    g2[6] = 1  # even moving it to another group changes nothing
    a = A.zscore_by_group(X_G.view(3, 3), G_G.view(3, 3), M_G.view(3, 3), eps=0.0)
    b = A.zscore_by_group(x2.view(3, 3), g2.view(3, 3), M_G.view(3, 3), eps=0.0)
    assert a.shape == (3, 3)
    close(a, b)
    close(a.view(-1)[:2], [-1.0, 1.0])


def test_zscore_by_group_arbitrary_ids():
    # non-contiguous / negative ids are fine
    out = A.zscore_by_group(T([1.0, 3.0, 5.0]), T([-7, -7, 1000]), eps=0.0)
    close(out, [-1.0, 1.0, 5.0])


# --------------------------------------------------------------------------- #
# GAE / returns
# --------------------------------------------------------------------------- #
def test_gae_hand_computed_full_and_terminated_rows():
    rewards = T([[1.0, 0.0, 2.0], [1.0, 3.0, 99.0]])
    values = T([[0.5, 0.4, 0.3], [0.5, 2.0, 50.0]])
    mask = T([[1, 1, 1], [1, 1, 0]])
    adv, ret = A.gae(rewards, values, mask, gamma=0.9, lam=0.95)
    # gamma*lam = 0.855
    # row 0: d2 = 2 - 0.3 = 1.7
    #        d1 = 0 + 0.9*0.3 - 0.4 = -0.13
    #        d0 = 1 + 0.9*0.4 - 0.5 = 0.86
    #        A2 = 1.7 ; A1 = -0.13 + 0.855*1.7 = 1.3235 ; A0 = 0.86 + 0.855*1.3235 = 1.9915925
    # row 1 (step 2 is padding -> step 1 is terminal, its next value is 0):
    #        d1 = 3 - 2 = 1 ; A1 = 1
    #        d0 = 1 + 0.9*2 - 0.5 = 2.3 ; A0 = 2.3 + 0.855*1 = 3.155
    close(adv, [[1.9915925, 1.3235, 1.7], [3.155, 1.0, 0.0]])
    # returns = A + V (0 on padding)
    close(ret, [[2.4915925, 1.7235, 2.0], [3.655, 3.0, 0.0]])


def test_gae_lambda_zero_is_td_error():
    rewards = T([[1.0, 0.0, 2.0]])
    values = T([[0.5, 0.4, 0.3]])
    adv, _ = A.gae(rewards, values, T([[1, 1, 1]]), gamma=0.9, lam=0.0)
    # the deltas from the test above
    close(adv, [[0.86, -0.13, 1.7]])


def test_gae_lambda_one_is_discounted_return_minus_value():
    rewards = T([[1.0, 2.0, 3.0]])
    values = T([[0.5, 0.5, 0.5]])
    adv, ret = A.gae(rewards, values, T([[1, 1, 1]]), gamma=0.5, lam=1.0)
    # G = [1 + 0.5*2 + 0.25*3, 2 + 0.5*3, 3] = [2.75, 3.5, 3]
    close(adv, [[2.25, 3.0, 2.5]])
    close(ret, [[2.75, 3.5, 3.0]])


def test_gae_nan_padding_does_not_leak():
    rewards = T([[1.0, 3.0, float("nan")]])
    values = T([[0.5, 2.0, float("inf")]])
    adv, ret = A.gae(rewards, values, T([[1, 1, 0]]), gamma=0.9, lam=0.95)
    close(adv, [[3.155, 1.0, 0.0]])
    close(ret, [[3.655, 3.0, 0.0]])


# --------------------------------------------------------------------------- #
# KL / token rewards
# --------------------------------------------------------------------------- #
def test_kl_k1_k3():
    lp = T([-1.0, -2.0, -0.3])
    ref = T([-1.5, -1.0, -0.3])
    # k1 = lp - ref
    close(A.kl_per_token(lp, ref, "k1"), [0.5, -1.0, 0.0])
    # logr = ref - lp = [-0.5, 1, 0]
    # k3 = e^-0.5 - 1 + 0.5 = 0.1065307 ; e^1 - 1 - 1 = 0.7182818 ; 0
    close(A.kl_per_token(lp, ref, "k3"), [0.1065307, 0.7182818, 0.0])
    # default is k1
    close(A.kl_per_token(lp, ref), [0.5, -1.0, 0.0])


def test_kl_bad_estimator_raises():
    with pytest.raises(ValueError, match="kl_estimator") as info:
        A.kl_per_token(T([0.0]), T([0.0]), "k7")
    assert "k1" in str(info.value) and "k3" in str(info.value)


def test_token_level_rewards_score_at_last_valid_token():
    kl = T([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8], [1.0, 1.0, 1.0, 1.0]])
    mask = T([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    scores = T([10.0, 20.0, 30.0])
    rewards, non_score = A.token_level_rewards(scores, kl, mask, kl_coef=0.5)
    # non-score = -0.5 * kl on valid tokens
    close(non_score, [[-0.05, -0.1, -0.15, 0.0], [-0.25, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    # score added at index 2 of row 0, index 0 of row 1; row 2 has no valid token
    close(rewards, [[-0.05, -0.1, 9.85, 0.0], [19.75, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


# --------------------------------------------------------------------------- #
# policy losses
# --------------------------------------------------------------------------- #
def _ppo_case():
    old = torch.zeros(1, 5)
    # ratios 1.1, 1.5, 0.5, 1.5 and a masked 10.0
    new = torch.log(T([[1.1, 1.5, 0.5, 1.5, 10.0]])).requires_grad_(True)
    adv = T([[1.0, 1.0, 1.0, -1.0, 5.0]])
    mask = T([[1, 1, 1, 1, 0]])
    return new, old, adv, mask


def test_policy_loss_clipped_value_clipfrac_and_stats():
    new, old, adv, mask = _ppo_case()
    loss, stats = A.policy_loss_clipped(new, old, adv, mask, cliprange=0.2)
    # t0: r=1.1, A=+1: l1=-1.1, l2=-1.1          -> -1.1 (inside range)
    # t1: r=1.5, A=+1: l1=-1.5, l2=-1.2          -> -1.2 (clipped)
    # t2: r=0.5, A=+1: l1=-0.5, l2=-0.8          -> -0.5 (clip not binding)
    # t3: r=1.5, A=-1: l1=+1.5, l2=+1.2          -> +1.5 (clip not binding)
    # loss = (-1.1 - 1.2 - 0.5 + 1.5) / 4 = -0.325
    close(loss, -0.325)
    close(stats["clipfrac"], 0.25)
    # ratio mean 4.6/4 = 1.15 ; deviations -.05, .35, -.65, .35 -> 0.67/4
    close(stats["ratio_mean"], 1.15)
    close(stats["ratio_var"], 0.1675)
    # 0.5 * mean(log(1.1)^2, log(1.5)^2, log(0.5)^2, log(1.5)^2)
    # = 0.5 * (0.0090840 + 0.1644020 + 0.4804530 + 0.1644020) / 4 = 0.1022926
    close(stats["approxkl"], 0.1022926)
    assert all(not v.requires_grad for v in stats.values())

    loss.backward()
    # d/dnew of -A*r/4 = -A*r/4 where unclipped; 0 where the clipped branch wins; 0 on padding
    close(new.grad, [[-1.1 / 4, 0.0, -0.5 / 4, 1.5 / 4, 0.0]])


def test_policy_loss_clipped_no_clip():
    new, old, adv, mask = _ppo_case()
    loss, stats = A.policy_loss_clipped(new, old, adv, mask, cliprange=None)
    # (-1.1 - 1.5 - 0.5 + 1.5) / 4
    close(loss, -0.4)
    close(stats["clipfrac"], 0.0)


def test_policy_loss_clipped_sequence_advantages_broadcast():
    new = T([[math.log(2.0), 0.0], [0.0, 0.0]])
    old = torch.zeros(2, 2)
    adv = T([1.0, -2.0])
    loss, stats = A.policy_loss_clipped(new, old, adv, torch.ones(2, 2), cliprange=0.2)
    # row 0: r=2 -> max(-2, -1.2) = -1.2 (clipped) ; r=1 -> -1
    # row 1: A=-2, r=1 -> 2, 2
    # (-1.2 - 1 + 2 + 2) / 4 = 0.45
    close(loss, 0.45)
    close(stats["clipfrac"], 0.25)


def test_policy_loss_reinforce_value_and_grad():
    lp = T([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]], requires_grad=True)
    mask = T([[1, 1, 1], [1, 1, 0]])
    adv = T([2.0, -1.0])
    loss = A.policy_loss_reinforce(lp, adv, mask)
    # row 0: -(-6) * 2 = 12 ; row 1: -(-1) * -1 = -1 ; mean = 5.5
    close(loss, 5.5)
    loss.backward()
    # gradient = -A / B on valid tokens: -2/2 = -1, +1/2 = 0.5, 0 on padding
    close(lp.grad, [[-1.0, -1.0, -1.0], [0.5, 0.5, 0.0]])


# --------------------------------------------------------------------------- #
# value loss
# --------------------------------------------------------------------------- #
V_VALUES = T([1.0, 2.0, 3.0, 0.0])
V_OLD = T([0.0, 2.5, 3.0, 0.0])
V_RET = T([2.0, 0.0, 3.5, 100.0])
V_MASK = T([1, 1, 1, 0])


def test_value_loss_clipped():
    loss, stats = A.value_loss_clipped(V_VALUES, V_OLD, V_RET, V_MASK, cliprange_value=0.2)
    # e0: (1-2)^2 = 1 ; clipped v = 0 + 0.2 -> (0.2-2)^2 = 3.24 -> 3.24 (clipped larger)
    # e1: (2-0)^2 = 4 ; clipped v = 2.5 - 0.2 = 2.3 -> 5.29       -> 5.29 (clipped larger)
    # e2: (3-3.5)^2 = 0.25 ; clipped v = 3 -> 0.25               -> 0.25 (equal, not counted)
    # loss = 0.5 * (3.24 + 5.29 + 0.25) / 3 = 1.4633333
    close(loss, 1.4633333)
    close(stats["clipfrac"], 2 / 3)


def test_value_loss_unclipped_and_no_mask():
    loss, stats = A.value_loss_clipped(V_VALUES, V_OLD, V_RET, V_MASK, cliprange_value=None)
    # 0.5 * (1 + 4 + 0.25) / 3
    close(loss, 0.875)
    close(stats["clipfrac"], 0.0)
    loss, _ = A.value_loss_clipped(V_VALUES[:3], V_OLD[:3], V_RET[:3], None, cliprange_value=None)
    close(loss, 0.875)


def test_value_loss_clip_smaller_error_not_used():
    # v=1, old=0, R=0.1: unclipped (0.9)^2 = 0.81, clipped v=0.2 -> 0.01 ; max is 0.81
    loss, stats = A.value_loss_clipped(T([[1.0]]), T([[0.0]]), T([[0.1]]), T([[1]]), 0.2)
    close(loss, 0.405)
    close(stats["clipfrac"], 0.0)


def test_an_unclipped_value_is_not_counted_as_clipped_by_rounding():
    # float32: old + (v - old) != v here (-0.0011230260 vs -0.0011230231), though |v - old| = 0.078 < 0.2. The
    # value must stay v exactly: not clipped, and its error is the unclipped one.
    v, old, ret = T([[-0.001123023102991283]]), T([[0.07716259360313416]]), T([[0.0]])
    assert (old + (v - old)).item() != v.item()  # the rounding this test is about
    loss, stats = A.value_loss_clipped(v, old, ret, T([[1]]), 0.2)
    assert stats["clipfrac"].item() == 0.0
    assert loss.item() == (0.5 * (v - ret) ** 2).item()


# --------------------------------------------------------------------------- #
# Monte-Carlo group baselines (hand-computed on a fixed reward table)
# --------------------------------------------------------------------------- #
# Table: group 0 = [1, 2, 6], group 1 = [4, 0], group 2 = [5] (singleton), one masked entry (99) in group 1.
_R = torch.tensor([1.0, 2.0, 6.0, 4.0, 0.0, 5.0, 99.0])
_G = torch.tensor([0, 0, 0, 1, 1, 2, 1])
_M = torch.tensor([1, 1, 1, 1, 1, 1, 0], dtype=torch.bool)


def test_group_advantages_mean_baseline():
    # group 0 mean 3 -> [-2, -1, 3]; group 1 mean 2 -> [2, -2]; singleton: 5 - 5 = 0; masked -> 0
    adv = A.group_advantages(_R, _G, _M, baseline="mean")
    assert torch.allclose(adv, torch.tensor([-2.0, -1.0, 3.0, 2.0, -2.0, 0.0, 0.0]))


def test_group_advantages_leave_one_out():
    # group 0: 1-(2+6)/2=-3, 2-(1+6)/2=-1.5, 6-(1+2)/2=4.5; group 1: 4-0=4, 0-4=-4; singleton has no others -> 0
    adv = A.group_advantages(_R, _G, _M, baseline="loo")
    assert torch.allclose(adv, torch.tensor([-3.0, -1.5, 4.5, 4.0, -4.0, 0.0, 0.0]))


def test_group_advantages_max_and_none():
    # max: group 0 max 6 -> [-5, -4, 0]; group 1 max 4 -> [0, -4]; singleton 0
    adv = A.group_advantages(_R, _G, _M, baseline="max")
    assert torch.allclose(adv, torch.tensor([-5.0, -4.0, 0.0, 0.0, -4.0, 0.0, 0.0]))
    adv = A.group_advantages(_R, _G, _M, baseline="none")
    assert torch.allclose(adv, torch.tensor([1.0, 2.0, 6.0, 4.0, 0.0, 5.0, 0.0]))


def test_group_advantages_std_scaling():
    # group 0: population std of [1,2,6] = sqrt(((-2)^2+(-1)^2+3^2)/3) = sqrt(14/3) = 2.160247
    # group 1: std of [4,0] = 2 -> [1, -1]; singleton not scaled (0 anyway)
    adv = A.group_advantages(_R, _G, _M, baseline="mean", scale=True, eps=0.0)
    s0 = (14.0 / 3.0) ** 0.5
    assert torch.allclose(adv, torch.tensor([-2 / s0, -1 / s0, 3 / s0, 1.0, -1.0, 0.0, 0.0]), atol=1e-6)


def test_group_advantages_masked_entry_has_no_influence():
    changed = _R.clone()
    changed[6] = -1000.0
    assert torch.allclose(A.group_advantages(_R, _G, _M, "loo"), A.group_advantages(changed, _G, _M, "loo"))
    with pytest.raises(ValueError, match="baseline"):
        A.group_advantages(_R, _G, _M, baseline="median")


# --------------------------------------------------------------------------- #
# normalisation by scope (both levels)
# --------------------------------------------------------------------------- #
# Two agents x two turns, one masked entry (99). agent 0: turn 0 [1, 3], turn 1 [5]; agent 1: turn 0 [2, 6], turn 1 [4].
_ADV = T([1.0, 3.0, 5.0, 2.0, 6.0, 4.0, 99.0])
_AGENT = T([0, 0, 0, 1, 1, 1, 1])
_TURN = T([0, 0, 1, 0, 0, 1, 1])
_KEEP = T([1, 1, 1, 1, 1, 1, 0], dtype=torch.bool)


def test_normalize_by_scope_agent_turn():
    # (0, 0) [1, 3]: mean 2, sample var 2 -> /sqrt(2): [-0.7071, 0.7071]; (1, 0) [2, 6]: mean 4, var 8 -> /sqrt(8):
    # [-0.7071, 0.7071]; (0, 1) [5] and (1, 1) [4] are groups of one: left as they are; masked -> 0
    out = A.normalize_by_scope(_ADV, _KEEP, _AGENT, _TURN, "agent_turn")
    close(out, [-0.707107, 0.707107, 5.0, -0.707107, 0.707107, 4.0, 0.0])


def test_normalize_by_scope_agent():
    # agent 0 [1, 3, 5]: mean 3, sample var (4 + 0 + 4) / 2 = 4, std 2 -> [-1, 0, 1]
    # agent 1 [2, 6, 4]: mean 4, sample var (4 + 4 + 0) / 2 = 4, std 2 -> [-1, 1, 0]
    out = A.normalize_by_scope(_ADV, _KEEP, _AGENT, _TURN, "agent")
    close(out, [-1.0, 0.0, 1.0, -1.0, 1.0, 0.0, 0.0])


def test_normalize_by_scope_batch_and_none():
    # all six [1, 3, 5, 2, 6, 4]: mean 3.5, squares 6.25 + 0.25 + 2.25 + 2.25 + 6.25 + 0.25 = 17.5, sample var 3.5
    # -> (x - 3.5) / 1.870829
    out = A.normalize_by_scope(_ADV, _KEEP, _AGENT, _TURN, "batch")
    close(out, [-1.336306, -0.267261, 0.801784, -0.801784, 1.336306, 0.267261, 0.0])
    assert A.normalize_by_scope(_ADV, _KEEP, _AGENT, _TURN, "none") is _ADV
    with pytest.raises(ValueError, match="scope must be one of"):
        A.normalize_by_scope(_ADV, _KEEP, _AGENT, _TURN, "episode")


def test_normalize_by_scope_std_floor():
    # the floor switches to the population std: agent 0 [1, 3, 5] pop var 8/3, std 1.632993 -> [-1.224745, 0, 1.224745]
    out = A.normalize_by_scope(_ADV, _KEEP, _AGENT, _TURN, "agent", std_floor=0.5)
    close(out, [-1.224745, 0.0, 1.224745, -1.224745, 1.224745, 0.0, 0.0])
    # a floor above the std divides by the floor: agent 0 (x - 3) / 4, agent 1 (x - 4) / 4
    out = A.normalize_by_scope(_ADV, _KEEP, _AGENT, _TURN, "agent", std_floor=4.0)
    close(out, [-0.5, 0.0, 0.5, -0.5, 0.5, 0.0, 0.0])
    # equal advantages: population std 0, so the floor alone divides ((x - mean) = 0 either way, never NaN)
    flat = A.normalize_by_scope(T([2.0, 2.0]), None, T([0, 0]), T([0, 0]), "batch", std_floor=1e-6)
    close(flat, [0.0, 0.0])


def test_the_token_level_flattening_is_the_turn_levels_agent_scope():
    # token level: each agent's valid tokens in one flat vector, turn 0; the same numbers as a turn table whose
    # (agent, turn) groups hold those tokens
    tokens = A.normalize_by_scope(
        T([1.0, 3.0, 5.0, 2.0, 6.0]), None, T([0, 0, 0, 1, 1]), T([0, 0, 0, 0, 0]), "agent_turn"
    )
    close(tokens, [-1.0, 0.0, 1.0, -0.707107, 0.707107])


# --------------------------------------------------------------------------- #
# Monte-Carlo tree returns
# --------------------------------------------------------------------------- #
def test_tree_returns_by_hand():
    # one agent, 2 turns. Turn 0: nodes A (r 1) and B (r 2). Turn 1: A's children r 4, 6; B has no children (ended).
    # gamma 0.5: R1 = [4, 6]; R0(A) = 1 + 0.5 * mean(4, 6) = 3.5; R0(B) = 2 (a leaf: its reward alone)
    rewards = [T([[1.0], [2.0]]), T([[4.0], [6.0]])]
    parents = [T([-1, -1]), T([0, 0])]
    R = A.tree_returns(rewards, parents, gamma=0.5)
    close(R[0], [[3.5], [2.0]])
    close(R[1], [[4.0], [6.0]])
    # three turns, two agents, gamma 1: turn 2 leaf [[1, 3]] under turn 1's node 1; turn 1 [[0, 0], [2, 2]] under node 0
    # R2 = [[1, 3]]; R1 = [[0, 0], [2 + 1, 2 + 3]] = [[0, 0], [3, 5]]; R0 = [[1, 1]] + mean of R1 = [[1 + 1.5, 1 + 2.5]]
    rewards = [T([[1.0, 1.0]]), T([[0.0, 0.0], [2.0, 2.0]]), T([[1.0, 3.0]])]
    parents = [T([-1]), T([0, 0]), T([1])]
    R = A.tree_returns(rewards, parents, gamma=1.0)
    close(R[0], [[2.5, 3.5]])
    close(R[1], [[0.0, 0.0], [3.0, 5.0]])
    assert rewards[2] is not R[2] and rewards[2].tolist() == [[1.0, 3.0]]  # the rewards are not changed in place
