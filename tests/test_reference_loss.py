"""The loop reference and its input helpers, checked on their own: values derived by hand from the
formulas of docs/losses.md on batches of two images, and the documented properties of
`random_batch`, `trained_batch`, `threshold` and `relative_errors`."""

import json
import math
from pathlib import Path

import pytest
import torch

from hscl_zoo.losses.reference import PRECISION_CASES, random_batch, reference_loss, relative_errors, threshold, trained_batch

R2 = math.sqrt(2)


def two_images():
    """Image 0: both views e1. Image 1: views e2 and (e1 + e2) / sqrt(2), given unnormalised.

    At T = 0.5, g is 2 between the views of image 0, sqrt(2) between those of image 1, and 0 or
    sqrt(2) from image 1's views to image 0's."""
    return torch.tensor([[[1.0, 0.0], [2.0, 0.0]], [[0.0, 3.0], [1.0, 1.0]]], dtype=torch.float64)


def in_fresh_global_rng_state(make):
    """`make()` after the global generator has been reseeded and advanced, the state restored after."""
    with torch.random.fork_rng():
        torch.manual_seed(12345)
        torch.randn(7)
        return make()


# ---- reference_loss: hand-derived values ----

@pytest.mark.parametrize("method, positives", [("scl", "labels"), ("hscl-beta", "labels"), ("ucl", "labels"), ("hucl", "labels")])
def test_labelled_anchor_without_unlabelled_negatives_contributes_no_pair(method, positives):
    """Labels [0, -1], unlabelled_negatives=False: image 0's anchors have no negative and are
    skipped; image 1's (unlabelled) take image 0's views as negatives. M = 4 - 2 = 2."""
    value = reference_loss(two_images(), torch.tensor([0, -1]), method=method, positives=positives,
                           unlabelled_negatives=False)
    expected = (math.log(1 + 2 * math.exp(-R2)) + math.log(3)) / 2
    assert value.item() == pytest.approx(expected, rel=1e-12)


def test_ucl_with_view_positives_ignores_unlabelled_negatives_false():
    """UCL with views as positives never reads labels: -1 and unlabelled_negatives=False change nothing."""
    features = two_images()
    value = reference_loss(features, torch.tensor([0, -1]), method="ucl", positives="views", unlabelled_negatives=False)
    without_labels = reference_loss(features, None, method="ucl", positives="views")
    anchor_a = math.log(1 + math.exp(-2) * (1 + math.exp(R2)))
    expected = (2 * anchor_a + math.log(1 + 2 * math.exp(-R2)) + math.log(3)) / 4
    assert value.item() == pytest.approx(expected, rel=1e-12)
    assert without_labels.item() == pytest.approx(expected, rel=1e-12)


def test_queue_rows_are_normalised_before_use():
    """One image (views e1) and queue rows (0, 3) and (3, 3): cosines 0 and 1/sqrt(2), M = 4 - 2 = 2."""
    features = torch.tensor([[[1.0, 0.0], [5.0, 0.0]]], dtype=torch.float64)
    rows = torch.tensor([[0.0, 3.0], [3.0, 3.0]], dtype=torch.float64)
    value = reference_loss(features, None, method="ucl", positives="views", queue=(rows, None))
    assert value.item() == pytest.approx(math.log(1 + math.exp(-2) * (1 + math.exp(R2))), rel=1e-12)


@pytest.mark.parametrize("eta", [None, threshold(1.5, 1 / 709.5)], ids=["uniform", "empty-hard-set"])
def test_uniform_mean_stays_finite_with_one_exponential_near_the_float64_limit(eta):
    """T = 1/709.5: e^{g} = e^{709.5} is finite but twice it is not. Anchors e1 with queue rows e1
    and e2: E = (e^{709.5} + 1) / 2, M = 2, so psi = log(2 + e^{-709.5}) = log 2. A threshold above
    every cosine falls back to the same uniform weights."""
    features = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]], dtype=torch.float64)
    rows = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    value = reference_loss(features, None, method="hucl", positives="views", temperature=1 / 709.5, eta=eta,
                           queue=(rows, None))
    assert value.item() == pytest.approx(math.log(2), rel=1e-12)


def test_without_debiasing_the_loss_forms_no_e_to_the_positive_similarity():
    """tau_plus = 0 is the plain log(1 + M e^{-g_ip} E_i): the debiasing term tau_plus e^{g_ip} (and its
    floor e^{-1/T}) belong to tau_plus > 0. At T = 1/710 a positive at cosine 1 has e^{g_ip} = e^{710},
    beyond float64, where 0 x e^{g_ip} would be NaN; the loss itself is representable. Image 0 (views
    e1) and image 1 (views (3, 4) / 5, cosine 0.6 to e1), view positives, M = 4 - 2 = 2: every anchor
    has psi = log(1 + 2 e^{-710} e^{710 x 0.6}) = log1p(2 e^{-284})."""
    features = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[3.0, 4.0], [3.0, 4.0]]], dtype=torch.float64)
    assert torch.exp(torch.tensor(710.0, dtype=torch.float64)).isinf(), "e^{g_ip} must overflow to test anything"
    value = reference_loss(features, None, method="ucl", positives="views", temperature=1 / 710, tau_plus=0.0)
    assert value.item() == pytest.approx(math.log1p(2 * math.exp(-284.0)), rel=1e-9)


def test_batch_without_pairs_gives_an_attached_zero_with_zero_gradient():
    """A single class under SCL: no anchor has a negative, so nothing counts."""
    features = (torch.arange(12, dtype=torch.float64).reshape(3, 2, 2) + 1).requires_grad_()
    value = reference_loss(features, torch.tensor([1, 1, 1]), method="scl", positives="labels")
    assert value.item() == 0.0
    value.backward()
    assert torch.equal(features.grad, torch.zeros_like(features))


