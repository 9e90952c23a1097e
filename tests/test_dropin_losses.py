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
