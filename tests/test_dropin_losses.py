"""The drop-in losses (hscl_zoo.losses.compat) against the libraries whose calls they take.

Where the formulas agree the values and gradients must be equal in float64: lightly's NT-Xent
(written out as a loop from lightly's documented formula, since lightly itself pulls
pytorch-lightning and hydra into the environment) and pytorch-metric-learning's ``NTXentLoss``
(the installed library). Elsewhere the float64 loop reference of the loss contract is the yardstick.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from pytorch_metric_learning import losses as pml

from hscl_zoo import MetricLearningLoss, NTXentLoss, SupConLoss
from hscl_zoo.losses.compat import labels_from_mask
from hscl_zoo.losses.reference import exp_tilt, reference_loss


def value_and_grad(fn, *inputs):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    value = fn(*leaves)
    return value.detach(), torch.autograd.grad(value, leaves)


def lightly_nt_xent(out0: torch.Tensor, out1: torch.Tensor, temperature: float) -> torch.Tensor:
    """lightly's NT-Xent, one anchor at a time: for each of the 2B normalised outputs, the
    cross-entropy of its other view against every output but itself; the mean over the 2B."""
    z = F.normalize(torch.cat([out0, out1]), dim=1)
    n, B = z.shape[0], out0.shape[0]
    terms = []
    for i in range(n):
        positive = (i + B) % n
        logits = [z[i] @ z[positive] / temperature]
        logits += [z[i] @ z[j] / temperature for j in range(n) if j not in (i, positive)]
        terms.append(-torch.log_softmax(torch.stack(logits), dim=0)[0])
    return torch.stack(terms).mean()


@pytest.fixture
def views():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(6, 5, generator=gen, dtype=torch.float64), torch.randn(6, 5, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("fused", [True, False])
def test_ntxent_is_lightly_formula(views, fused):
    loss = NTXentLoss(temperature=0.3)
    loss.loss.allow_fused = fused
    ours, ours_grad = value_and_grad(loss, *views)
    theirs, theirs_grad = value_and_grad(lambda a, b: lightly_nt_xent(a, b, 0.3), *views)
    assert loss.loss.last_path == ("fused" if fused else "general")
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=0)
    for a, b in zip(ours_grad, theirs_grad):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)


def test_supcon_without_labels_is_nt_xent(views):
    """SupContrast's self-supervised call (no labels, no mask): each image its own class."""
    ours = SupConLoss(temperature=0.3)(torch.stack(views, dim=1))
    torch.testing.assert_close(ours, lightly_nt_xent(*views, 0.3), rtol=1e-12, atol=0)


def test_supcon_labels_mask_and_hardness_follow_the_contract():
    gen = torch.Generator().manual_seed(1)
    features = torch.randn(8, 2, 3, 2, generator=gen, dtype=torch.float64)
    labels = torch.tensor([0, 1, 0, 2, 1, 1, 0, 2])
    loss = SupConLoss(temperature=0.5, method="hscl-beta", beta=2.0)
    by_labels = loss(features, labels)
    expected = reference_loss(features.flatten(2), labels, method="hscl-beta", positives="labels",
                              temperature=0.5, eta=exp_tilt(2.0))
    torch.testing.assert_close(by_labels, expected, rtol=1e-10, atol=0)
    mask = (labels[:, None] == labels[None, :]).float()
    torch.testing.assert_close(loss(features, mask=mask), by_labels, rtol=1e-12, atol=0)


def test_supcon_refuses_what_it_cannot_honour():
    features = torch.randn(4, 2, 3)
    not_a_partition = torch.eye(4)
    not_a_partition[0, 1] = 1
    with pytest.raises(ValueError, match="not a class partition.*pass labels"):
        SupConLoss()(features, mask=not_a_partition)
    with pytest.raises(ValueError, match="labels or mask, not both"):
        SupConLoss()(features, torch.arange(4), torch.eye(4))
    with pytest.raises(ValueError, match="contrast_mode='all'"):
        SupConLoss(contrast_mode="one")


