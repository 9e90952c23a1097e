import math

import pytest
import torch

from hscl_zoo import LOSS_NAMES, ContrastiveLoss, build_loss
from hscl_zoo.losses.hardening import ExponentialTilt, LinearThresholdSchedule, Threshold
from hscl_zoo.losses.reference import exp_tilt, reference_loss, threshold

# Labels 3 and 4 appear once: those anchors have no label collision.
LABELS = torch.tensor([0, 0, 1, 1, 1, 2, 2, 3, 4, 0])

CASES = {
    "ucl": (dict(), "ucl", None, 0.0),
    "hucl": (dict(beta=1.5), "hucl", exp_tilt(1.5), 0.0),
    "hucl-debiased": (dict(beta=1.0, tau_plus=0.1), "hucl", exp_tilt(1.0), 0.1),
    "hucl-threshold": (dict(threshold=0.1), "hucl", threshold(0.1, 0.5), 0.0),
    "scl": (dict(), "scl", None, 0.0),
    "hscl-beta": (dict(beta=2.0), "hscl-beta", exp_tilt(2.0), 0.0),
    "hscl-tau": (dict(threshold=0.2), "hscl-tau", threshold(0.2, 0.5), 0.0),
}


def features(B=10, V=2, d=4, seed=0, dtype=torch.float64):
    return torch.randn(B, V, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("V", [2, 3])
@pytest.mark.parametrize("positives", ["views", "labels"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_loop_reference(case, positives, V):
    kwargs, method, eta, tau_plus = CASES[case]
    f = features(V=V, seed=V)
    ours = build_loss(method, positives=positives, **kwargs)(f, LABELS)
    ref = reference_loss(f, LABELS, method=method, positives=positives, eta=eta, tau_plus=tau_plus)
    assert ours.dtype == torch.float64
    assert abs(ours.item() - ref.item()) < 1e-6


def test_gradients_match_loop_reference():
    f1 = features(seed=3).requires_grad_()
    f2 = f1.detach().clone().requires_grad_()
    build_loss("hscl-beta", beta=1.0)(f1, LABELS).backward()
    reference_loss(f2, LABELS, method="hscl-beta", positives="labels", eta=exp_tilt(1.0)).backward()
    torch.testing.assert_close(f1.grad, f2.grad, atol=1e-9, rtol=1e-7)


def test_threshold_with_some_empty_hard_sets_matches_reference():
    f = features(seed=5)
    loss = build_loss("hscl-tau", threshold=0.6)
    z = torch.nn.functional.normalize(f, dim=-1).reshape(20, 4)
    s = z @ z.T
    other_label = LABELS.repeat_interleave(2)[:, None] != LABELS.repeat_interleave(2)[None, :]
    hard = (s >= 0.6) & other_label
    assert (~hard.any(1)).any() and hard.any(1).any(), "the case must mix empty and non-empty hard sets"
    ref = reference_loss(f, LABELS, method="hscl-tau", positives="labels", eta=threshold(0.6, 0.5))
    assert abs(loss(f, LABELS).item() - ref.item()) < 1e-6


def test_explicit_M_and_temperature_match_reference():
    f = features(seed=7)
    ours = build_loss("hscl-beta", beta=0.5, M=7.0, temperature=0.2)(f, LABELS)
    ref = reference_loss(f, LABELS, method="hscl-beta", positives="labels", eta=exp_tilt(0.5), M=7.0, temperature=0.2)
    assert abs(ours.item() - ref.item()) < 1e-6


def test_float32_input_computes_in_float32():
    out = build_loss("scl")(features(dtype=torch.float32), LABELS)
    assert out.dtype == torch.float32


# ---- limits ----

@pytest.mark.parametrize("hard, plain", [("hucl", "ucl"), ("hscl-beta", "scl")])
def test_beta_to_zero_is_unhardened(hard, plain):
    f = features(seed=11)
    base = build_loss(plain)(f, LABELS).item()
    assert build_loss(hard, beta=0.0)(f, LABELS).item() == pytest.approx(base, abs=1e-12)
    assert build_loss(hard, beta=1e-7)(f, LABELS).item() == pytest.approx(base, abs=1e-6)
    assert abs(build_loss(hard, beta=2.0)(f, LABELS).item() - base) > 1e-3


def test_threshold_minus_one_is_scl():
    f = features(seed=12)
    assert build_loss("hscl-tau", threshold=-1.0)(f, LABELS).item() == pytest.approx(build_loss("scl")(f, LABELS).item(), abs=1e-12)


def test_tau_plus_zero_is_plain_hucl():
    f = features(seed=13)
    plain = build_loss("hucl", beta=1.0)(f).item()
    assert build_loss("hucl", beta=1.0, tau_plus=0.0)(f).item() == plain
    assert abs(build_loss("hucl", beta=1.0, tau_plus=0.2)(f).item() - plain) > 1e-4


def test_perfect_alignment_analytic_value():
    # Two images, orthogonal, each with two identical views: g_pos = 1/T, g_neg = 0, M = N - 2 = 2.
    f = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 1.0]]], dtype=torch.float64)
    T = 0.5
    assert build_loss("ucl", temperature=T)(f).item() == pytest.approx(math.log(1 + 2 * math.exp(-1 / T)), abs=1e-12)


