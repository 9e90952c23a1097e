import math

import pytest
import torch

from hscl_zoo import DiagnosticsMeter, assumption_fraction, build_loss, lemma_losses
from hscl_zoo.losses.hardening import ExponentialTilt, Threshold
from hscl_zoo.losses.reference import exp_tilt, reference_loss


def clustered(B=24, V=2, d=8, classes=4, spread=0.3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(B) % classes
    centres = torch.nn.functional.normalize(torch.randn(classes, d, generator=gen, dtype=torch.float64), dim=-1)
    f = centres[labels][:, None, :] + spread * torch.randn(B, V, d, generator=gen, dtype=torch.float64)
    return f, labels


def loop_assumption_counts(f, labels, temperature, eta):
    """(anchors satisfying Assumption 1, eligible anchors), one anchor at a time."""
    B, V, _ = f.shape
    z = torch.nn.functional.normalize(f, dim=-1).reshape(B * V, -1)
    image = torch.arange(B).repeat_interleave(V)
    y = labels.repeat_interleave(V)
    holds = eligible = 0
    for i in range(B * V):
        col = [j for j in range(B * V) if y[j] == y[i] and image[j] != image[i]]
        oth = [j for j in range(B * V) if y[j] != y[i]]
        if not col or not oth:
            continue
        def mean(js):
            g = torch.stack([z[i] @ z[j] / temperature for j in js])
            w = eta(g)
            w = torch.ones_like(w) if w.sum() == 0 else w
            return (w * g.exp()).sum() / w.sum()
        eligible += 1
        holds += int(mean(col) >= mean(oth))
    return holds, eligible


def loop_assumption_fraction(f, labels, temperature, eta):
    holds, eligible = loop_assumption_counts(f, labels, temperature, eta)
    return holds / eligible


@pytest.mark.parametrize("beta, threshold", [(1.0, None), (2.0, None), (None, 0.2)])
def test_assumption_fraction_matches_loop(beta, threshold):
    f, labels = clustered(spread=1.2, seed=1)
    eta = ExponentialTilt(beta) if beta is not None else Threshold(threshold, 0.5)
    ours = assumption_fraction(f, labels, beta=beta, threshold=threshold)
    assert 0.0 < ours < 1.0, "the case must be mixed to test anything"
    assert ours == pytest.approx(loop_assumption_fraction(f, labels, 0.5, eta))


def test_assumption_holds_on_well_clustered_features():
    f, labels = clustered(spread=0.05)
    assert assumption_fraction(f, labels, beta=1.0) == 1.0


def test_no_eligible_anchor_gives_nan():
    f, _ = clustered(B=4)
    assert math.isnan(assumption_fraction(f, torch.arange(4), beta=1.0))


def test_lemma_1_when_assumption_holds_for_every_anchor():
    f, labels = clustered(spread=0.2, seed=3)
    assert assumption_fraction(f, labels, beta=1.0) == 1.0
    losses = lemma_losses(f, labels, beta=1.0)
    assert set(losses) == {"ucl", "scl", "hucl", "hscl"}
    assert losses["hscl"] <= losses["hucl"]
    assert losses["hscl"] == pytest.approx(build_loss("hscl-beta", beta=1.0)(f, labels).item())
    assert losses["ucl"] == pytest.approx(build_loss("ucl", positives="labels")(f, labels).item())


def test_assumption_and_lemma_fail_when_labels_cut_across_clusters():
    # Every label holds one image of each cluster: collisions are far, other labels are near.
    f, clusters = clustered(spread=0.05, seed=4)
    labels = torch.arange(24) // 4
    assert assumption_fraction(f, labels, beta=1.0) == 0.0
    losses = lemma_losses(f, labels, beta=1.0)
    assert losses["hscl"] > losses["hucl"]


def test_meter_pools_anchor_counts_and_averages_batch_losses():
    """The epoch's Assumption-1 fraction is pooled over anchors (not a mean of batch fractions),
    the Lemma-1 losses are batch means, and lemma_held_fraction counts batches: all three are
    recomputed here from the loop counts and the loop reference loss, batch by batch."""
    cut_f, _ = clustered(spread=0.05, seed=4)
    batches = [clustered(B=24, spread=0.3, seed=0), (cut_f, torch.arange(24) // 4), clustered(B=16, spread=1.5, seed=1)]
    meter = DiagnosticsMeter(beta=1.0)
    for f, labels in batches:
        meter.update(f, labels)
    out = meter.compute()

    counts = [loop_assumption_counts(f, y, 0.5, ExponentialTilt(1.0)) for f, y in batches]
    pooled = sum(h for h, _ in counts) / sum(e for _, e in counts)
    assert out["assumption_fraction"] == pooled
    assert pooled != pytest.approx(sum(h / e for h, e in counts) / len(counts)), "batches must tell pooling from averaging"

    eta = {"ucl": None, "scl": None, "hucl": exp_tilt(1.0), "hscl": exp_tilt(1.0)}
    method = {"ucl": "ucl", "scl": "scl", "hucl": "hucl", "hscl": "hscl-beta"}
    per_batch = [{k: reference_loss(f, y, method=method[k], positives="labels", eta=eta[k]).item() for k in eta}
                 for f, y in batches]
    for k in eta:
        assert out[f"loss_{k}"] == pytest.approx(sum(b[k] for b in per_batch) / len(batches), rel=1e-12)
    held = [b["hscl"] <= b["hucl"] for b in per_batch]
    assert any(held) and not all(held), "the batches must include one where Lemma 1's inequality fails"
    assert out["lemma_held_fraction"] == sum(held) / len(batches)

    meter.reset()
    with pytest.raises(ValueError, match="before any update"):
        meter.compute()


def test_needs_exactly_one_hardening():
    f, labels = clustered()
    with pytest.raises(ValueError, match="exactly one"):
        assumption_fraction(f, labels)
    with pytest.raises(ValueError, match="exactly one"):
        assumption_fraction(f, labels, beta=1.0, threshold=0.1)
