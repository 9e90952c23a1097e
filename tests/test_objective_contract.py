"""The loss contract's building blocks, each against an independent yardstick: pair sets built by
hand, the debiasing floor at its boundary, the weighted mean's gradient from its formula, the
all-unlabelled batch with every option of the loss, a caller's default device, the queue under a
custom marker and another dtype, and the fused path's bounds, label keys, sets, thresholds and
second derivatives."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from hscl_zoo.losses.fused import _mask_keys, _own_entries, fused_applicable, fused_psi_sum, image_sets
from hscl_zoo.losses.hardening import ExponentialTilt, Threshold
from hscl_zoo.losses.objective import ContrastiveLoss
from hscl_zoo.losses.queue import MemoryQueue
from hscl_zoo.losses.terms import debiased_log_mean, log_weighted_mean_exp, pair_sets, validate_inputs
from hscl_zoo.losses.reference import exp_tilt, reference_loss, threshold


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def value_and_grad(loss_fn, features, labels):
    f = features.clone().requires_grad_(True)
    value = loss_fn(f, labels)
    value.backward()
    return value.detach(), f.grad


def masks(rows):
    return torch.tensor(rows, dtype=torch.bool)


# pair_sets


def test_pair_sets_of_a_later_process_are_its_rows_of_the_global_masks():
    """One image with two views at offset 2 of three global images (candidates 0..5, anchors 4 and 5),
    labels [0, 1, 0]: the masks written out by hand."""
    sets = pair_sets(1, 2, 3, 2, torch.tensor([0, 1, 0]), device=torch.device("cpu"))
    assert torch.equal(sets.same_image, masks([[0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 1, 0]]))
    assert torch.equal(sets.other_images, masks([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0]]))
    assert torch.equal(sets.same_label, masks([[1, 1, 0, 0, 0, 1], [1, 1, 0, 0, 1, 0]]))
    assert torch.equal(sets.other_labels, masks([[0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0]]))
    assert torch.equal(sets.collisions, masks([[1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0]]))


def test_pair_sets_at_an_offset_match_a_loop_over_global_indices():
    B, V, G, offset = 2, 3, 5, 2
    labels = torch.tensor([1, 0, 1, 1, 2])
    sets = pair_sets(B, V, G, offset, labels, device=torch.device("cpu"))
    assert sets.same_image.shape == (B * V, G * V)
    for a in range(B * V):
        i = offset * V + a  # the anchor's global index
        for j in range(G * V):
            same_image = i // V == j // V
            assert bool(sets.same_image[a, j]) == (same_image and i != j)
            assert bool(sets.other_images[a, j]) == (not same_image)
            same_label = bool(labels[i // V] == labels[j // V])
            assert bool(sets.same_label[a, j]) == (same_label and i != j)
            assert bool(sets.other_labels[a, j]) == (not same_label)


# debiased_log_mean at the floor's boundary


@pytest.mark.parametrize("log_mean", [0.0, torch.finfo(torch.float64).tiny], ids=["u-zero", "u-minus-tiny"])
def test_debiasing_floors_pairs_from_u_minus_tiny_with_a_zero_gradient(log_mean):
    """u = log(tau+ e^{g_ip} / E) exactly 0 (E = tau+ e^{g_ip}) or -tiny, at a temperature whose floor
    -1/T lies below log(tiny): the value is the floor and the gradient exactly 0, not NaN or overflow."""
    tau_plus, temperature = 0.25, 1e-3
    g_pos = torch.tensor([[-math.log(tau_plus)]], dtype=torch.float64, requires_grad=True)
    log_e = torch.tensor([[log_mean]], dtype=torch.float64, requires_grad=True)
    out = debiased_log_mean(log_e, g_pos, tau_plus, temperature)
    assert out.item() == -1.0 / temperature
    out.backward(torch.full_like(out, 1.0 / temperature))
    assert g_pos.grad.item() == 0.0 and log_e.grad.item() == 0.0


def test_debiasing_above_the_floor_follows_the_formula():
    """log((E - tau+ e^g) / (1 - tau+)) with its derivatives, for E = 2, e^g = 1, tau+ = 0.25."""
    tau_plus = 0.25
    g_pos = torch.tensor([[0.0]], dtype=torch.float64, requires_grad=True)
    log_e = torch.tensor([[math.log(2.0)]], dtype=torch.float64, requires_grad=True)
    out = debiased_log_mean(log_e, g_pos, tau_plus, 0.5)
    assert out.item() == pytest.approx(math.log(1.75 / 0.75), rel=1e-14)
    out.backward()
    # d/dg = -tau e^g / (E - tau e^g), d/dlogE = E / (E - tau e^g)
    assert g_pos.grad.item() == pytest.approx(-0.25 / 1.75, rel=1e-14)
    assert log_e.grad.item() == pytest.approx(2.0 / 1.75, rel=1e-14)


# log_weighted_mean_exp


def test_weighted_mean_differentiates_through_the_weights_by_default():
    """Without detach_weights the gradient is that of log(sum w e^g / sum w) with w = e^{beta g}."""
    beta = 1.5
    negative = masks([[0, 1, 1, 1], [1, 0, 1, 0], [1, 1, 0, 1]])
    g = randn(3, 4, seed=1).requires_grad_()
    out = log_weighted_mean_exp(g, negative, negative.any(dim=1), ExponentialTilt(beta))
    expected = torch.stack([
        torch.log(torch.exp((1 + beta) * g[i][negative[i]]).sum()) - torch.log(torch.exp(beta * g[i][negative[i]]).sum())
        for i in range(3)
    ])
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=0)
    (ours,) = torch.autograd.grad(out.sum(), g)
    (theirs,) = torch.autograd.grad(expected.sum(), g)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-15)


# a global batch without a labelled image


@pytest.mark.parametrize("epoch", [None, 3], ids=["no-epoch", "epoch-3"])
def test_a_batch_without_labels_warns_with_the_whole_message(epoch):
    loss = ContrastiveLoss(negatives="other-labels", positives="labels", name="my-scl", unlabelled=-4)
    if epoch is not None:
        loss.set_epoch(epoch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss(randn(4, 2, 3, seed=2), torch.full((4,), -4))
    when = "" if epoch is None else f" in epoch {epoch}"
    assert [str(w.message) for w in caught] == [
        f"my-scl: a batch with no labelled image (every label is -4){when}; the loss used the unlabelled rule "
        "(UCL/H-UCL with its hardening) for it. Use larger batches or a larger labelled_fraction for label-aware "
        "training."
    ]


@pytest.mark.parametrize("allow_fused", [True, False], ids=["fused-allowed", "general-only"])
def test_a_batch_without_labels_keeps_every_option_of_the_loss(allow_fused):
    """Temperature, M, tau_plus and detach_weights all reach the unsupervised loss that an all-unlabelled
    batch falls back to: its value is the reference H-UCL's with them, its gradient that of H-UCL with them."""
    options = dict(hardening=ExponentialTilt(1.0), temperature=0.3, M=7.0, tau_plus=0.1, detach_weights=True)
    f = randn(5, 2, 4, seed=3)
    nobody = torch.full((5,), -1)
    loss = ContrastiveLoss(negatives="other-labels", positives="labels", **options)
    loss.allow_fused = allow_fused
    with pytest.warns(UserWarning, match="no labelled image"):
        ours = value_and_grad(loss, f, nobody)
    ref = reference_loss(f, None, method="hucl", positives="views", temperature=0.3, eta=exp_tilt(1.0),
                         tau_plus=0.1, M=7.0)
    assert ours[0].item() == pytest.approx(ref.item(), rel=1e-10)
    hucl = ContrastiveLoss(negatives="other-images", positives="views", **options)
    theirs = value_and_grad(hucl, f, None)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    attached = value_and_grad(ContrastiveLoss(negatives="other-images", positives="views",
                                              **{**options, "detach_weights": False}), f, None)
    assert not torch.allclose(ours[1], attached[1])