def test_threshold_schedule_follows_the_paper():
    schedule = LinearThresholdSchedule(-0.5, 0.1, epochs=200)
    assert schedule.value == -0.5
    schedule.set_epoch(200)
    assert schedule.value == pytest.approx(0.1)
    schedule.set_epoch(100)
    assert schedule.value == pytest.approx(-0.5 + 99 / 199 * 0.6)
    loss = build_loss("hscl-tau", threshold=LinearThresholdSchedule(-1.0, 0.9, epochs=2))
    f = features(seed=14)
    first = loss(f, LABELS).item()
    assert first == pytest.approx(build_loss("scl")(f, LABELS).item(), abs=1e-12)
    loss.set_epoch(2)
    assert loss(f, LABELS).item() == pytest.approx(build_loss("hscl-tau", threshold=0.9)(f, LABELS).item(), abs=1e-12)
    with pytest.raises(ValueError, match="1..2"):
        loss.set_epoch(3)


def test_custom_hardening_callable():
    f = features(seed=15)
    def softplus_eta(t):
        return torch.nn.functional.softplus(t)
    ours = ContrastiveLoss(negatives="other-labels", positives="labels", hardening=softplus_eta)(f, LABELS)
    ref = reference_loss(f, LABELS, method="hscl", positives="labels", eta=softplus_eta)
    assert abs(ours.item() - ref.item()) < 1e-6


# ---- gradients and precision ----

@pytest.mark.parametrize("name", LOSS_NAMES)
def test_gradcheck(name):
    f = features(B=5, V=2, d=3, seed=21).requires_grad_()
    labels = torch.tensor([0, 0, 1, 1, 2])
    kwargs = {"threshold": 0.05} if name == "hscl-tau" else {}
    loss = build_loss(name, **kwargs)
    assert torch.autograd.gradcheck(lambda x: loss(x, labels), (f,))


def test_gradcheck_debiased_hucl():
    f = features(B=5, V=2, d=3, seed=22).requires_grad_()
    loss = build_loss("hucl", tau_plus=0.1)
    assert torch.autograd.gradcheck(lambda x: loss(x), (f,))


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_bf16_autocast_finite_and_close_to_float32(name):
    torch.manual_seed(0)
    encoder = torch.nn.Linear(32, 64)
    x = torch.randn(64, 2, 32)
    labels = torch.randint(0, 5, (64,))
    loss = build_loss(name)
    reference = loss(encoder(x), labels)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        projected = encoder(x)
        assert projected.dtype == torch.bfloat16
        value = loss(projected, labels)
    assert value.dtype == torch.float32 and torch.isfinite(value)
    assert value.item() == pytest.approx(reference.item(), rel=2e-2)
    value.backward()
    assert all(torch.isfinite(p.grad).all() for p in encoder.parameters())


# ---- edge cases the reference code turns into NaN ----

