"""Issue 17: every loss accepts unlabelled images (label -1) in a batch (docs/losses.md,
"Unlabelled images"). The limits: all labels -1 is UCL / H-UCL exactly, no label -1 is the
labelled loss exactly, a mixed batch agrees with the float64 loop reference."""

import warnings

import pytest
import torch

from hscl_zoo.losses.hardening import ExponentialTilt, Threshold
from hscl_zoo.losses.methods import build_loss
from hscl_zoo.losses.objective import ContrastiveLoss
from hscl_zoo.losses.reference import exp_tilt, reference_loss, threshold
from hscl_zoo.training.config import PretrainConfig

# (method, build_loss options, the reference's eta, the unsupervised method it becomes without labels)
CASES = {
    "scl": ({}, None, ("ucl", {})),
    "hscl-beta": ({"beta": 0.7}, exp_tilt(0.7), ("hucl", {"beta": 0.7})),
    "hscl-tau": ({"threshold": 0.1}, threshold(0.1, 0.5), ("hucl", {"threshold": 0.1})),
}


def batch(B=12, V=2, d=6, classes=3, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(B, V, d, generator=gen, dtype=dtype)
    labels = torch.randint(0, classes, (B,), generator=gen)
    return features, labels


def mixed_labels(labels, every=3):
    return torch.where(torch.arange(len(labels)) % every == 1, -1, labels)


def value_and_grad(loss_fn, features, labels):
    f = features.clone().requires_grad_(True)
    value = loss_fn(f, labels)
    value.backward()
    return value.detach(), f.grad


def path_taken(loss_fn, features, labels) -> str:
    loss_fn(features, labels)
    return loss_fn.last_path


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("method", list(CASES))
def test_all_unlabelled_is_exactly_the_unsupervised_loss(method, dtype):
    options, _, (unsupervised, unsupervised_options) = CASES[method]
    features, _ = batch(dtype=dtype)
    nobody = torch.full((12,), -1)
    loss, unsupervised_loss = build_loss(method, **options), build_loss(unsupervised, **unsupervised_options)
    with pytest.warns(UserWarning, match="no labelled image"):
        ours = value_and_grad(loss, features, nobody)
    theirs = value_and_grad(unsupervised_loss, features, None)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    assert loss.last_path == unsupervised_loss.last_path


@pytest.mark.parametrize("method", list(CASES))
def test_no_unlabelled_image_is_the_labelled_loss_on_the_fused_path(method):
    options, eta, _ = CASES[method]
    features, labels = batch()
    loss = build_loss(method, **options)
    ours = value_and_grad(loss, features, labels)
    assert torch.equal(ours[0], value_and_grad(build_loss(method, unlabelled_negatives=False, **options),
                                               features, labels)[0])
    assert path_taken(loss, features, labels) == "fused"
    expected = reference_loss(features, labels, method=method, positives="labels", eta=eta)
    assert ours[0].item() == pytest.approx(expected.item(), rel=1e-12)


@pytest.mark.parametrize("unlabelled_negatives", [True, False])
@pytest.mark.parametrize("positives", ["labels", "views"])
@pytest.mark.parametrize("method", list(CASES))
def test_mixed_batch_matches_the_reference_on_the_general_path(method, positives, unlabelled_negatives):
    options, eta, _ = CASES[method]
    features, labels = batch(seed=1)
    labels = mixed_labels(labels)
    loss = build_loss(method, positives=positives, unlabelled_negatives=unlabelled_negatives, **options)
    f = features.clone().requires_grad_(True)
    ours = loss(f, labels)
    (grad,) = torch.autograd.grad(ours, f)
    g = features.clone().requires_grad_(True)
    expected = reference_loss(g, labels, method=method, positives=positives, eta=eta,
                              unlabelled_negatives=unlabelled_negatives)
    (expected_grad,) = torch.autograd.grad(expected, g)
    assert ours.item() == pytest.approx(expected.item(), rel=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)
    assert path_taken(loss, features, labels) == "general"


def test_unlabelled_negatives_matter_and_debiasing_applies_to_unlabelled_anchors():
    features, labels = batch(seed=2)
    labels = mixed_labels(labels)
    with_them = build_loss("scl")(features, labels)
    without = build_loss("scl", unlabelled_negatives=False)(features, labels)
    assert with_them.item() != pytest.approx(without.item(), rel=1e-6)
    loss = build_loss("hucl", beta=0.5, tau_plus=0.2, positives="labels")
    expected = reference_loss(features, labels, method="hucl", positives="labels", eta=exp_tilt(0.5), tau_plus=0.2)
    assert loss(features, labels).item() == pytest.approx(expected.item(), rel=1e-12)


def test_ucl_ignores_unlabelled_marks():
    features, labels = batch(seed=3)
    ucl = build_loss("ucl")
    assert torch.equal(ucl(features, mixed_labels(labels)), ucl(features, None))


def test_the_marker_is_configurable_and_other_negative_labels_are_refused():
    features, labels = batch(seed=4)
    marked = torch.where(mixed_labels(labels) == -1, -5, labels)
    assert torch.equal(build_loss("scl", unlabelled=-5)(features, marked), build_loss("scl")(features, mixed_labels(labels)))
    with pytest.raises(ValueError, match="label -5 is negative"):
        build_loss("scl")(features, marked)
    with pytest.raises(ValueError, match="must be a negative integer"):
        ContrastiveLoss(negatives="other-labels", positives="labels", unlabelled=0)
    with pytest.raises(ValueError, match="integer class ids"):
        build_loss("scl")(features, labels.float())


def test_a_batch_without_labels_warns_once_per_epoch():
    features, _ = batch(seed=5)
    nobody = torch.full((12,), -1)
    loss = build_loss("hscl-beta")
    loss.set_epoch(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss(features, nobody)
        loss(features, nobody)
        loss(features, mixed_labels(torch.zeros(12, dtype=torch.long)))
        loss.set_epoch(2)
        loss(features, nobody)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2 and "epoch 1" in messages[0] and "epoch 2" in messages[1]
    assert "UCL/H-UCL" in messages[0]


def test_the_recipe_passes_unlabelled_negatives_to_the_loss():
    cfg = PretrainConfig(method="hscl-beta", unlabelled_negatives=False)
    loss = build_loss(cfg.method, **cfg.loss_kwargs())
    assert loss.unlabelled_negatives is False and loss.unlabelled == -1
    assert isinstance(loss.hardening, ExponentialTilt) and not isinstance(loss.hardening, Threshold)
