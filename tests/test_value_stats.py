"""trl_collm.value_stats: the critic's explained variance and the running statistics of value normalisation.

Expected values are worked out by hand (arithmetic in comments).
"""

import math

import pytest
import torch

from trl_collm import value_stats as V

T = torch.tensor


def close(actual, expected, atol=1e-5):
    assert torch.allclose(
        torch.as_tensor(actual, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64), atol=atol
    )


# --------------------------------------------------------------------------- #
# diagnostics
# --------------------------------------------------------------------------- #
def test_explained_variance():
    ret = T([1.0, 2.0, 3.0, 4.0])
    assert V.explained_variance(ret, ret) == pytest.approx(1.0)
    # a constant prediction (the mean) explains nothing
    assert V.explained_variance(torch.full((4,), 2.5), ret) == pytest.approx(0.0, abs=1e-6)
    # residual [0,0,0,1]: pop var 0.1875 ; var(ret) 1.25 -> 1 - 0.15 = 0.85
    assert V.explained_variance(T([1.0, 2.0, 3.0, 3.0]), ret) == pytest.approx(0.85)
    # masked entries are ignored
    ev = V.explained_variance(T([1.0, 2.0, 3.0, 4.0, -50.0]), T([1.0, 2.0, 3.0, 4.0, 50.0]), T([1, 1, 1, 1, 0]))
    assert ev == pytest.approx(1.0)
    assert math.isnan(V.explained_variance(ret, torch.full((4,), 3.0)))


# --------------------------------------------------------------------------- #
# RunningMeanStd
# --------------------------------------------------------------------------- #
def test_running_mean_std_matches_concatenation():
    rms = V.RunningMeanStd()
    assert (rms.mean, rms.var, rms.count) == (0.0, 1.0, 1e-4)
    rms.update(T([1.0, 2.0, 3.0]))
    rms.update(T([[4.0, 5.0], [6.0, 7.0]]))
    # 1..7: mean 4, population var (9+4+1+0+1+4+9)/7 = 4 ; the 1e-4 prior barely moves it
    assert rms.mean == pytest.approx(4.0, abs=1e-3)
    assert rms.var == pytest.approx(4.0, abs=1e-3)
    assert rms.count == pytest.approx(7.0001)
    # normalize: (6 - 4) / 2 = 1
    close(rms.normalize(T([6.0, 4.0])), [1.0, 0.0], atol=1e-3)
    close(rms.denormalize(T([1.0, 0.0])), [6.0, 4.0], atol=1e-3)


def test_running_mean_std_mask_and_state_dict():
    rms = V.RunningMeanStd(epsilon=1e-8)
    rms.update(T([2.0, 4.0, 1e9]), T([1, 1, 0]))
    rms.update(T([]))  # an empty batch is a no-op
    # mean 3, var 1 from [2, 4]
    assert rms.mean == pytest.approx(3.0, abs=1e-6)
    assert rms.var == pytest.approx(1.0, abs=1e-6)
    other = V.RunningMeanStd()
    other.load_state_dict(rms.state_dict())
    assert other.state_dict() == rms.state_dict()
    close(other.normalize(T([5.0])), [2.0], atol=1e-6)
