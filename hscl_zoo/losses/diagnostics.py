"""The paper's Sec. V-B diagnostics on a batch: Assumption 1 and the four losses of Lemma 1.

Assumption 1 holds for anchor i when the hardened mean of e^g over its label collisions C_i
(same label, other image) is at least the hardened mean over its other-label negatives D_i.
Under it, L_HSCL <= L_HUCL (Lemma 1), which `lemma_losses` lets one watch during training.
Both run on one process's batch without gradient, on its labelled images only: an image whose
label is -1 (unlabelled) has no class, so it is neither a collision nor an other-label negative,
and is left out as anchor and as candidate; `DiagnosticsMeter` reports how many anchors it used.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hscl_zoo.losses.hardening import ExponentialTilt, HardeningFn, Threshold, log_hardening_weight
from hscl_zoo.losses.objective import ContrastiveLoss, log_weighted_mean_exp, normalized, pair_sets, validate_inputs
from hscl_zoo.losses.unlabelled import UNLABELLED, check_negative_labels, labelled_part


def _hardening(
    temperature: float, beta: float | None, threshold: float | None, hardening: HardeningFn | None = None
) -> HardeningFn:
    if sum(x is not None for x in (beta, threshold, hardening)) != 1:
        raise ValueError("pass exactly one of beta= (exponential tilt), threshold= (cosine level in [-1, 1]) "
                         "or hardening= (a hardening function, e.g. a loss's own).")
    if hardening is not None:
        return hardening
    return ExponentialTilt(beta) if beta is not None else Threshold(threshold, temperature)


def _labelled(features: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """The checked batch's labelled images (none, when every label is -1) and their int64 labels."""
    labels = validate_inputs(features, labels, needs_labels=True, loss_name="diagnostics")
    check_negative_labels(labels, UNLABELLED, loss_name="diagnostics")
    return labelled_part(features, labels)


def _scaled_similarities(features: Tensor, labels: Tensor, temperature: float):
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}; the paper uses 0.5.")
    features, labels = _labelled(features, labels)
    B, V, d = features.shape
    z = normalized(features.detach(), loss_name="diagnostics").reshape(B * V, d)
    g = z @ z.T / temperature
    return g, pair_sets(B, V, B, 0, labels, device=features.device)


@torch.no_grad()
def assumption_counts(
    features: Tensor, labels: Tensor, *, temperature: float = 0.5, beta: float | None = None,
    threshold: float | None = None, hardening: HardeningFn | None = None,
) -> tuple[int, int]:
    """(anchors satisfying Assumption 1, eligible anchors): eligible anchors are labelled and have
    both a label collision and an other-label negative among the batch's labelled images. An
    empty hard set falls back to uniform weights, as in the loss."""
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
    """Per labelled anchor alpha_HUCL, alpha_HSCL, alpha_Hcol: the mean of eta(g) over all other
    labelled images, weighted by 1 (hucl), by 1(other label) (hscl) and by 1(same label) (hcol).
    Proposition 2 says alpha_HUCL = alpha_HSCL + alpha_Hcol."""
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
    """L_UCL, L_SCL, L_HUCL, L_HSCL on one batch's labelled images, all with label positives (as
    Lemma 1 requires) and the same hardening (exponential tilt `beta`, or `threshold` or
    `hardening` when given); NaN when the batch has no labelled image."""
    tilt = None if threshold is not None or hardening is not None else beta
    eta = _hardening(temperature, tilt, threshold, hardening)
    features, labels = _labelled(features.detach(), labels)
    if not labels.numel():
        return dict.fromkeys(("ucl", "scl", "hucl", "hscl"), math.nan)
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


NEGATIVE_COSINE_BINS = 200
NEGATIVE_COSINE_QUANTILES = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95)


@torch.no_grad()
def negative_cosines(features: Tensor, labels: Tensor) -> Tensor:
    """Cosine similarities of every (anchor, other-label negative) pair among the batch's labelled
    images, flattened: the distribution a threshold l of H-SCL(tau) cuts (it keeps the pairs
    with cosine >= l)."""
    features, labels = _labelled(features, labels)
    B, V, d = features.shape
    z = normalized(features.detach(), loss_name="diagnostics").reshape(B * V, d)
    sets = pair_sets(B, V, B, 0, labels, device=features.device)
    return (z @ z.T)[sets.other_labels]


def histogram_quantile(counts: Tensor, q: float) -> float:
    """The q-quantile of values binned by `counts` into equal bins over [-1, 1], linear within a bin."""
    total = float(counts.sum())
    if total == 0:
        return math.nan
    cumulative = torch.cumsum(counts.double(), 0)
    target = q * total
    index = int(torch.searchsorted(cumulative, torch.tensor(target, dtype=torch.float64)).clamp_max(len(counts) - 1))
    below = float(cumulative[index - 1]) if index > 0 else 0.0
    inside = float(counts[index]) or 1.0
    width = 2.0 / len(counts)
    return -1.0 + width * (index + (target - below) / inside)