def test_a_batch_without_labels_on_the_fused_path_keeps_temperature_m_and_detached_weights():
    """Without debiasing the fallback may take the fused path; the options still reach it."""
    options = dict(hardening=ExponentialTilt(0.5), temperature=0.7, M=3.0, detach_weights=True)
    f = randn(5, 2, 4, seed=4)
    loss = ContrastiveLoss(negatives="other-labels", positives="views", **options)
    with pytest.warns(UserWarning, match="no labelled image"):
        ours = value_and_grad(loss, f, torch.full((5,), -1))
    assert loss.last_path == "fused"
    ref = reference_loss(f, None, method="hucl", positives="views", temperature=0.7, eta=exp_tilt(0.5), M=3.0)
    assert ours[0].item() == pytest.approx(ref.item(), rel=1e-10)
    theirs = value_and_grad(ContrastiveLoss(negatives="other-images", positives="views", **options), f, None)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])


# the device of the inputs


def losses_with_a_default_device(method_kwargs, allow_fused, labels, queued):
    queue = MemoryQueue(8) if queued else None
    loss = ContrastiveLoss(**method_kwargs, queue=queue)
    loss.allow_fused = allow_fused
    f = randn(6, 2, 4, seed=13)
    if queued:
        loss(randn(4, 2, 4, seed=14), None if labels is None else labels[:4])
        loss.eval()  # the queue is read, not pushed, by the calls compared
    plain = value_and_grad(loss, f, labels)
    path = loss.last_path
    with torch.device("meta"):
        in_context = value_and_grad(loss, f, labels)
    return loss, path, plain, in_context