# ---- threshold ----

def test_threshold_is_one_from_the_level_on_in_the_input_dtype():
    """eta = 1 when s = g T >= l: at T = 0.5 and l = 0.2, g = 0.4 sits exactly on the level."""
    weights = threshold(0.2, 0.5)(torch.tensor([0.3, 0.4, 0.6], dtype=torch.float64))
    assert weights.dtype == torch.float64
    assert weights.tolist() == [0.0, 1.0, 1.0]


# ---- relative_errors ----

def test_relative_errors_divide_by_the_reference_magnitudes():
    """loss = sum x^2 at x = (1, 2): value 5 against 4, gradient (2, 4) against (2, 8)."""
    features = torch.tensor([[1.0, 2.0]])
    value_err, grad_err = relative_errors(lambda x, labels: (x**2).sum(), features, None, torch.tensor(4.0, dtype=torch.float64),
                                          torch.tensor([[2.0, 8.0]], dtype=torch.float64))
    assert value_err == pytest.approx(0.25)
    assert grad_err == pytest.approx(0.5)
    assert features.grad is None


# ---- random_batch and trained_batch ----

@pytest.mark.parametrize("make, shape, labels", [
    (random_batch, (5, 2, 3, 2), [0, 1, 0, 1, 0]),
    (trained_batch, (6, 2, 16, 3), [0, 1, 2, 0, 1, 2]),
], ids=["random_batch", "trained_batch"])
def test_batches_are_float32_and_depend_on_their_seed_alone(make, shape, labels):
    """Neither the global generator nor the default dtype changes the batch of a seed."""
    features, got_labels = make(*shape, seed=4)
    again, _ = in_fresh_global_rng_state(lambda: make(*shape, seed=4))
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        under_float64_default, _ = make(*shape, seed=4)
    finally:
        torch.set_default_dtype(default)
    other, _ = make(*shape, seed=5)
    assert features.shape == shape[:3] and features.dtype == torch.float32
    assert got_labels.tolist() == labels
    assert torch.equal(features, again)
    assert torch.equal(features, under_float64_default)
    assert not torch.equal(features, other)


def test_trained_batch_spread_defaults_to_distinct_images():
    assert torch.equal(trained_batch(4, 2, 8, 2, seed=0)[0], trained_batch(4, 2, 8, 2, seed=0, spread=1.0)[0])


def test_trained_batch_views_are_the_unit_image_plus_independent_noise_of_norm_1e_3():
    """Views lie within 1e-3 of a unit vector, two views of an image sqrt(2) 1e-3 apart in high
    dimension, and the view noise of different images is independent (nearly orthogonal)."""
    features, _ = trained_batch(8, 2, 2048, 4, seed=0)
    x = features.double()
    norms = x.norm(dim=-1)
    assert ((norms - 1).abs() <= 1.01e-3).all()
    gaps = x[:, 0] - x[:, 1]
    assert torch.allclose(gaps.norm(dim=-1), torch.full((8,), R2 * 1e-3, dtype=torch.float64), rtol=0.1)
    cosines = torch.nn.functional.normalize(gaps, dim=-1) @ torch.nn.functional.normalize(gaps, dim=-1).T
    assert (cosines - torch.eye(8, dtype=torch.float64)).abs().max() < 0.2


@pytest.mark.parametrize("spread", [0.1, 1.0, 2.0])
def test_trained_batch_classes_have_the_cosine_of_centre_plus_noise_of_norm_spread(spread):
    """In high dimension the centre and the unit noise vectors are nearly orthogonal, so two images
    of a class have cosine 1 / (1 + spread^2) and images of different classes cosine ~0."""
    features, labels = trained_batch(8, 2, 2048, 4, seed=1, spread=spread)
    z = torch.nn.functional.normalize(features.double()[:, 0], dim=-1)
    cosines = z @ z.T
    same = (labels[:, None] == labels[None, :]) & ~torch.eye(8, dtype=torch.bool)
    different = labels[:, None] != labels[None, :]
    assert cosines[same].sub(1 / (1 + spread**2)).abs().max() < 0.05
    assert cosines[different].abs().max() < 0.1


@pytest.mark.parametrize("kind, spread", [("distinct", 1.0), ("tight", 0.1)])
def test_trained_batch_of_a_seed_is_the_batch_of_the_committed_precision_measurement(kind, spread):
    """benchmarks/results/loss_precision_after.json names its seed and records the float64 reference
    value of every case on trained_batch(24, 2, 32, 4, seed 0); it stays reproducible only while that
    seed draws the same batch (the same draws, combined the same way). Its reference values at
    T = 0.03, where psi is tiny and the batch's every detail shows, are recomputed."""
    measurement = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/results/loss_precision_after.json").read_text())
    features, labels = trained_batch(measurement["batch"], 2, measurement["dim"], 4, measurement["seed"], spread=spread)
    rows = [r for r in measurement["rows"] if r["kind"] == kind and r["temperature"] == 0.03]
    assert len(rows) == 2 * len(PRECISION_CASES)
    for row in rows:
        method, _, eta, tau_plus = PRECISION_CASES[row["case"]]
        value = reference_loss(features.double(), labels, method=method, positives=row["positives"], temperature=0.03,
                               eta=eta(0.03), tau_plus=tau_plus)
        assert value.item() == pytest.approx(row["reference"], rel=1e-9), (row["case"], row["positives"])