class DiagnosticsMeter:
    """Averages the diagnostics over an epoch: Assumption 1 over all eligible anchors seen, the
    Lemma 1 losses and the Proposition 2 masses over batches, and the distribution of
    other-label negative cosines (a histogram, and for a threshold the fraction it keeps). Only
    labelled images count; a batch without any is left out, and the record says how many
    anchors were used and how many unlabelled ones were left out.

    `update` per batch; `state()` is one float64 tensor of sums, so that processes pool their
    meters with a single all-reduce (sum) before `summarise(state)`; `compute()` does both locally.
    """

    LOSSES = ("ucl", "scl", "hucl", "hscl")
    MASSES = ("hucl", "hscl", "hcol")

    def __init__(
        self,
        *,
        temperature: float = 0.5,
        beta: float | None = None,
        threshold: float | None = None,
        hardening: HardeningFn | None = None,
    ) -> None:
        self.eta = _hardening(temperature, beta, threshold, hardening)
        self.temperature, self.beta, self.threshold, self.hardening = temperature, beta, threshold, hardening
        self.reset()

    def reset(self) -> None:
        self.holds = 0
        self.eligible = 0
        self.batches = 0
        self.loss_sums = dict.fromkeys(self.LOSSES, 0.0)
        self.mass_sums = dict.fromkeys(self.MASSES, 0.0)
        self.lemma_batches_held = 0
        self.negatives_kept = 0
        self.labelled_anchors = 0
        self.unlabelled_anchors = 0
        self.cosine_counts = torch.zeros(NEGATIVE_COSINE_BINS, dtype=torch.float64)

    def update(self, features: Tensor, labels: Tensor) -> None:
        kw = dict(temperature=self.temperature, beta=self.beta, threshold=self.threshold, hardening=self.hardening)
        views = features.shape[1] if features.ndim == 3 else 0
        total = features.shape[0] * views
        features, labels = _labelled(features, labels)
        self.labelled_anchors += labels.numel() * views
        self.unlabelled_anchors += total - labels.numel() * views
        if not labels.numel():
            return
        holds, eligible = assumption_counts(features, labels, **kw)
        losses = lemma_losses(features, labels, **kw)
        masses = negative_masses(features, labels, self.eta, temperature=self.temperature)
        cosines = negative_cosines(features, labels).float().clamp(-1.0, 1.0)
        self.holds += holds
        self.eligible += eligible
        self.batches += 1
        self.lemma_batches_held += int(losses["hscl"] <= losses["hucl"])
        for key, value in losses.items():
            self.loss_sums[key] += value
        for key, value in masses.items():
            self.mass_sums[key] += float(value.mean())
        self.cosine_counts += torch.histc(cosines, bins=NEGATIVE_COSINE_BINS, min=-1.0, max=1.0).double().cpu()
        if (level := self.threshold_level) is not None:
            self.negatives_kept += int((cosines >= level).sum())

    @property
    def threshold_level(self) -> float | None:
        """The cosine level a threshold hardening cuts at (None for other hardening functions)."""
        return self.threshold if self.threshold is not None else getattr(self.eta, "current_level", None)

    def state(self) -> Tensor:
        """Every running sum in one float64 tensor (sum it over processes, then `summarise`)."""
        scalars = [self.holds, self.eligible, self.batches, self.lemma_batches_held, self.negatives_kept,
                   self.labelled_anchors, self.unlabelled_anchors, *self.loss_sums.values(), *self.mass_sums.values()]
        return torch.cat([torch.tensor(scalars, dtype=torch.float64), self.cosine_counts])

    def summarise(self, state: Tensor) -> dict[str, float]:
        """The epoch's record from a (pooled) `state()`: assumption_fraction, loss_ucl/scl/hucl/hscl
        and mass_hucl/hscl/hcol (batch means), lemma_held_fraction, neg_cos_qNN (quantiles of the
        other-label negative cosines), diagnostics_anchors (labelled anchors used),
        diagnostics_unlabelled_anchors (left out) and, with a threshold, threshold_kept_fraction.
        Averages are NaN when no batch had a labelled image."""
        values = state.double().cpu()
        holds, eligible, batches, held, kept, labelled, unlabelled = values[:7].tolist()
        n_losses, n_masses = len(self.LOSSES), len(self.MASSES)
        losses = values[7:7 + n_losses].tolist()
        masses = values[7 + n_losses:7 + n_losses + n_masses].tolist()
        counts = values[7 + n_losses + n_masses:]
        if labelled + unlabelled == 0:
            raise ValueError("DiagnosticsMeter: summarised before any update(); feed it at least one batch first.")

        def per_batch(total: float) -> float:
            return total / batches if batches else math.nan

        out = {"assumption_fraction": holds / eligible if eligible else math.nan}
        out.update({f"loss_{k}": per_batch(v) for k, v in zip(self.LOSSES, losses)})
        out["lemma_held_fraction"] = per_batch(held)
        out.update({f"mass_{k}": per_batch(v) for k, v in zip(self.MASSES, masses)})
        out.update({f"neg_cos_q{round(100 * q):02d}": histogram_quantile(counts, q) for q in NEGATIVE_COSINE_QUANTILES})
        if self.threshold_level is not None:
            total = float(counts.sum())
            out["threshold_kept_fraction"] = kept / total if total else math.nan
        out["diagnostics_anchors"] = int(labelled)
        out["diagnostics_unlabelled_anchors"] = int(unlabelled)
        return out

    def compute(self) -> dict[str, float]:
        """This process's record (see `summarise`)."""
        return self.summarise(self.state())