@pytest.mark.parametrize("queued", [False, True], ids=["batch", "queue"])
@pytest.mark.parametrize("allow_fused", [True, False], ids=["fused", "general"])
@pytest.mark.parametrize("method", ["ucl", "hscl-tau"])
def test_a_default_device_does_not_move_the_loss_off_its_inputs_device(method, allow_fused, queued):
    """Under `with torch.device("meta")` (a caller's default device) CPU features give the same CPU loss
    and gradient: every mask and index the loss makes is made on the features' device."""
    if method == "ucl":
        kwargs, labels = dict(negatives="other-images", positives="views"), None
    else:
        kwargs, labels = dict(negatives="other-labels", positives="labels", hardening=Threshold(0.1, 0.5)), \
            torch.tensor([0, 1, 0, 2, 1, 1])
    loss, path, plain, in_context = losses_with_a_default_device(kwargs, allow_fused, labels, queued)
    assert loss.last_path == path == ("fused" if allow_fused and not queued else "general")
    assert in_context[0].device.type == "cpu" and in_context[1].device.type == "cpu"
    assert torch.equal(in_context[0], plain[0]) and torch.equal(in_context[1], plain[1])


# the memory queue on the general path


def test_queue_rows_follow_a_custom_unlabelled_marker():
    """Marker -7 in the batch and in the queue's rows: the loss equals the reference with that marker."""
    queue = MemoryQueue(8)
    loss = ContrastiveLoss(negatives="other-labels", positives="labels", unlabelled=-7, queue=queue,
                           queue_positives=True)
    loss(randn(4, 2, 5, seed=5), torch.tensor([0, -7, 1, 0]))
    rows, row_labels = queue.rows()
    assert (row_labels == -7).sum() == 2
    f, labels = randn(5, 2, 5, seed=6), torch.tensor([0, 1, -7, 1, 2])
    ours = loss(f, labels)
    ref = reference_loss(f, labels, method="scl", positives="labels", unlabelled=-7, queue=(rows, row_labels),
                         queue_positives=True)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-10)


def test_queue_rows_of_another_dtype_are_cast_to_the_features():
    """A queue filled by a float32 call serves a later float64 call: its rows join as float64."""
    queue = MemoryQueue(6)
    loss = ContrastiveLoss(negatives="other-images", positives="views", queue=queue)
    loss(randn(3, 2, 4, seed=7).float())
    rows, _ = queue.rows()
    assert rows.dtype == torch.float32
    f = randn(4, 2, 4, seed=8)
    ours = loss(f)
    assert ours.dtype == torch.float64
    ref = reference_loss(f, None, method="ucl", positives="views", queue=(rows.double(), None))
    assert ours.item() == pytest.approx(ref.item(), rel=1e-6)