@pytest.mark.parametrize("name", LOSS_NAMES)
def test_one_class_batch_is_finite(name):
    f = features(B=6, seed=31).requires_grad_()
    labels = torch.zeros(6, dtype=torch.long)
    value = build_loss(name)(f, labels)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(f.grad).all()
    if name in ("scl", "hscl-beta", "hscl-tau"):
        assert value.item() == 0.0 and f.grad.abs().max() == 0


def test_empty_hard_set_falls_back_to_uniform():
    f = features(seed=32).requires_grad_()
    value = build_loss("hscl-tau", threshold=1.0)(f, LABELS)
    value.backward()
    assert value.item() == pytest.approx(build_loss("scl")(f, LABELS).item(), abs=1e-12)
    assert torch.isfinite(f.grad).all()


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_temperature_collapsed_features_match_reference(name, dtype):
    """A collapsed encoder (every embedding within 1e-4 of one vector) at T = 0.05 gives the float64
    reference's value to 1e-5 and its gradient to 5e-3. The gradient lives in differences of ~1e-4
    between unit vectors, each rounded to float32 (6e-8), so no float32 computation gets it much
    closer than 1e-3; tests/test_precision.py holds the 1e-3 contract on random and trained batches."""
    base = torch.randn(1, 1, 128, generator=torch.Generator().manual_seed(0))
    f = (base + 1e-4 * torch.randn(16, 2, 128, generator=torch.Generator().manual_seed(1))).to(dtype)
    labels = torch.arange(16) % 3
    kwargs = {"threshold": 0.999} if name == "hscl-tau" else {}
    eta = {"hucl": exp_tilt(1.0), "hscl-beta": exp_tilt(1.0), "hscl-tau": threshold(0.999, 0.05)}.get(name)
    x = f.clone().requires_grad_()
    value = build_loss(name, temperature=0.05, **kwargs)(x, labels)
    value.backward()
    y = f.double().requires_grad_()
    positives = "views" if name in ("ucl", "hucl") else "labels"
    reference = reference_loss(y, labels, method=name, positives=positives, temperature=0.05, eta=eta)
    reference.backward()
    assert value.item() == pytest.approx(reference.item(), rel=1e-5)
    assert (x.grad.double() - y.grad).abs().max() <= 5e-3 * y.grad.abs().max()


def test_single_image_has_no_negatives_and_gives_zero():
    f = features(B=1, seed=33).requires_grad_()
    value = build_loss("ucl")(f)
    value.backward()
    assert value.item() == 0.0 and torch.isfinite(f.grad).all()


def test_detach_weights_changes_gradient_not_value():
    f1 = features(seed=34).requires_grad_()
    f2 = f1.detach().clone().requires_grad_()
    a = build_loss("hscl-beta", beta=2.0)(f1, LABELS)
    b = build_loss("hscl-beta", beta=2.0, detach_weights=True)(f2, LABELS)
    assert a.item() == pytest.approx(b.item(), abs=1e-12)
    a.backward(); b.backward()
    assert not torch.allclose(f1.grad, f2.grad)


# ---- bad input ----

@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: (torch.randn(8, 16), torch.zeros(8, dtype=torch.long)), r"\(B, V, d\).*torch.stack"),
        (lambda: (torch.randn(8, 1, 16), torch.zeros(8, dtype=torch.long)), "V >= 2"),
        (lambda: (torch.randn(8, 2, 16), torch.zeros(7, dtype=torch.long)), r"shape \(8,\)"),
        (lambda: (torch.randn(8, 2, 16), torch.zeros(8)), "integer class ids"),
        (lambda: (torch.randn(8, 2, 16), None), "needs labels"),
        (lambda: (torch.full((8, 2, 16), float("nan")), torch.zeros(8, dtype=torch.long)), "NaN or inf"),
        (lambda: (torch.randint(0, 3, (8, 2, 16)), torch.zeros(8, dtype=torch.long)), "floating point"),
    ],
)
def test_bad_input_raises_with_guidance(make, match):
    f, labels = make()
    with pytest.raises(ValueError, match=match):
        build_loss("scl")(f, labels)


