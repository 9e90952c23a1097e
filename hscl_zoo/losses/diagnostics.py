"""The paper's Sec. V-B diagnostics on a batch: Assumption 1 and the four losses of Lemma 1.

Assumption 1 holds for anchor i when the hardened mean of e^g over its label collisions C_i
(same label, other image) is at least the hardened mean over its other-label negatives D_i.
Under it, L_HSCL <= L_HUCL (Lemma 1), which `lemma_losses` lets one watch during training.
Both run on one process's batch without gradient.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hscl_zoo.losses.hardening import ExponentialTilt, HardeningFn, Threshold, log_hardening_weight
from hscl_zoo.losses.objective import ContrastiveLoss, log_weighted_mean_exp, normalized, pair_sets, validate_inputs


def _hardening(
    temperature: float, beta: float | None, threshold: float | None, hardening: HardeningFn | None = None
) -> HardeningFn:
    if sum(x is not None for x in (beta, threshold, hardening)) != 1:
        raise ValueError("pass exactly one of beta= (exponential tilt), threshold= (cosine level in [-1, 1]) "
                         "or hardening= (a hardening function, e.g. a loss's own).")
    if hardening is not None:
        return hardening
    return ExponentialTilt(beta) if beta is not None else Threshold(threshold, temperature)


def _scaled_similarities(features: Tensor, labels: Tensor, temperature: float):
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}; the paper uses 0.5.")
    labels = validate_inputs(features, labels, needs_labels=True, loss_name="diagnostics")
    B, V, d = features.shape
    z = normalized(features.detach(), loss_name="diagnostics").reshape(B * V, d)
    g = z @ z.T / temperature
    return g, pair_sets(B, V, B, 0, labels, device=features.device)


@torch.no_grad()
def assumption_counts(
    features: Tensor, labels: Tensor, *, temperature: float = 0.5, beta: float | None = None,
    threshold: float | None = None, hardening: HardeningFn | None = None,
) -> tuple[int, int]:
    """(anchors satisfying Assumption 1, eligible anchors): eligible anchors have both a label
    collision and an other-label negative in the batch. An empty hard set falls back to uniform
    weights, as in the loss."""
    g, sets = _scaled_similarities(features, labels, temperature)
    eta = _hardening(temperature, beta, threshold, hardening)
    collisions, others = sets.collisions, sets.other_labels
    eligible = collisions.any(dim=1) & others.any(dim=1)
    mean_collision = log_weighted_mean_exp(g, collisions, collisions.any(dim=1), eta)
    mean_other = log_weighted_mean_exp(g, others, others.any(dim=1), eta)
    holds = eligible & (mean_collision >= mean_other)
    return int(holds.sum()), int(eligible.sum())


def assumption_fraction(
    features: Tensor, labels: Tensor, *, temperature: float = 0.5, beta: float | None = None,
    threshold: float | None = None, hardening: HardeningFn | None = None,
) -> float:
    """Fraction of eligible anchors for which Assumption 1 holds under the exponential tilt
    (beta), the threshold (cosine level `threshold`) or any hardening function; NaN when no
    anchor is eligible."""
    holds, eligible = assumption_counts(features, labels, temperature=temperature, beta=beta, threshold=threshold,
                                        hardening=hardening)
    return holds / eligible if eligible else math.nan


@torch.no_grad()
def negative_masses(
    features: Tensor, labels: Tensor, hardening: HardeningFn, *, temperature: float = 0.5
) -> dict[str, Tensor]:
    """Per-anchor alpha_HUCL, alpha_HSCL, alpha_Hcol: the mean of eta(g) over all other images,
    weighted by 1 (hucl), by 1(other label) (hscl) and by 1(same label) (hcol). Proposition 2
    says alpha_HUCL = alpha_HSCL + alpha_Hcol."""
    g, sets = _scaled_similarities(features, labels, temperature)
    weight = torch.exp(log_hardening_weight(hardening, g))
    pool = sets.other_images
    n = pool.sum(dim=1).clamp_min(1).to(g.dtype)
    return {
        "hucl": torch.where(pool, weight, 0.0).sum(dim=1) / n,
        "hscl": torch.where(pool & sets.other_labels, weight, 0.0).sum(dim=1) / n,
        "hcol": torch.where(sets.collisions, weight, 0.0).sum(dim=1) / n,
    }


@torch.no_grad()
def lemma_losses(
    features: Tensor,
    labels: Tensor,
    *,
    temperature: float = 0.5,
    beta: float | None = 1.0,
    threshold: float | None = None,
    hardening: HardeningFn | None = None,
) -> dict[str, float]:
    """L_UCL, L_SCL, L_HUCL, L_HSCL on one batch, all with label positives (as Lemma 1 requires)
    and the same hardening (exponential tilt `beta`, or `threshold` or `hardening` when given)."""
    tilt = None if threshold is not None or hardening is not None else beta
    eta = _hardening(temperature, tilt, threshold, hardening)
    features = features.detach()
    losses = {
        "ucl": ContrastiveLoss(negatives="other-images", positives="labels", temperature=temperature),
        "scl": ContrastiveLoss(negatives="other-labels", positives="labels", temperature=temperature),
        "hucl": ContrastiveLoss(negatives="other-images", positives="labels", hardening=eta, temperature=temperature),
        "hscl": ContrastiveLoss(negatives="other-labels", positives="labels", hardening=eta, temperature=temperature),
    }
    return {name: float(_local_loss(loss, features, labels)) for name, loss in losses.items()}


def _local_loss(loss: ContrastiveLoss, features: Tensor, labels: Tensor) -> Tensor:
    labels = validate_inputs(features, labels, needs_labels=True, loss_name="diagnostics")
    z = normalized(features, loss_name="diagnostics")
    pair_sum, count = loss.pair_psi_sum(z, z, labels, 0)
    return pair_sum / count.clamp_min(1)


class DiagnosticsMeter:
    """Averages the diagnostics over an epoch: Assumption 1 over all eligible anchors seen,
    the Lemma 1 losses over batches. `update` per batch, `compute` at the end, `reset` to reuse."""

    def __init__(
        self,
        *,
        temperature: float = 0.5,
        beta: float | None = None,
        threshold: float | None = None,
        hardening: HardeningFn | None = None,
    ) -> None:
        _hardening(temperature, beta, threshold, hardening)
        self.temperature, self.beta, self.threshold, self.hardening = temperature, beta, threshold, hardening
        self.reset()

    def reset(self) -> None:
        self.holds = 0
        self.eligible = 0
        self.batches = 0
        self.loss_sums = {"ucl": 0.0, "scl": 0.0, "hucl": 0.0, "hscl": 0.0}
        self.lemma_batches_held = 0

    def update(self, features: Tensor, labels: Tensor) -> None:
        kw = dict(temperature=self.temperature, beta=self.beta, threshold=self.threshold, hardening=self.hardening)
        holds, eligible = assumption_counts(features, labels, **kw)
        losses = lemma_losses(features, labels, **kw)
        self.holds += holds
        self.eligible += eligible
        self.batches += 1
        self.lemma_batches_held += int(losses["hscl"] <= losses["hucl"])
        for key, value in losses.items():
            self.loss_sums[key] += value

    def compute(self) -> dict[str, float]:
        """assumption_fraction, loss_ucl/scl/hucl/hscl (batch means), lemma_held_fraction."""
        if self.batches == 0:
            raise ValueError("DiagnosticsMeter.compute() called before any update(); feed it at least one batch.")
        out = {"assumption_fraction": self.holds / self.eligible if self.eligible else math.nan}
        out.update({f"loss_{k}": v / self.batches for k, v in self.loss_sums.items()})
        out["lemma_held_fraction"] = self.lemma_batches_held / self.batches
        return out
