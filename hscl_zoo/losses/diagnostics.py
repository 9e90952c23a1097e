"""The paper's Sec. V-B diagnostics on a batch: Assumption 1 and the four losses of Lemma 1.

Assumption 1 holds for anchor i when the hardened mean of e^g over its label collisions C_i
(same label, other image) is at least the hardened mean over its other-label negatives D_i.
Under it, L_HSCL <= L_HUCL (Lemma 1), which `lemma_losses` lets one watch during training.
Both run on one process's batch without gradient, on its labelled images only: an image whose
label is -1 (unlabelled) has no class, so it is neither a collision nor an other-label negative,
and is left out as anchor and as candidate; `DiagnosticsMeter` reports how many anchors it used.

The functions return Python numbers (reading the device); `DiagnosticsMeter.update` computes the
same quantities with masks instead of selecting the labelled rows, and keeps its sums on the
features' device, so that a training step that feeds it never waits for the device.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from hscl_zoo.losses.hardening import ExponentialTilt, HardeningFn, Threshold, log_hardening_weight
from hscl_zoo.losses.objective import ContrastiveLoss
from hscl_zoo.losses.terms import log_weighted_mean_exp, normalized, pair_sets, validate_inputs
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
    holds, eligible = _assumption_rows(g, sets.collisions, sets.other_labels, eta)
    return int(holds.sum()), int(eligible.sum())


def _assumption_rows(g: Tensor, collisions: Tensor, others: Tensor, eta: HardeningFn) -> tuple[Tensor, Tensor]:
    """Per anchor row: (Assumption 1 holds and the anchor is eligible, the anchor is eligible)."""
    has_collision, has_other = collisions.any(dim=1), others.any(dim=1)
    eligible = has_collision & has_other
    mean_collision = log_weighted_mean_exp(g, collisions, has_collision, eta)
    mean_other = log_weighted_mean_exp(g, others, has_other, eta)
    return eligible & (mean_collision >= mean_other), eligible


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
    return _mass_rows(g, sets.other_images, sets.other_labels, sets.collisions, hardening)


def _mass_rows(g: Tensor, pool: Tensor, others: Tensor, collisions: Tensor, eta: HardeningFn) -> dict[str, Tensor]:
    """Per anchor row alpha_HUCL, alpha_HSCL, alpha_Hcol over the candidate masks given."""
    weight = torch.exp(log_hardening_weight(eta, g))
    n = pool.sum(dim=1).clamp_min(1).to(g.dtype)
    return {
        "hucl": torch.where(pool, weight, 0.0).sum(dim=1) / n,
        "hscl": torch.where(pool & others, weight, 0.0).sum(dim=1) / n,
        "hcol": torch.where(collisions, weight, 0.0).sum(dim=1) / n,
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


def _label_positive_loss(g: Tensor, positive: Tensor, negative: Tensor, eta: HardeningFn | None, log_M: Tensor) -> Tensor:
    """The loss's general path (docs/losses.md) over given masks, with M as a tensor: the mean over
    counted (anchor, positive) pairs of softplus(log M + log E_i - g_ip), 0 when none is counted."""
    has_negative = negative.any(dim=1)
    log_mean = log_weighted_mean_exp(g, negative, has_negative, eta)
    psi = F.softplus(log_M + log_mean[:, None] - g)
    counted = positive & has_negative[:, None]
    return torch.where(counted, psi, 0.0).sum() / counted.sum().clamp_min(1)


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
    """The q-quantile of values binned by `counts` into equal bins over [-1, 1], linear within a bin
    (NaN for an empty histogram or one with a NaN count)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"histogram_quantile needs a level q in [0, 1], got {q!r}.")
    cumulative = torch.cumsum(counts.double(), 0)
    total = float(cumulative[-1])  # in float64 like the cumulative counts it is compared with
    if total == 0:
        return math.nan
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

    `update` reads nothing back from the device: the sums stay a float64 tensor on the features'
    device (`state()` returns a copy of it there), the labelled images are selected by masks
    rather than by indexing (whose result size the host would have to wait for), and the input
    checks of the functions above (negative labels other than -1, NaN or infinite features) are
    counted on the device and raised by `summarise` / `compute`. With the provided hardening
    functions (exponential tilt, threshold) nothing in `update` waits for the device; another
    callable is checked for negative or non-finite weights on the host at every call.
    """

    LOSSES = ("ucl", "scl", "hucl", "hscl")
    MASSES = ("hucl", "hscl", "hcol")
    SCALARS = ("holds", "eligible", "batches", "lemma_batches_held", "negatives_kept", "labelled_anchors",
               "unlabelled_anchors")

    def __init__(
        self,
        *,
        temperature: float = 0.5,
        beta: float | None = None,
        threshold: float | None = None,
        hardening: HardeningFn | None = None,
    ) -> None:
        if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature <= 0:
            raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}; the paper uses 0.5.")
        self.eta = _hardening(temperature, beta, threshold, hardening)
        self.temperature, self.beta, self.threshold, self.hardening = temperature, beta, threshold, hardening
        self.reset()

    @property
    def state_size(self) -> int:
        return len(self.SCALARS) + len(self.LOSSES) + len(self.MASSES) + NEGATIVE_COSINE_BINS

    def reset(self) -> None:
        self._sums: Tensor | None = None  # laid out as state(), on the device of the first update's features
        self._refused: Tensor | None = None  # (labels negative but not -1, the most negative of them, non-finite rows)

    def start_from(self, state: Tensor) -> None:
        """Continue from an earlier `state()` (a run resumed within an epoch): later updates add
        to it in the order an uninterrupted meter's would, so the summary covers both parts."""
        if state.shape != (self.state_size,):
            raise ValueError(f"DiagnosticsMeter.start_from: a state holds {self.state_size} sums, got shape "
                             f"{tuple(state.shape)}; pass what state() returned.")
        self._sums = state.to(torch.float64).clone()
        self._refused = torch.zeros(3, dtype=torch.int64, device=state.device)

    def update(self, features: Tensor, labels: Tensor) -> None:
        sums, refused = self._batch_sums(features, labels)
        if self._sums is None:
            self._sums, self._refused = sums, refused
            return
        self._sums += sums
        self._refused = torch.stack([self._refused[0] + refused[0], torch.minimum(self._refused[1], refused[1]),
                                     self._refused[2] + refused[2]])

    @torch.no_grad()
    def _batch_sums(self, features: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """One batch's contribution to the sums (laid out as `state()`) and to the input checks,
        computed on the whole batch with the unlabelled rows masked out of every set."""
        labels = validate_inputs(features, labels, needs_labels=True, loss_name="diagnostics")
        B, V, d = features.shape
        f = features.detach().to(torch.float64 if features.dtype == torch.float64 else torch.float32)
        norms = torch.linalg.vector_norm(f, dim=-1, keepdim=True)
        z = (f / norms.clamp_min(1e-12)).reshape(B * V, d)  # `normalized`, without its host-side check
        labelled = labels != UNLABELLED
        bad = (labels < 0) & labelled
        refused = torch.stack([bad.sum(), torch.where(bad, labels, 0).min(), (~torch.isfinite(norms)).sum()])

        rows = labelled.repeat_interleave(V)
        both = rows[:, None] & rows[None, :]
        n_rows = rows.sum()
        has = n_rows > 0
        s = z @ z.T
        g = s / self.temperature
        sets = pair_sets(B, V, B, 0, labels, device=features.device)
        collisions, others = sets.collisions & both, sets.other_labels & both
        pool, positive = sets.other_images & both, sets.same_label & both

        holds, eligible = _assumption_rows(g, collisions, others, self.eta)
        log_M = (n_rows - 2).clamp_min(1).double().log().to(g.dtype)  # M = (labelled embeddings) - 2, as the loss
        negatives = {"ucl": (pool, None), "scl": (others, None), "hucl": (pool, self.eta), "hscl": (others, self.eta)}
        losses = {k: _label_positive_loss(g, positive, neg, eta, log_M) for k, (neg, eta) in negatives.items()}
        masses = [torch.where(rows, m, 0.0).sum() / n_rows.clamp_min(1)
                  for m in _mass_rows(g, pool, others, collisions, self.eta).values()]
        cosines = s.float().clamp(-1.0, 1.0)
        counted = others & ~torch.isnan(cosines)
        counts = torch.histc(torch.where(counted, cosines, 2.0), bins=NEGATIVE_COSINE_BINS, min=-1.0, max=1.0)
        level = self.threshold_level
        kept = (counted & (cosines >= level)).sum() if level is not None else torch.zeros_like(n_rows)

        scalars = [holds.sum(), eligible.sum(), has, has & (losses["hscl"] <= losses["hucl"]), kept, n_rows,
                   B * V - n_rows, *(torch.where(has, loss, 0.0) for loss in losses.values()), *masses]
        sums = torch.cat([torch.stack([x.to(torch.float64) for x in scalars]), counts.to(torch.float64)])
        return sums, refused

    @property
    def threshold_level(self) -> float | None:
        """The cosine level a threshold hardening cuts at (None for other hardening functions)."""
        return self.threshold if self.threshold is not None else getattr(self.eta, "current_level", None)

    def state(self) -> Tensor:
        """Every running sum in one float64 tensor (sum it over processes, then `summarise`), on the
        device of the features fed to `update` (zeros on the CPU before the first update)."""
        if self._sums is None:
            return torch.zeros(self.state_size, dtype=torch.float64)
        return self._sums.clone()

    def _raise_if_refused(self) -> None:
        if self._refused is None:
            return
        bad_labels, most_negative, nonfinite = self._refused.tolist()
        if bad_labels:
            raise ValueError(f"diagnostics: label {most_negative} is negative; class ids are >= 0 and {UNLABELLED} marks "
                             f"an unlabelled image ({bad_labels} such label(s) fed to update()).")
        if nonfinite:
            raise ValueError("diagnostics: features contain NaN or inf (or values whose norm overflows); check the "
                             f"encoder's output ({nonfinite} such embedding(s) fed to update()).")

    def summarise(self, state: Tensor) -> dict[str, float]:
        """The epoch's record from a (pooled) `state()`: assumption_fraction, loss_ucl/scl/hucl/hscl
        and mass_hucl/hscl/hcol (batch means), lemma_held_fraction, neg_cos_qNN (quantiles of the
        other-label negative cosines), diagnostics_anchors (labelled anchors used),
        diagnostics_unlabelled_anchors (left out) and, with a threshold, threshold_kept_fraction.
        Averages are NaN when no batch had a labelled image. Raises ValueError when this meter
        was fed labels or features that the functions above refuse."""
        self._raise_if_refused()
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
