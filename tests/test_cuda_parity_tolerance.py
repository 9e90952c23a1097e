"""benchmarks/cuda_parity.py's comparison: a difference planted in CPU tensors is measured at its
size relative to the reference and flagged once it exceeds the check's tolerance."""

import math

import pytest
import torch

import hscl_zoo
from helpers import load_script
from rounding import reordered_sum_bound

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


def test_tf32_rounding_keeps_ten_mantissa_bits_rounding_to_nearest():
    ulp = 2.0 ** -10  # TF32's spacing just above 1
    x = torch.tensor([1 + ulp / 4, 1 + 3 * ulp / 4, 1 + ulp / 2 + 2.0 ** -20, -(1 + 3 * ulp / 4), 3.0, 0.0])
    expected = torch.tensor([1.0, 1 + ulp, 1 + ulp, -(1 + ulp), 3.0, 0.0])
    assert torch.equal(parity.tf32(x), expected)
    y = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    assert ((parity.tf32(y).view(torch.int32) & 0x1FFF) == 0).all()
    assert ((parity.tf32(y) - y).abs() <= y.abs() * 2.0 ** -11).all()


@pytest.mark.slow  # a ResNet step three ways: about 20 s on two cores
def test_the_tf32_emulation_changes_the_step_by_rounding_and_exact_float32_matches():
    """On the CPU the device runs equal the CPU's (gap 0); the emulated TF32 step differs from it by
    rounding, well above float32's noise and well below a wrong gradient (gap ~1); the TF32 row's
    tolerance is twice that emulated gap."""
    exact, rounded = parity.step_checks(torch.device("cpu"))
    assert exact["gap"] == 0 and rounded["gap"] == 0
    assert 1e-3 < rounded["emulated_tf32_gap"] < 0.5
    assert rounded["tolerance"] == 2 * rounded["emulated_tf32_gap"]
    conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    plain = conv(x)
    with parity.tf32_convolutions_on_the_cpu():
        emulated = conv(x)
    rounded_x, rounded_w, bias = parity.tf32(x.detach()), parity.tf32(conv.weight.detach()), conv.bias.detach()
    expected = torch.nn.functional.conv2d(rounded_x, rounded_w, bias, padding=1)
    magnitude = torch.nn.functional.conv2d(rounded_x.abs(), rounded_w.abs(), bias.abs(), padding=1)
    order = reordered_sum_bound(magnitude, 3 * 3 * 3 + 1, torch.float32)
    assert ((emulated - expected).abs() <= order).all(), (
        "the emulation is not a convolution of the TF32-rounded operands: TF32 x TF32 products are exact in "
        "float32, so two kernels may differ only by the order of summing 27 products and the bias")
    assert ((emulated - plain).abs() > order).any(), "the emulation did not round: it is the plain float32 convolution"
    assert (emulated - plain).abs().max() < 1e-2 * plain.abs().max()
    assert torch.nn.Conv2d._conv_forward is type(conv)._conv_forward  # restored


def test_the_loss_checks_compare_two_gradients_not_one_tensor_twice(monkeypatch):
    """The first H100 run found the inputs' .grad was None on CUDA: the CPU run had turned the shared
    features into a tensor requiring grad, whose copy on the device is no leaf. On the CPU the same
    bug compared one accumulated gradient with itself. Each run needs a leaf of its own."""
    compared = []
    original = parity.relative_gap

    def spy(a, b):
        compared.append((a, b))
        return original(a, b)

    monkeypatch.setattr(parity, "relative_gap", spy)
    rows = parity.loss_checks(torch.device("cpu"))
    assert len(rows) == 10 and all(row["gap"] == 0 for row in rows)
    gradients = [(a, b) for a, b in compared if a.dim() == 3]
    assert len(gradients) == 10 and all(a is not b and a.data_ptr() != b.data_ptr() for a, b in gradients)