# the fused path


def test_mask_keys_turn_labels_into_the_mask_dtype_only_where_every_label_is_exact():
    """float32 holds every integer up to 2**24 exactly, and not 2**24 + 1."""
    exact = 2**24
    for labels in ([0, 5], [3, exact], [-exact, 0]):
        keys = _mask_keys(torch.tensor(labels), torch.float32)
        assert keys.dtype == torch.float32 and keys.tolist() == labels
    for labels in ([0, exact + 1], [-(exact + 1), 0]):
        keys = _mask_keys(torch.tensor(labels), torch.float32)
        assert keys.dtype == torch.int64 and keys.tolist() == labels
    keys = _mask_keys(torch.tensor([0, 2**53]), torch.float64)
    assert keys.dtype == torch.float64


@pytest.mark.parametrize("big", [2**24, -(2**24) - 1], ids=["above", "below"])
def test_image_sets_keep_labels_apart_that_float32_would_merge(big):
    labels = torch.tensor([big, big + 1, big])
    positive, negative = image_sets(3, 3, 0, labels, label_positives=True, label_negatives=True,
                                    dtype=torch.float32, device=torch.device("cpu"))
    assert positive.tolist() == [[1, 0, 1], [0, 1, 0], [1, 0, 1]]
    assert negative.tolist() == [[0, 1, 0], [1, 0, 1], [0, 1, 0]]


@pytest.mark.parametrize("label_negatives", [False, True])
@pytest.mark.parametrize("label_positives", [False, True])
def test_image_sets_are_made_on_the_given_device(label_positives, label_negatives):
    meta = torch.device("meta")
    labels = torch.tensor([0, 1, 0, 2], device=meta)
    positive, negative = image_sets(2, 4, 1, labels, label_positives=label_positives, label_negatives=label_negatives,
                                    dtype=torch.float32, device=meta)
    assert positive.device == meta and negative.device == meta
    assert positive.shape == negative.shape == (2, 4) and positive.dtype == torch.float32


def test_image_sets_at_an_offset_by_image_and_by_label():
    labels = torch.tensor([0, 1, 0, 2])
    cpu = torch.device("cpu")
    by_image = image_sets(2, 4, 1, None, label_positives=False, label_negatives=False, dtype=torch.float64, device=cpu)
    assert by_image[0].tolist() == [[0, 1, 0, 0], [0, 0, 1, 0]]
    assert by_image[1].tolist() == [[1, 0, 1, 1], [1, 1, 0, 1]]
    by_label = image_sets(2, 4, 1, labels, label_positives=True, label_negatives=True, dtype=torch.float64, device=cpu)
    assert by_label[0].tolist() == [[0, 1, 0, 0], [1, 0, 1, 0]]
    assert by_label[1].tolist() == [[1, 0, 1, 1], [0, 1, 0, 1]]