@pytest.mark.parametrize("fused", [True, False])
def test_metric_learning_scl_is_pml_ntxent(fused):
    """Class labels, classes of equal size, M = the negatives per anchor: pml's NTXentLoss."""
    gen = torch.Generator().manual_seed(2)
    embeddings = torch.randn(12, 6, generator=gen, dtype=torch.float64)
    labels = torch.tensor([2, 0, 1, 1, 0, 2, 2, 1, 0, 0, 1, 2])
    loss = MetricLearningLoss(temperature=0.2, method="scl", M=12 - 4)
    loss.loss.allow_fused = fused
    ours, (ours_grad,) = value_and_grad(lambda e: loss(e, labels), embeddings)
    theirs, (theirs_grad,) = value_and_grad(lambda e: pml.NTXentLoss(temperature=0.2)(e, labels), embeddings)
    assert loss.loss.last_path == ("fused" if fused else "general")
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=0)
    torch.testing.assert_close(ours_grad, theirs_grad, rtol=1e-10, atol=1e-14)


def test_metric_learning_views_as_labels_is_pml_ntxent(views):
    """pml's self-supervised call (labels = image index, both views): UCL, also through pml."""
    embeddings = torch.cat(views)
    labels = torch.arange(6).repeat(2)
    ours, (ours_grad,) = value_and_grad(lambda e: MetricLearningLoss(temperature=0.3, method="ucl")(e, labels),
                                        embeddings)
    theirs, (theirs_grad,) = value_and_grad(lambda e: pml.NTXentLoss(temperature=0.3)(e, labels), embeddings)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=0)
    torch.testing.assert_close(ours_grad, theirs_grad, rtol=1e-10, atol=1e-14)


def test_metric_learning_hardness_follows_the_contract():
    gen = torch.Generator().manual_seed(3)
    embeddings = torch.randn(10, 4, generator=gen, dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1, 1, 2, 0, 2, 1, 0])
    ours = MetricLearningLoss(temperature=0.5, method="hscl-beta", beta=1.5)(embeddings, labels)
    expected = reference_loss(embeddings[:, None], labels, method="hscl-beta", positives="labels", temperature=0.5,
                              eta=exp_tilt(1.5))
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=0)


def test_unsupported_arguments_say_what_to_do():
    embeddings, labels = torch.randn(4, 3), torch.tensor([0, 0, 1, 1])
    loss = MetricLearningLoss()
    with pytest.raises(ValueError, match="indices_tuple.*drop the miner"):
        loss(embeddings, labels, indices_tuple=(torch.tensor([0]), torch.tensor([1])))
    with pytest.raises(ValueError, match="ref_emb.*concatenate"):
        loss(embeddings, labels, ref_emb=embeddings, ref_labels=labels)
    with pytest.raises(ValueError, match="positives.*labels decide"):
        MetricLearningLoss(positives="views")
    with pytest.raises(ValueError, match="queue_size=64"):
        NTXentLoss(memory_bank_size=64)


def test_docs_quote_the_benchmark_file():
    root = Path(__file__).resolve().parents[1]
    docs = " ".join((root / "docs" / "losses.md").read_text().split())
    rows = {(r["pair"].split()[0], r["B"]): r for r in
            json.loads((root / "benchmarks" / "results" / "dropin_losses_cpu.json").read_text())["rows"]}

    def ratios(name: str, B: int, digits: int = 2) -> tuple[str, str]:
        row = rows[(name, B)]
        return f"{row['time_ratio']['median']:.{digits}f}x", f"{row['memory_ratio']['median']:.{digits}f}x"

    (t1, m1), (t2, m2) = ratios("SupConLoss", 128), ratios("SupConLoss", 512)
    assert f"{t1} the time and {m1} the peak memory at B = 128, {t2} and {m2} at B = 512" in docs
    (t1, m1), (t2, m2) = ratios("NTXentLoss", 128), ratios("NTXentLoss", 512)
    assert f"{t1} and {m1} at B = 128, {t2} and {m2} at B = 512" in docs
    pml_128, pml_512 = rows[("MetricLearningLoss", 128)], rows[("MetricLearningLoss", 512)]
    t1, m1 = ratios("MetricLearningLoss", 128, digits=3)
    assert (f"{t1} the time and {m1} the memory at B = 128 ({pml_128['ours_ms']:.0f} ms against "
            f"{pml_128['reference_ms'] / 1e3:.1f} s, {pml_128['ours_peak_mib']:.1f} MiB against "
            f"{pml_128['reference_peak_mib']:.0f} MiB)") in docs
    assert "matrix of 4.3 GB" in docs and pml_512["reference_skipped"].endswith("4.3 GB")
    assert f"took {pml_512['ours_ms']:.0f} ms and {pml_512['ours_peak_mib']:.0f} MiB" in docs


