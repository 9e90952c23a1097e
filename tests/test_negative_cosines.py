"""The negative-cosine distribution the diagnostics meter logs, the fraction a threshold keeps,
the Proposition-2 masses per epoch, and pooling meters through one summed state tensor."""

import math

import torch
import pytest

from hscl_zoo.losses.diagnostics import DiagnosticsMeter, histogram_quantile, negative_cosines, negative_masses
from hscl_zoo.losses.hardening import Threshold


def batch(seed, B=24, V=2, d=16, classes=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, V, d, generator=g), torch.randint(0, classes, (B,), generator=g)


def test_negative_cosines_are_the_other_label_pairs():
    features, labels = batch(0)
    z = torch.nn.functional.normalize(features.reshape(-1, 16), dim=-1)
    y = labels.repeat_interleave(2)
    expected = sorted((z[i] @ z[j]).item() for i in range(len(y)) for j in range(len(y)) if y[i] != y[j])
    got = sorted(negative_cosines(features, labels).tolist())
    assert len(got) == len(expected) and max(abs(a - b) for a, b in zip(got, expected)) < 1e-6


def test_histogram_quantile_matches_exact_quantiles_to_a_bin():
    values = torch.rand(20000) * 1.6 - 0.8
    counts = torch.histc(values, bins=200, min=-1.0, max=1.0)
    for q in (0.05, 0.25, 0.5, 0.9):
        assert abs(histogram_quantile(counts, q) - torch.quantile(values, q).item()) < 0.01
    assert math.isnan(histogram_quantile(torch.zeros(200), 0.5))


def test_meter_pools_states_and_reports_the_kept_fraction():
    threshold = 0.1
    batches = [batch(s) for s in range(3)]
    pooled = DiagnosticsMeter(threshold=threshold)
    parts = [DiagnosticsMeter(threshold=threshold) for _ in batches]
    for meter, (f, y) in zip(parts, batches):
        meter.update(f, y)
        pooled.update(f, y)
    summed = sum(m.state() for m in parts)
    assert pooled.summarise(summed) == pooled.compute()
    cosines = torch.cat([negative_cosines(f, y) for f, y in batches])
    out = pooled.compute()
    assert out["threshold_kept_fraction"] == pytest.approx((cosines >= threshold).double().mean().item())
    assert out["neg_cos_q50"] == pytest.approx(torch.quantile(cosines, 0.5).item(), abs=0.02)
    assert out["neg_cos_q05"] < out["neg_cos_q50"] < out["neg_cos_q95"]
    masses = [negative_masses(f, y, Threshold(threshold, 0.5)) for f, y in batches]
    for key in ("hucl", "hscl", "hcol"):
        assert out[f"mass_{key}"] == pytest.approx(sum(float(m[key].mean()) for m in masses) / 3)
    assert out["mass_hucl"] == pytest.approx(out["mass_hscl"] + out["mass_hcol"])  # Proposition 2
    assert "threshold_kept_fraction" not in DiagnosticsMeter(beta=1.0).summarise(parts[0].state())