def test_fused_threshold_gradient_uses_the_forward_level_to_the_last_digit():
    """A negative whose e^g lies between e^{l/T} and its float32 rounding: the fused backward must
    sort it as the forward did, so its float64 gradient matches the general path's and the reference's."""
    level, temperature = 0.3, 1.0
    tau = math.exp(level / temperature)
    tau32 = float(torch.tensor(tau, dtype=torch.float32))
    assert tau32 != tau
    c = (math.log(tau) + math.log(tau32)) / 2 * temperature  # the critical cosine
    f = torch.tensor([
        [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]],
        [[c, math.sqrt(1 - c * c), 0.0], [c, math.sqrt(1 - c * c), 0.0]],
        [[0.9, 0.0, math.sqrt(1 - 0.81)], [0.8, 0.1, math.sqrt(1 - 0.65)]],
    ], dtype=torch.float64)
    loss = ContrastiveLoss(negatives="other-images", positives="views", hardening=Threshold(level, temperature),
                           temperature=temperature)
    fused = value_and_grad(loss, f, None)
    assert loss.last_path == "fused"
    loss.allow_fused = False
    general = value_and_grad(loss, f, None)
    ref = f.clone().requires_grad_()
    reference_loss(ref, None, method="hucl", positives="views", temperature=temperature,
                   eta=threshold(level, temperature)).backward()
    torch.testing.assert_close(general[1], ref.grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(fused[1], ref.grad, rtol=1e-9, atol=1e-12)


def ucl_psi_sum(z, z_all, M, temperature):
    """Sum of psi over UCL's pairs for anchors z (b, V, d), the first b of candidates z_all (B, V, d)."""
    b, V, d = z.shape
    B = z_all.shape[0]
    if B < 2:  # no anchor has a negative: an exact zero, as the reference gives it
        return z.sum() * 0
    g = z.reshape(b * V, d) @ z_all.reshape(B * V, d).T / temperature
    image_a, image_c = torch.arange(b).repeat_interleave(V), torch.arange(B).repeat_interleave(V)
    other = image_a[:, None] != image_c[None, :]
    positive = ~other & (torch.arange(b * V)[:, None] != torch.arange(B * V)[None, :])
    log_mean = torch.logsumexp(g.masked_fill(~other, -math.inf), dim=1) - other.sum(dim=1).log()
    psi = F.softplus(math.log(M) + log_mean[:, None] - g)
    return psi[positive].sum()


@pytest.mark.parametrize("grad_of", ["anchors", "candidates"])
def test_fused_second_derivative_with_one_input_requiring_grad(grad_of):
    """Anchors and candidates as separate tensors, only one of them differentiated (a memory bank's
    candidates, or fixed anchors): gradient and Hessian-vector product equal the formula's."""
    M, temperature = 4.0, 0.5
    base = F.normalize(randn(3, 2, 4, seed=9), dim=-1)
    direction = randn(3, 2, 4, seed=10)

    def derivatives(psi_sum):
        x = base.clone().requires_grad_()
        z, z_all = (x, base.clone()) if grad_of == "anchors" else (base.clone(), x)
        (grad,) = torch.autograd.grad(psi_sum(z, z_all), x, create_graph=True)
        (hvp,) = torch.autograd.grad((grad * direction).sum(), x)
        return grad.detach(), hvp

    def fused(z, z_all):
        return fused_psi_sum(z, z_all, None, 0, label_positives=False, label_negatives=False, M=M,
                             temperature=temperature, hardening=None, detach_weights=False,
                             general=lambda a, b: ucl_psi_sum(a, b, M, temperature))[0]

    ours, theirs = derivatives(fused), derivatives(lambda z, z_all: ucl_psi_sum(z, z_all, M, temperature))
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-10, atol=1e-12)


def test_fused_second_derivative_when_the_sum_ignores_the_candidates():
    """One image: no anchor has a negative, and the sum, an exact zero from the anchors alone, leaves
    the candidates out of the graph; both derivatives are zero."""
    x = F.normalize(randn(1, 2, 4, seed=11), dim=-1).requires_grad_()
    total, count = fused_psi_sum(x, x * 1.0, None, 0, label_positives=False, label_negatives=False, M=2.0,
                                 temperature=0.5, hardening=None, detach_weights=False,
                                 general=lambda a, b: ucl_psi_sum(a, b, 2.0, 0.5))
    assert total.item() == 0.0 and count.item() == 0
    (grad,) = torch.autograd.grad(total, x, create_graph=True)
    assert torch.equal(grad, torch.zeros_like(x))


def test_own_entries_are_the_flat_indices_of_each_anchor_against_itself():
    b, V, B, offset = 2, 3, 4, 1
    own = torch.zeros(b, V, V, B, dtype=torch.bool)
    for i in range(b):
        for v in range(V):
            own[i, v, v, offset + i] = True
    assert _own_entries(b, V, B, offset, torch.device("cpu")).tolist() == own.flatten().nonzero().flatten().tolist()
    meta = torch.device("meta")
    on_meta = _own_entries(b, V, B, offset, meta)
    assert on_meta.device == meta and on_meta.shape == (b * V,)


