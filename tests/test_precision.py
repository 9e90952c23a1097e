"""Float32 precision against the float64 loop reference, at the temperatures people use.

Every loss path must keep relative error <= 1e-4 on the value and <= 1e-3 on the gradient (max
absolute error over the max absolute entry) against `reference_loss` fed the float64 copy of the
same float32 input, on random batches and on trained-looking ones, where psi is tiny and the
naive forms log(1 + a) and 1 - exp(-psi) lose every digit. Each case runs on the path the loss
picks (`last_path` says which) and on the general path forced; second derivatives and autocast
get their own checks.
"""

from __future__ import annotations

import math

import pytest
import torch

from hscl_zoo import build_loss
from hscl_zoo.losses.fused import fused_applicable
from hscl_zoo.losses.hardening import ExponentialTilt
from hscl_zoo.losses.terms import debiased_log_mean
from hscl_zoo.losses.reference import (
    PRECISION_CASES,
    exp_tilt,
    random_batch,
    reference_loss,
    reference_value_and_grad,
    relative_errors,
    trained_batch,
)

TEMPERATURES = (0.03, 0.05, 0.07, 0.1, 0.2, 0.5)
VALUE_RTOL, GRAD_RTOL = 1e-4, 1e-3


def batch(kind: str, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A random batch, or a trained-looking one as each family's training leaves it: UCL-style
    objectives spread the images apart (distinct images, views nearly identical), SCL-style ones
    pull each class together (tight classes). Either way the loss falls to 1e-5 .. 1e-28 at T = 0.03."""
    if kind == "random":
        return random_batch(8, 2, 32, 4, seed=0)
    return trained_batch(8, 2, 32, 4, seed=0, spread=1.0 if PRECISION_CASES[name][0] in ("ucl", "hucl") else 0.1)


@pytest.mark.parametrize("positives", ["views", "labels"])
@pytest.mark.parametrize("kind", ["random", "trained"])
@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("name", list(PRECISION_CASES))
def test_float32_matches_float64_reference_on_both_paths(name, temperature, kind, positives):
    method, kwargs, eta, tau_plus = PRECISION_CASES[name]
    features, labels = batch(kind, name)
    reference, reference_grad = reference_value_and_grad(features, labels, method=method, positives=positives,
                                                         temperature=temperature, eta=eta(temperature), tau_plus=tau_plus)
    assert reference.item() > 0
    loss = build_loss(method, temperature=temperature, positives=positives, **kwargs)
    for expected_path in (["general"] if tau_plus else ["fused", "general"]):
        loss.allow_fused = expected_path == "fused"
        value_err, grad_err = relative_errors(loss, features, labels, reference, reference_grad)
        assert loss.last_path == expected_path
        assert value_err <= VALUE_RTOL, f"{expected_path} path: value rel. error {value_err:.2e}"
        assert grad_err <= GRAD_RTOL, f"{expected_path} path: gradient rel. error {grad_err:.2e}"


@pytest.mark.parametrize("name, positives", [("ucl", "views"), ("hucl-debiased", "views"), ("scl", "views"), ("scl", "labels")])
def test_trained_batches_do_reach_tiny_psi(name, positives):
    """The trained-looking batches are the hard case: the loss lies far below float32's eps, where
    log(1 + psi) rounds to 0."""
    method, _, eta, tau_plus = PRECISION_CASES[name]
    features, labels = batch("trained", name)
    value = reference_loss(features.double(), labels, method=method, positives=positives, temperature=0.03,
                           eta=eta(0.03), tau_plus=tau_plus)
    assert 0 < value.item() < 1e-5


@pytest.mark.parametrize("name", ["scl", "hscl-beta", "hscl-tau"])
def test_fused_path_hands_over_where_its_exponentials_leave_the_normal_range(name):
    """At T = 0.02 the ratio a / e_ip spans M e^{+-100}, beyond float32: the general path runs, and
    keeps precision; at T = 0.05 the fused one does."""
    method, kwargs, eta, _ = PRECISION_CASES[name]
    features, labels = batch("trained", name)
    reference, reference_grad = reference_value_and_grad(features, labels, method=method, positives="labels",
                                                         temperature=0.02, eta=eta(0.02))
    loss = build_loss(method, temperature=0.02, **kwargs)
    value_err, grad_err = relative_errors(loss, features, labels, reference, reference_grad)
    assert loss.last_path == "general"
    assert value_err <= VALUE_RTOL and grad_err <= GRAD_RTOL
    warmer = build_loss(method, temperature=0.05, **kwargs)
    warmer(features, labels)
    assert warmer.last_path == "fused"


def test_fused_applicable_counts_the_embeddings_not_m():
    """The sums run over every embedding, whatever M the user gives: N, not M + 2, bounds them."""
    tilt = ExponentialTilt(1.0)
    assert fused_applicable(tilt, 0.0, 0.028, 1.0, torch.float32, 100)
    assert not fused_applicable(tilt, 0.0, 0.028, 1.0, torch.float32, 10_000)
    assert not fused_applicable(tilt, 0.0, 0.05, 1e-30, torch.float32, 100)  # psi = O(M e^{-2/T}) would be subnormal


def test_fused_applicable_bounds_the_psi_ratio_by_m_on_either_side_of_one():
    """a / e_ip, hence psi and its sigmoid, spans M e^{+-2/T}: a tiny M drives it towards the subnormals
    and a huge one towards overflow, however few the candidates. At T = 1/16 (1/T = 16, 2/T = 32) in
    float32 (limit 80), M = e^{-60} with 8 candidates gives the bounds 16 + log 8 = 18.1, 32 + 60 = 92
    and 16 + |log 8 + 60| = 78.1, and M = e^{60} with about e^{60} candidates 76, 92 and 16: only
    2/T + |log M| = 92 passes 80, and it alone hands both over. At M = e^{+-40} it is 72 and they stay."""
    for log_m, candidates, kept in ((-60.0, 8, False), (60.0, round(math.exp(60.0)), False),
                                    (-40.0, 8, True), (40.0, round(math.exp(40.0)), True)):
        assert fused_applicable(None, 0.0, 0.0625, math.exp(log_m), torch.float32, candidates) == kept, log_m


def test_fused_applicable_hands_over_at_the_limit_itself():
    """The bounds must stay strictly below the limit. With one candidate and M = 1 (log N = log M = 0)
    they are (1 + beta) / T and 2 / T, exact here: beta = 1.5 at T = 1/32 and the uniform weights at
    T = 1/40 reach float32's 80.0 exactly, beta = 42.75 at T = 1/16 float64's 700.0; a little less is kept."""
    assert (1 + 1.5) / 0.03125 == 80.0 and 2 / 0.025 == 80.0 and (1 + 42.75) / 0.0625 == 700.0
    assert not fused_applicable(ExponentialTilt(1.5), 0.0, 0.03125, 1.0, torch.float32, 1)
    assert fused_applicable(ExponentialTilt(1.49), 0.0, 0.03125, 1.0, torch.float32, 1)
    assert not fused_applicable(None, 0.0, 0.025, 1.0, torch.float32, 1)
    assert fused_applicable(None, 0.0, 0.0251, 1.0, torch.float32, 1)
    assert not fused_applicable(ExponentialTilt(42.75), 0.0, 0.0625, 1.0, torch.float64, 1)
    assert fused_applicable(ExponentialTilt(42.7), 0.0, 0.0625, 1.0, torch.float64, 1)


@pytest.mark.parametrize("M", [0.5, 7.0, 1000.0])
@pytest.mark.parametrize("name", ["ucl", "hucl-debiased", "hscl-beta", "hscl-tau"])
def test_user_M_is_honoured_on_every_path(name, M):
    method, kwargs, eta, tau_plus = PRECISION_CASES[name]
    features, labels = batch("random", name)
    positives = "labels" if method.startswith("hscl") else "views"
    reference, reference_grad = reference_value_and_grad(features, labels, method=method, positives=positives,
                                                         temperature=0.1, eta=eta(0.1), tau_plus=tau_plus, M=M)
    loss = build_loss(method, temperature=0.1, M=M, **kwargs)
    for allow_fused in (True, False):
        loss.allow_fused = allow_fused
        value_err, grad_err = relative_errors(loss, features, labels, reference, reference_grad)
        assert loss.last_path == ("fused" if allow_fused and not tau_plus else "general")
        assert value_err <= VALUE_RTOL and grad_err <= GRAD_RTOL


@pytest.mark.parametrize("temperature", [0.5, 0.05, 0.02, 0.01, 0.005])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_debias_floor_is_exactly_e_to_minus_one_over_t(temperature, dtype):
    """Pairs whose debiased mean falls below the floor get log E' = -1/T exactly, however small T:
    the first because E < tau_plus e^{g_ip}, the second because E - tau_plus e^{g_ip} < (1 - tau_plus) e^{-1/T}."""
    T = temperature
    g_pos = torch.tensor([1 / T, -2 / T, 0.2 / T], dtype=dtype)
    log_mean = torch.tensor([1 / T + math.log(0.1) - 0.5, -1.2 / T, 0.19 / T], dtype=dtype)
    out = debiased_log_mean(log_mean, g_pos, tau_plus=0.1, temperature=T)
    assert torch.equal(out[:2], torch.tensor(-1.0 / T, dtype=dtype).expand(2))
    expected = 0.19 / T + math.log1p(-0.1 * math.exp(0.01 / T)) - math.log1p(-0.1)
    assert out[2].item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("temperature", [0.02, 0.022])
def test_debiased_hucl_below_the_old_float32_limit_matches_reference(temperature):
    """Every pair on the floor, psi = log1p(M e^{-1/T - g_ip}) ~ 1e-31: below T ~ 0.023 a floor formed
    as e^{-2/T} relative to e^{1/T} left float32's range and came out e^{12} times too large."""
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(8, 1, 128, generator=gen) + torch.randn(8, 2, 128, generator=gen)  # views at cosine ~0.5
    reference, reference_grad = reference_value_and_grad(features, None, method="hucl", positives="views",
                                                         temperature=temperature, eta=exp_tilt(1.0), tau_plus=0.1)
    assert reference.item() < 1e-25
    loss = build_loss("hucl", temperature=temperature, beta=1.0, tau_plus=0.1)
    value_err, grad_err = relative_errors(loss, features, None, reference, reference_grad)
    assert value_err <= VALUE_RTOL and grad_err <= GRAD_RTOL


def hessian_vector_product(fn, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    x = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(fn(x), x, create_graph=True)
    (hvp,) = torch.autograd.grad((grad * v).sum(), x)
    return hvp


@pytest.mark.parametrize(
    "name, path", [(name, path) for name in PRECISION_CASES for path in ("fused", "general") if name != "hucl-debiased" or path == "general"]
)
def test_second_derivative_matches_reference(name, path):
    """Double backward (create_graph=True) is exact: a Hessian-vector product against the reference's."""
    method, kwargs, eta, tau_plus = PRECISION_CASES[name]
    features, labels = random_batch(6, 2, 5, 3, seed=1)
    features = features.double()
    v = torch.randn(features.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    positives = "labels" if method.startswith("hscl") or method == "scl" else "views"
    loss = build_loss(method, positives=positives, **kwargs)
    loss.allow_fused = path == "fused"
    ours = hessian_vector_product(lambda x: loss(x, labels), features, v)
    assert loss.last_path == path
    ref = hessian_vector_product(lambda x: reference_loss(x, labels, method=method, positives=positives,
                                                          eta=eta(0.5), tau_plus=tau_plus), features, v)
    assert ref.abs().max() > 1e-3
    torch.testing.assert_close(ours, ref, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize(
    "name, path", [(name, path) for name in PRECISION_CASES if name != "hucl" for path in ("fused", "general") if name != "hucl-debiased" or path == "general"]
)
def test_backward_inside_bf16_autocast_gives_the_float32_gradient(name, path):
    """The loss's autograd nodes keep float32 when backward runs inside an autocast region."""
    method, kwargs, _, tau_plus = PRECISION_CASES[name]
    features, labels = random_batch(32, 2, 64, 4, seed=3)
    loss = build_loss(method, **kwargs)
    loss.allow_fused = path == "fused"
    plain = features.clone().requires_grad_()
    expected = loss(plain, labels)
    expected.backward()
    inside = features.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss(inside, labels)
        value.backward()
    assert loss.last_path == path
    assert torch.equal(value, expected)
    assert torch.equal(inside.grad, plain.grad)