def refusal(call, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as error:
        call(*args, **kwargs)
    return str(error.value)


def test_default_temperatures_are_the_other_libraries_defaults(views):
    """SupContrast 0.07, lightly 0.5, pytorch-metric-learning 0.07: a swapped import keeps the logits' scale."""
    torch.testing.assert_close(SupConLoss()(torch.stack(views, dim=1)), lightly_nt_xent(*views, 0.07),
                               rtol=1e-10, atol=0)
    torch.testing.assert_close(NTXentLoss()(*views), lightly_nt_xent(*views, 0.5), rtol=1e-12, atol=0)
    gen = torch.Generator().manual_seed(2)
    embeddings = torch.randn(12, 6, generator=gen, dtype=torch.float64)
    labels = torch.tensor([2, 0, 1, 1, 0, 2, 2, 1, 0, 0, 1, 2])
    torch.testing.assert_close(MetricLearningLoss(M=12 - 4)(embeddings, labels), pml.NTXentLoss()(embeddings, labels),
                               rtol=1e-12, atol=0)


@pytest.mark.parametrize("mask, shape", [
    (torch.ones(3, 4), "(3, 4)"),
    (torch.ones(4, 4, 4), "(4, 4, 4)"),
    (torch.ones(4), "(4,)"),
    ([[1, 0], [0, 1]], "list"),
])
def test_mask_that_is_not_a_square_matrix_is_refused_with_its_shape(mask, shape):
    expected = f"SupConLoss: mask must be a (B, B) tensor, got {shape}; or pass labels of shape (B,)."
    assert refusal(labels_from_mask, mask) == expected
    assert refusal(SupConLoss(), torch.randn(4, 2, 3), mask=mask) == expected


def test_mask_that_is_not_a_partition_is_refused_with_the_fix():
    not_transitive = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 1, 1]])
    assert refusal(labels_from_mask, not_transitive) == (
        "SupConLoss: mask is not a class partition (symmetric, 1 on the diagonal, transitive), so it cannot be read "
        "as classes; pass labels of shape (B,) instead.")


def test_mask_reads_as_the_first_image_of_each_class():
    labels = torch.tensor([2, 0, 2, 1, 0])
    assert labels_from_mask((labels[:, None] == labels[None, :]).float()).tolist() == [0, 1, 0, 3, 1]


def test_supcon_refusals_are_worded_exactly():
    features = torch.randn(4, 2, 3)
    assert refusal(SupConLoss(), features, torch.arange(4), torch.eye(4)) == "SupConLoss: pass labels or mask, not both."
    assert refusal(SupConLoss, contrast_mode="one") == (
        "SupConLoss: contrast_mode='one' is not supported; hscl_zoo's losses take every view as an anchor. "
        "Use contrast_mode='all'.")
    assert refusal(SupConLoss(), features.tolist()) == (
        "scl: features must be a torch.Tensor of shape (B, V, d), got list.")


@pytest.mark.parametrize("out0, out1, shapes", [
    (torch.randn(4, 3), [[0.0] * 3] * 4, "(4, 3) and list"),
    ([[0.0] * 3] * 4, torch.randn(4, 3), "list and (4, 3)"),
    (torch.randn(4, 2, 3), torch.randn(4, 2, 3), "(4, 2, 3) and (4, 2, 3)"),
    (torch.randn(4, 3), torch.randn(4, 5), "(4, 3) and (4, 5)"),
])
def test_ntxent_views_of_another_shape_are_refused_with_both_shapes(out0, out1, shapes):
    assert refusal(NTXentLoss(), out0, out1) == (
        f"NTXentLoss: out0 and out1 must be (B, d) tensors of one shape, got {shapes}.")


def test_ntxent_passes_its_options_and_labels_to_the_method(views):
    features = torch.stack(views, dim=1)
    hard = NTXentLoss(temperature=0.5, method="hucl", beta=2.0)(*views)
    torch.testing.assert_close(hard, reference_loss(features, None, method="hucl", positives="views", temperature=0.5,
                                                    eta=exp_tilt(2.0)), rtol=1e-10, atol=0)
    labels = torch.tensor([0, 1, 0, 1, 2, 2])
    supervised = NTXentLoss(temperature=0.5, method="scl")(*views, labels=labels)
    torch.testing.assert_close(supervised, reference_loss(features, labels, method="scl", positives="labels",
                                                          temperature=0.5), rtol=1e-10, atol=0)