@pytest.mark.parametrize("allow_fused", [True, False], ids=["fused", "general"])
def test_pair_psi_sum_counts_pairs_as_integers(allow_fused):
    """SCL on labels [0, 0, 1, 1, 0], two views: 6 class-0 anchors with 5 positives each and 4 class-1
    anchors with 3 make 42 pairs; a one-class batch (no negatives) counts none."""
    loss = ContrastiveLoss(negatives="other-labels", positives="labels")
    loss.allow_fused = allow_fused
    z = F.normalize(randn(5, 2, 3, seed=12), dim=-1)
    total, count = loss.pair_psi_sum(z, z, torch.tensor([0, 0, 1, 1, 0]), 0)
    assert loss.last_path == ("fused" if allow_fused else "general")
    assert count.dtype == torch.int64 and count.item() == 42
    total, count = loss.pair_psi_sum(z, z, torch.zeros(5, dtype=torch.int64), 0)
    assert count.dtype == torch.int64 and count.item() == 0 and total.item() == 0.0


# (hardening, temperature, M, dtype, embeddings N) -> applicable: with span = (1 + beta) / T the three
# log bounds span + log N, 2 / T + |log M| and span + |log N - log M| must stay below 80 (float32).
APPLICABLE = {
    "uniform-ratio-bound": ((None, 2 / 75, 1.0, torch.float32, 200), True),  # 37.5 + 5.3, 75, 42.8
    "threshold-ratio-bound": ((Threshold(0.1, 2 / 75), 2 / 75, 1.0, torch.float32, 200), True),
    "tilt-sum-bound-below": ((ExponentialTilt(5.0), 0.08, 98.0, torch.float32, 100), True),  # 75 + 4.61
    "tilt-sum-bound-above": ((ExponentialTilt(5.0), 0.08, 198.0, torch.float32, 200), False),  # 75 + 5.30
    "tilt-scale-bound-above": ((ExponentialTilt(5.0), 0.08, math.exp(10.0), torch.float32, 100), False),  # 75 + 5.39
    "one-embedding": ((None, 1 / 0.3, math.exp(-79.2), torch.float32, 1), True),  # 0.3, 79.8, 79.5
    "float16": ((None, 10.0, 1.0, torch.float16, 2), False),  # no normal-range table: never fused
    "bfloat16": ((None, 10.0, 1.0, torch.bfloat16, 2), False),
}


@pytest.mark.parametrize("case", list(APPLICABLE))
def test_fused_applicable_keeps_each_of_its_three_bounds(case):
    (hardening, temperature, M, dtype, n), expected = APPLICABLE[case]
    assert fused_applicable(hardening, 0.0, temperature, M, dtype, n) is expected


# ---- the call contract: refusals name the loss, the problem and the fix ----

def _refusal(make) -> str:
    with pytest.raises(ValueError) as error:
        make()
    return str(error.value)


def _scl(**options) -> ContrastiveLoss:
    return ContrastiveLoss(negatives="other-labels", positives="labels", **options)


@pytest.mark.parametrize("options, message", [
    (dict(negatives="x"), "negatives must be 'other-images' or 'other-labels', got 'x'."),
    (dict(temperature=0), "temperature must be a finite number > 0, got 0; the paper uses 0.5."),
    (dict(temperature=-0.5), "temperature must be a finite number > 0, got -0.5; the paper uses 0.5."),
    (dict(temperature=math.inf), "temperature must be a finite number > 0, got inf; the paper uses 0.5."),
    (dict(temperature="0.5"), "temperature must be a finite number > 0, got '0.5'; the paper uses 0.5."),
    (dict(tau_plus=1.0), "tau_plus is a class prior and must lie in [0, 1), got 1.0."),
    (dict(tau_plus=1.5), "tau_plus is a class prior and must lie in [0, 1), got 1.5."),
    (dict(hardening=3), "hardening must be callable (eta(t) -> weights) or None, got 3."),
    (dict(positives="views", queue_positives=True),
     "contrastive: queue_positives=True needs a queue (queue_size > 0) and positives='labels' (got 'views'): a queue "
     "row is never another view of the anchor's image, so only a same-label row can be a positive. Drop "
     "queue_positives, or use label positives."),
])
def test_bad_loss_options_are_refused_with_the_fix(options, message):
    assert _refusal(lambda: ContrastiveLoss(**{"negatives": "other-images", "positives": "views", **options})) == message


