"""benchmarks/cuda_parity.py's comparison: a difference planted in CPU tensors is measured at its
size relative to the reference and flagged once it exceeds the check's tolerance."""

import math

import pytest
import torch

import hscl_zoo
from helpers import load_script

parity = load_script("benchmarks", "cuda_parity")


def loss_gradient() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 2, 16, generator=gen).requires_grad_(True)
    hscl_zoo.build_loss("hscl-beta")(x, torch.arange(32) % 4).backward()
    return x.grad


def test_relative_gap_is_the_largest_difference_over_the_reference_scale():
    reference = torch.tensor([[2.0, -4.0], [1.0, 0.5]], dtype=torch.float64)
    planted = reference.clone()
    planted[0, 1] -= 0.04  # the largest element: the scale is the reference's 4, not the planted 4.04
    planted[0, 0] -= 0.002
    assert parity.relative_gap(planted, reference) == pytest.approx(0.04 / 4.0, rel=1e-12)
    assert parity.relative_gap(reference, reference) == 0.0
    assert parity.relative_gap(torch.zeros(3), torch.zeros(3)) == 0.0


@pytest.mark.parametrize("factor, flagged", [(0.5, False), (0.99, False), (1.01, True), (10.0, True)])
def test_a_planted_gradient_difference_is_flagged_beyond_the_loss_tolerance(factor, flagged):
    """The loss checks' tolerance (1e-4 of the gradient's largest magnitude) on a real loss gradient."""
    reference = loss_gradient()
    device_like = reference.clone()
    device_like.view(-1)[17] += factor * 1e-4 * reference.abs().max()
    rows = [{"check": "loss/hscl-beta", "gap": parity.relative_gap(device_like, reference), "tolerance": 1e-4}]
    assert parity.judge(rows) is (not flagged)
    assert rows[0]["ok"] is (not flagged)
    assert rows[0]["gap"] == pytest.approx(factor * 1e-4, rel=1e-3)


def test_nan_on_the_device_is_flagged_and_one_failure_fails_the_run():
    reference = loss_gradient()
    broken = reference.clone()
    broken[0, 0, 0] = math.nan
    rows = [{"check": "equal", "gap": parity.relative_gap(reference, reference), "tolerance": 1e-4},
            {"check": "nan", "gap": parity.relative_gap(broken, reference), "tolerance": 1e-4}]
    assert parity.judge(rows) is False
    assert [row["ok"] for row in rows] == [True, False]