@pytest.mark.parametrize("options, refused", [
    ({"queue_size": 64}, "queue_size"),
    ({"queue_positives": True}, "queue_positives"),
    ({"queue_start_epoch": 2}, "queue_start_epoch"),
    ({"queue_size": 8, "positives": "views"}, "positives, queue_size"),
])
def test_metric_learning_refuses_positives_and_queue_options_by_name(options, refused):
    assert refusal(MetricLearningLoss, **options) == (
        f"MetricLearningLoss: {refused} is not supported: the labels decide the positives and negatives, and there is "
        "no queue; use SupConLoss for those options.")


def test_metric_learning_refusals_of_pml_arguments_are_worded_exactly():
    embeddings, labels = torch.randn(4, 3), torch.tensor([0, 0, 1, 1])
    loss = MetricLearningLoss()
    assert refusal(loss, embeddings, labels, indices_tuple=(torch.tensor([0]), torch.tensor([1]))) == (
        "MetricLearningLoss: indices_tuple (a miner's pairs) is not supported: the loss uses every pair and weights "
        "negatives by hardness itself; drop the miner and choose the hardness with method= and its options "
        "(e.g. method='hscl-beta', beta=1.0).")
    ref = ("MetricLearningLoss: ref_emb/ref_labels are not supported; concatenate them with embeddings and labels "
           "(every embedding is then both anchor and candidate).")
    assert refusal(loss, embeddings, labels, ref_emb=embeddings) == ref
    assert refusal(loss, embeddings, labels, ref_labels=labels) == ref
    assert refusal(loss, embeddings, labels, ref_emb=embeddings, ref_labels=labels) == ref


def test_metric_learning_bad_inputs_are_refused_in_the_methods_name():
    loss = MetricLearningLoss(method="hscl-beta")
    embeddings, labels = torch.randn(4, 3), torch.tensor([0, 0, 1, 1])
    assert refusal(loss, embeddings.tolist(), labels) == "hscl-beta: embeddings must have shape (N, d), got list."
    assert refusal(loss, torch.randn(4, 2, 3), labels) == (
        "hscl-beta: embeddings must have shape (N, d), got (4, 2, 3).")
    assert refusal(loss, embeddings, labels.tolist()) == "hscl-beta: labels must be a tensor of shape (4,), got list."
    assert refusal(loss, embeddings, labels[:3]) == "hscl-beta: labels must be a tensor of shape (4,), got (3,)."
    for dtype in (torch.float32, torch.bool):
        assert refusal(loss, embeddings, labels.to(dtype)) == (
            f"hscl-beta: labels must be integer class ids (int64), got {dtype}; use labels.long().")
    assert refusal(loss, embeddings, torch.tensor([0, 0, -2, 1])) == (
        "hscl-beta: label -2 is negative; class ids are >= 0 and -1 marks an unlabelled image (unlabelled=-1). "
        "Relabel, or pass unlabelled=-2 if that value is your marker.")
    assert refusal(loss, torch.tensor([[0.0, 1.0], [float("nan"), 0.0]]), torch.tensor([0, 1])) == (
        "hscl-beta: features contain NaN or inf (or values whose norm overflows); check the encoder's output "
        "(learning rate, mixed precision).")


def test_metric_learning_takes_any_integer_labels_and_the_unlabelled_marker():
    gen = torch.Generator().manual_seed(4)
    embeddings = torch.randn(9, 4, generator=gen, dtype=torch.float64)
    labels = torch.tensor([0, -1, 1, 1, 0, -1, 2, 2, 0])
    loss = MetricLearningLoss(temperature=0.5, method="hscl-beta", beta=1.0)
    expected = reference_loss(embeddings[:, None], labels, method="hscl-beta", positives="labels", temperature=0.5,
                              eta=exp_tilt(1.0))
    torch.testing.assert_close(loss(embeddings, labels), expected, rtol=1e-10, atol=0)
    class_ids = labels.clamp_min(0) + 3 * (labels < 0)
    by_int64 = loss(embeddings, class_ids)
    for dtype in (torch.int32, torch.uint8, torch.uint16):
        torch.testing.assert_close(loss(embeddings, class_ids.to(dtype)), by_int64, rtol=0, atol=0)