def test_loss_defaults():
    loss = ContrastiveLoss(negatives="other-images", positives="views")
    assert (loss.name, loss.detach_weights, loss.temperature, loss.tau_plus, loss.M) == ("contrastive", False, 0.5, 0.0, None)


def test_bad_features_and_labels_are_refused_with_the_fix():
    loss = _scl(name="mine")
    labels = torch.tensor([0, 1])
    assert _refusal(lambda: loss(torch.randn(4, 3), labels)) == (
        "mine: features must have shape (B, V, d), got (4, 3). Stack the views: torch.stack([view1, view2], dim=1).")
    assert _refusal(lambda: loss(torch.randn(2, 2, 3, 1), labels)) == "mine: features must have shape (B, V, d), got (2, 2, 3, 1)."
    assert _refusal(lambda: loss(torch.randn(0, 2, 3), labels[:0])) == (
        "mine: features of shape (0, 2, 3) are empty; pass at least one image.")
    assert _refusal(lambda: loss(torch.randn(2, 2, 0), labels)) == (
        "mine: features of shape (2, 2, 0) are empty; pass at least one image.")
    assert _refusal(lambda: loss(torch.randn(2, 2, 3), [0, 1])) == (
        "mine: labels must be a torch.Tensor of shape (2,), int64, got list.")
    assert _refusal(lambda: loss(torch.randn(2, 2, 3), torch.tensor([True, False]))) == (
        "mine: labels must be integer class ids (int64), got torch.bool; use labels.long().")
    assert _refusal(lambda: loss(torch.randn(2, 2, 3), torch.tensor([0, -3]))).startswith("mine: label -3 is negative")
    nan = torch.randn(2, 2, 3)
    nan[0, 0, 0] = math.nan
    assert _refusal(lambda: loss(nan, labels)).startswith("mine: ")


def test_one_dimensional_embeddings_are_a_loss_and_labels_a_view_loss_ignores():
    """d = 1 is not empty: every unit vector is +1 or -1. UCL reads no labels, so it does not check them."""
    f = torch.tensor([[[1.0], [2.0]], [[-1.0], [-3.0]], [[0.5], [-0.5]]], dtype=torch.float64)
    labels = torch.tensor([0, 1, 0])
    scl = _scl(name="scl")
    ref = reference_loss(f, labels, method="scl", positives="labels", temperature=0.5)
    torch.testing.assert_close(scl(f, labels), ref, rtol=1e-9, atol=1e-12)
    ucl = ContrastiveLoss(negatives="other-images", positives="views")
    torch.testing.assert_close(ucl(f, torch.tensor([0, -3, -7])), ucl(f, None), rtol=0, atol=0)


def test_labels_are_returned_as_int64_on_the_features_device():
    """validate_inputs hands the loss its labels as int64 on the features' device, whatever the caller
    passed: CPU int32 labels with features on the meta device (a device move made visible without a
    GPU) come back as meta int64, and on the CPU as int64 with the same values."""
    labels = torch.tensor([3, 0, -1], dtype=torch.int32)
    for needs_labels in (True, False):
        on_meta = validate_inputs(torch.empty(3, 2, 4, device="meta"), labels, needs_labels=needs_labels, loss_name="x")
        assert on_meta.device.type == "meta" and on_meta.dtype == torch.int64 and on_meta.shape == (3,)
    on_cpu = validate_inputs(torch.zeros(3, 2, 4), labels, needs_labels=True, loss_name="x")
    assert on_cpu.device.type == "cpu" and on_cpu.dtype == torch.int64 and on_cpu.tolist() == [3, 0, -1]


# batches mixing labelled and unlabelled images, and pair_psi_sum called directly


