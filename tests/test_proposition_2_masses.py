"""The Proposition 2 masses (`negative_masses`, the meter's mass_*) against the paper's definition,
written out one anchor and one candidate at a time.

For anchor x and hardening eta, the paper defines alpha_HSCL(x) = E_{x- ~ q_UCL}[1(y(x-) != y(x)) eta(g)],
alpha_Hcol(x) = E_{x- ~ q_UCL}[1(y(x-) = y(x)) eta(g)] and alpha_HUCL(x) = E_{x- ~ q_UCL}[eta(g)],
g = f(x).f(x-) / temperature. On a batch, q_UCL is uniform over the other labelled images' views
(not the anchor's own image), so each alpha is a sum over those candidates divided by their count.
"""

import math

import pytest
import torch

from hscl_zoo.losses.diagnostics import DiagnosticsMeter, negative_masses
from hscl_zoo.losses.hardening import ExponentialTilt, Threshold

from test_diagnostics import clustered


def loop_masses(f: torch.Tensor, labels: torch.Tensor, eta, temperature: float) -> dict[str, list[float]]:
    """Per labelled anchor embedding (image-major order), the three alphas from the definition."""
    B, V, _ = f.shape
    out = {"hucl": [], "hscl": [], "hcol": []}
    for a in range(B):
        for v in range(V):
            if labels[a] == -1:
                continue
            x = f[a, v] / f[a, v].norm()
            total = {"hucl": 0.0, "hscl": 0.0, "hcol": 0.0}
            count = 0
            for b in range(B):
                if b == a or labels[b] == -1:
                    continue
                for w in range(V):
                    g = float(x @ (f[b, w] / f[b, w].norm())) / temperature
                    weight = float(eta(torch.tensor(g, dtype=torch.float64)))
                    count += 1
                    total["hucl"] += weight
                    total["hscl" if labels[b] != labels[a] else "hcol"] += weight
            for key in out:
                out[key].append(total[key] / count)
    return out


@pytest.mark.parametrize("eta", [ExponentialTilt(1.5), ExponentialTilt(0.5), Threshold(0.1, 0.5)], ids=repr)
def test_masses_equal_the_definition_per_anchor(eta):
    f, labels = clustered(B=10, V=2, spread=1.0, seed=2)
    labels = labels.clone()
    labels[3] = -1  # an unlabelled image is neither anchor nor candidate
    expected = loop_masses(f, labels, eta, temperature=0.5)
    ours = negative_masses(f, labels, eta, temperature=0.5)
    for key in ("hucl", "hscl", "hcol"):
        assert ours[key].shape == (18,)
        torch.testing.assert_close(ours[key], torch.tensor(expected[key], dtype=torch.float64), rtol=1e-10, atol=0)
    assert min(expected["hcol"]) < max(expected["hcol"]), "the anchors must differ to test anything"


def test_masses_at_another_temperature():
    """g is divided by the temperature before eta sees it: tilt 1 at temperature 0.25 is exp(4 s)."""
    f, labels = clustered(B=8, V=2, spread=0.8, seed=5)
    eta = ExponentialTilt(1.0)
    expected = loop_masses(f, labels, eta, temperature=0.25)
    ours = negative_masses(f, labels, eta, temperature=0.25)
    for key in ("hucl", "hscl", "hcol"):
        torch.testing.assert_close(ours[key], torch.tensor(expected[key], dtype=torch.float64), rtol=1e-10, atol=0)


def test_meter_masses_are_the_batch_means_of_the_per_anchor_definition():
    """mass_* in the epoch record: per batch, the mean over labelled anchors; then the mean over batches."""
    data = [clustered(B=8, V=2, spread=1.0, seed=s) for s in (6, 7)]
    data[1][1][0] = -1
    meter = DiagnosticsMeter(beta=1.5)
    for f, y in data:
        meter.update(f, y)
    record = meter.compute()
    for key in ("hucl", "hscl", "hcol"):
        per_batch = [sum(m) / len(m) for m in (loop_masses(f, y, ExponentialTilt(1.5), 0.5)[key] for f, y in data)]
        assert record[f"mass_{key}"] == pytest.approx(sum(per_batch) / 2, rel=1e-9)
    assert not math.isnan(record["mass_hcol"])