def test_unknown_name_lists_known():
    with pytest.raises(ValueError, match="ucl, hucl, scl, hscl-beta, hscl-tau"):
        build_loss("simclr")


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("hscl-beta", dict(beta=-1.0), "beta must be"),
        ("scl", dict(temperature=0.0), "temperature must be"),
        ("ucl", dict(temperature=-0.5), "temperature must be"),
        ("scl", dict(beta=1.0), "does not take beta"),
        ("hscl-tau", dict(threshold=2.0), r"\[-1, 1\]"),
        ("hucl", dict(tau_plus=1.0), "tau_plus"),
        ("ucl", dict(positives="pairs"), "'views' or 'labels'"),
        ("scl", dict(M=0), "M must be"),
    ],
)
def test_bad_arguments_raise_with_guidance(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_loss(name, **kwargs)


def test_views_mode_ucl_needs_no_labels():
    assert torch.isfinite(build_loss("ucl")(features()))


def test_hardening_objects_are_nonnegative_nondecreasing():
    t = torch.linspace(-2, 2, 101)
    for eta in (ExponentialTilt(1.0), Threshold(0.1, 0.5)):
        w = eta(t)
        assert (w >= 0).all() and (w[1:] >= w[:-1]).all()


# ---- the fused fast path and the general masked path agree ----

# Each branch of the fused backward: uniform, tilt beta = 1 (its own algebra), other beta, tilt
# reduced to uniform, threshold with and without empty hard sets, detached weights.
FUSED_CASES = {
    **{name: (kwargs, method) for name, (kwargs, method, _, _) in CASES.items() if name != "hucl-debiased"},
    "hscl-beta-1": (dict(beta=1.0), "hscl-beta"),
    "hscl-beta-0": (dict(beta=0.0), "hscl-beta"),
    "hscl-beta-1-detached": (dict(beta=1.0, detach_weights=True), "hscl-beta"),
    "hscl-beta-2-detached": (dict(beta=2.0, detach_weights=True), "hscl-beta"),
    "hscl-tau-some-empty": (dict(threshold=0.6), "hscl-tau"),
}


@pytest.mark.parametrize("V", [2, 3])
@pytest.mark.parametrize("positives", ["views", "labels"])
@pytest.mark.parametrize("case", list(FUSED_CASES))
def test_fused_and_masked_paths_agree(case, positives, V):
    from hscl_zoo.losses.fused import fused_applicable

    kwargs, method = FUSED_CASES[case]
    loss = build_loss(method, positives=positives, **kwargs)
    f = features(V=V, seed=40 + V).requires_grad_()
    M = f.shape[0] * V - 2
    assert fused_applicable(loss.hardening, loss.tau_plus, loss.temperature, M, torch.float64, M + 2)
    z = torch.nn.functional.normalize(f, dim=-1)
    fused_sum, fused_count = loss._fused_psi_sum(z, z, LABELS, 0, M)
    z = torch.nn.functional.normalize(f, dim=-1)
    masked_sum, masked_count = loss._masked_psi_sum(z, z, LABELS, 0, M)
    assert int(fused_count) == int(masked_count)
    assert fused_sum.item() == pytest.approx(masked_sum.item(), abs=1e-9)
    (grad_fused,) = torch.autograd.grad(fused_sum, f)
    (grad_masked,) = torch.autograd.grad(masked_sum, f)
    torch.testing.assert_close(grad_fused, grad_masked, atol=1e-10, rtol=1e-8)


def test_general_path_covers_what_the_fused_one_cannot():
    from hscl_zoo.losses.fused import fused_applicable

    assert not fused_applicable(None, 0.1, 0.5, 100, torch.float32, 102)  # H-UCL debiasing
    assert not fused_applicable(torch.nn.functional.softplus, 0.0, 0.5, 100, torch.float32, 102)  # custom eta
    assert fused_applicable(ExponentialTilt(1.0), 0.0, 0.05, 100, torch.float32, 102)
    assert not fused_applicable(ExponentialTilt(1.0), 0.0, 0.02, 100, torch.float32, 102)  # e^{2/T} would overflow
    assert fused_applicable(ExponentialTilt(1.0), 0.0, 0.02, 100, torch.float64, 102)


@pytest.mark.parametrize("case", ["ucl", "hscl-beta-1", "hscl-beta", "hscl-tau-some-empty"])
def test_fused_backward_can_run_twice_on_one_graph(case):
    """The fused backward overwrites its saved buffers; a second backward (retain_graph) recomputes them."""
    kwargs, method = FUSED_CASES[case]
    loss = build_loss(method, **kwargs)
    f = features(seed=8).requires_grad_()
    value = loss(f, LABELS)
    (first,) = torch.autograd.grad(value, f, retain_graph=True)
    (second,) = torch.autograd.grad(value, f)
    torch.testing.assert_close(first, second, atol=1e-12, rtol=0)
    (fresh,) = torch.autograd.grad(loss(f, LABELS), f)
    torch.testing.assert_close(first, fresh, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["scl", "hscl-beta"])
def test_labels_beyond_float_precision_keep_their_classes(name):
    """Labels are compared exactly: 2**40 and 2**40 + 1 stay two classes (float32 would merge them)."""
    f = features(seed=9, dtype=torch.float32)
    loss = build_loss(name)
    torch.testing.assert_close(loss(f, LABELS + 2**40), loss(f, LABELS))
    with pytest.raises(ValueError, match="is negative"):  # issue 17: only -1 (unlabelled) may be negative
        loss(f, LABELS - 2**40)
    merged = torch.where(LABELS == 1, 0, LABELS)  # what a lossy comparison of 2**40 + {0, 1} would see
    assert not torch.allclose(loss(f, merged + 2**40), loss(f, LABELS))


def test_loss_under_inference_mode_then_training():
    """A validation loss computed under torch.inference_mode leaves nothing behind that breaks training."""
    loss = build_loss("hscl-beta")
    f = features(seed=10, dtype=torch.float32)
    with torch.inference_mode():
        evaluated = loss(f, LABELS)
    trained = f.clone().requires_grad_()
    value = loss(trained, LABELS)
    value.backward()
    assert torch.isfinite(trained.grad).all()
    torch.testing.assert_close(value.detach(), evaluated)


def test_fused_node_releases_its_buffers_after_backward():
    """A kept loss tensor must not pin the two N x N buffers after backward (as saved tensors are freed)."""
    f = features(seed=11).requires_grad_()
    value = build_loss("hscl-beta")(f, LABELS)
    pending, nodes = [value.grad_fn], []
    while pending:
        node = pending.pop()
        nodes.append(node)
        pending.extend(n for n, _ in node.next_functions if n is not None)
    (fused,) = [n for n in nodes if "FusedInfoNCE" in type(n).__name__]
    assert all(t.numel() == f.shape[0] * 2 * f.shape[0] * 2 for t in fused.state[:2])
    value.backward()
    assert fused.state is None


@pytest.mark.parametrize("method", ["ucl", "scl", "hscl-beta"])
def test_the_per_call_checks_can_be_left_to_the_caller(method):
    """`check_finite = False`: NaN features give a NaN loss instead of the error (the pretraining loop
    checks each epoch's loss); `labelled_only = True`: a negative label is no longer refused per call,
    the caller having checked its labels once. With both on (the default), each call refuses."""
    features = torch.randn(6, 2, 8, generator=torch.Generator().manual_seed(0))
    features[0, 0, 0] = math.nan
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    loss_fn = build_loss(method)
    with pytest.raises(ValueError, match="features contain NaN or inf"):
        loss_fn(features, labels)
    loss_fn.check_finite = False
    assert math.isnan(loss_fn(features, labels).item())
    if loss_fn.needs_labels:
        bad = torch.tensor([0, 0, 1, 1, 2, -3])
        with pytest.raises(ValueError, match="label -3 is negative"):
            build_loss(method)(features.nan_to_num(), bad)
        loss_fn.labelled_only = True
        assert torch.isfinite(loss_fn(features.nan_to_num(), bad))  # not refused: the caller vouched for its labels