@pytest.mark.parametrize("allow_fused", [True, False], ids=["fused-allowed", "general-only"])
@pytest.mark.parametrize("method, hardening, eta", [
    ("scl", None, None),
    ("hscl-beta", ExponentialTilt(1.0), exp_tilt(1.0)),
    ("hscl-tau", Threshold(0.0, 0.5), threshold(0.0, 0.5)),
], ids=["scl", "hscl-beta", "hscl-tau"])
def test_a_single_unlabelled_image_follows_the_unlabelled_rule(method, hardening, eta, allow_fused):
    """Exactly one unlabelled image among labelled ones is a mixed batch: with unlabelled_negatives=False
    the labelled anchors must leave it out of their negatives, as the reference does. Read as a class of
    its own (-1) it would be every labelled anchor's negative, and the loss would differ."""
    f, labels = randn(5, 2, 4, seed=15), torch.tensor([0, 1, -1, 0, 1])
    loss = ContrastiveLoss(negatives="other-labels", positives="labels", hardening=hardening, unlabelled_negatives=False)
    loss.allow_fused = allow_fused
    ours = loss(f, labels)
    assert loss.last_path == "general"
    ref = reference_loss(f, labels, method=method, positives="labels", eta=eta, unlabelled_negatives=False)
    as_a_class = reference_loss(f, labels, method=method, positives="labels", eta=eta)
    assert ref.item() != pytest.approx(as_a_class.item(), rel=1e-3)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-10)


@pytest.mark.parametrize("hardening", [None, ExponentialTilt(1.0)], ids=["ucl", "hucl"])
def test_pair_psi_sum_of_a_view_loss_ignores_the_labels_it_is_given(hardening):
    """pair_psi_sum is also called directly (the diagnostics do), possibly with labels: a loss whose
    negatives and positives come from images alone (UCL, H-UCL) must not read them. Labels with
    unlabelled images and unlabelled_negatives=False leave its value the reference UCL's (its
    B*V*(V-1) pairs, all of them), and labels that are all unlabelled give no 'no labelled image'
    warning."""
    f = randn(5, 2, 4, seed=16)
    z = F.normalize(f, dim=-1)
    loss = ContrastiveLoss(negatives="other-images", positives="views", hardening=hardening, unlabelled_negatives=False)
    ref = reference_loss(f, None, method="hucl" if hardening else "ucl", positives="views",
                         eta=exp_tilt(1.0) if hardening else None)
    for labels in (torch.tensor([0, -1, 1, -1, 0]), torch.full((5,), -1)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            total, count = loss.pair_psi_sum(z, z, labels, 0)
        assert count.item() == 5 * 2 * 1
        assert (total / count).item() == pytest.approx(ref.item(), rel=1e-10)


@pytest.mark.parametrize("tau_plus", [0.0, 0.1], ids=["ucl", "debiased"])
def test_default_m_of_three_candidates_is_one(tau_plus):
    """M defaults to (candidates) - 2, floored at 1: one image with two views and one queue row are
    three candidates, so M = 1. Each view's psi is then log(1 + e^{g_iq - g_ip}) (g_iq to the queue
    row, its only negative) without debiasing, and log(1 + e^{-g_ip} max((e^{g_iq} - tau+ e^{g_ip}) /
    (1 - tau+), e^{-1/T})) with it: hand values and the reference agree."""
    temperature = 0.5
    f = randn(1, 2, 4, seed=17)
    row = F.normalize(randn(1, 4, seed=18), dim=-1)
    queue = MemoryQueue(1)
    queue.push(row, None)
    loss = ContrastiveLoss(negatives="other-images", positives="views", queue=queue, tau_plus=tau_plus,
                           temperature=temperature).eval()
    ours = loss(f)
    z = F.normalize(f[0], dim=-1)
    g_ip = (z[0] @ z[1]).item() / temperature
    psi = []
    for v in range(2):
        g_iq = (z[v] @ row[0]).item() / temperature
        mean = max((math.exp(g_iq) - tau_plus * math.exp(g_ip)) / (1 - tau_plus), math.exp(-1 / temperature))
        psi.append(math.log1p(math.exp(-g_ip) * mean))
    assert ours.item() == pytest.approx(sum(psi) / 2, rel=1e-12)
    ref = reference_loss(f, None, method="hucl", positives="views", tau_plus=tau_plus, temperature=temperature,
                         queue=(row, None))
    assert ours.item() == pytest.approx(ref.item(), rel=1e-10)
