"""The five contrastive objectives of Jiang et al.: UCL, H-UCL, SCL, H-SCL(beta), H-SCL(tau).

All five are one computation that differs in three choices (docs/losses.md, the loss contract):
which candidates are positives (other views of the image, or every same-label embedding), which
are negatives (every other image, or only other-label images), and how negatives are weighted
(uniformly, or by a hardening function of their similarity to the anchor). For anchor i and
positive p,

    psi_ip = log(1 + M * exp(-g_ip) * sum_j w_ij e^{g_ij} / sum_j w_ij),   g = cosine / temperature,

and the loss is the mean of psi over all (anchor, positive) pairs. The general path computes it in
log space (psi = softplus(log M + log E - g), the debiased E in log space too); the fused path
(`hscl_zoo.losses.fused`) takes the exponentials directly where the cosine bound keeps them normal
floating-point numbers. Both keep float32 relative precision when psi is tiny (trained-looking
batches at low temperature), are differentiable twice, and run in float32 (or float64 for float64
features) even when called, or differentiated, inside an autocast region.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hscl_zoo.losses.distributed import gather_with_grad, is_distributed, world_size
from hscl_zoo.losses.fused import fused_applicable, fused_psi_sum
from hscl_zoo.losses.hardening import HardeningFn, LinearThresholdSchedule
from hscl_zoo.losses.pairs import Negatives, Positives
from hscl_zoo.losses.queue import MemoryQueue, queue_masks
from hscl_zoo.losses.terms import _ScaledGram, debiased_log_mean, log_weighted_mean_exp, normalized, pair_sets, validate_inputs
from hscl_zoo.losses.unlabelled import UNLABELLED, check_marker, check_negative_labels, mixed_sets



class ContrastiveLoss(nn.Module):
    """InfoNCE in its large-negative-sample form with optional label-aware and hard negatives
    (docs/losses.md states the contract exactly).

    Called as `loss_fn(features, labels=None)` with `features` of shape (B, V, d) (B images, V >= 2
    views, L2-normalised here) and `labels` of shape (B,), integer. Returns a scalar.

    Args:
        negatives: "other-images" (UCL, H-UCL: every embedding of another image, labels unused) or
            "other-labels" (SCL, H-SCL: only embeddings whose label differs from the anchor's).
        positives: "views" (other views of the same image) or "labels" (also every view of other
            images with the anchor's label).
        hardening: None for uniform weights, else a non-negative non-decreasing function eta of the
            scaled similarity t = s / temperature; an anchor whose negatives all get weight 0
            falls back to uniform weights.
        temperature: gamma in g = s / gamma (the paper uses 0.5).
        M: the constant in front of the negative term; None means (global embeddings + queue rows
            in use) - 2.
        tau_plus: class prior of the debiased H-UCL estimator (Chuang/Robinson); 0 disables it.
        detach_weights: stop gradients through the hardening weights.
        unlabelled: the label of an image without a class (a negative integer; -1 by default).
            An unlabelled anchor is treated as by UCL / H-UCL (with this loss's hardening); a
            labelled anchor also takes the unlabelled images as negatives (docs/losses.md).
        unlabelled_negatives: False leaves the unlabelled images out of labelled anchors' negatives.
        queue: a `MemoryQueue` whose rows (earlier steps' detached embeddings) are extra candidates
            for every anchor, by the rule of `negatives` and with the same weights; in training
            mode each call then pushes the gathered batch into it (hscl_zoo.losses.queue).
        queue_positives: also make same-label queue rows positives (needs positives="labels").

    Edge cases: an anchor with no negative (a one-class batch for SCL) or no positive contributes
    nothing; if no pair contributes, the loss is an exact, differentiable 0.

    Paths: each call runs the fused path (`hscl_zoo.losses.fused`) when `fused_applicable` says it
    keeps full precision for this weighting, temperature, M and number of embeddings, else the
    general log-space path; `last_path` ("fused" or "general", None before the first call) says
    which ran; queue rows in use always take the general path. Setting `allow_fused = False` on an
    instance forces the general path. Second
    derivatives (backward with create_graph=True) are exact on both paths.

    Under torch.distributed the features and labels of every process are gathered with gradient,
    so each local anchor meets the negatives of the global batch. Each process returns
    (world size) * (sum of its pairs' psi) / (global number of pairs): the mean over processes is
    the loss of the global batch, and DDP's gradient averaging yields its gradient. Gradient
    accumulation does not add negatives: each micro-batch only sees its own global batch.
    Processes may pass batches of different sizes: the loss first all-gathers the sizes, and the
    host waits for them. Setting `equal_batches = True` on an instance says every process passes
    as many images as this one, and skips that all-gather. The pretraining loop sets it, as its
    loader drops the last incomplete batch; a wrong True mismatches the processes' gathers.

    Two per-call checks read device values on the host, so on a GPU each waits for the encoder's
    forward: labels that are negative but not `unlabelled` are refused (and the batch's unlabelled
    images counted), and non-finite features are refused. A caller that has checked its labels once
    (every one a class id >= 0) sets `labelled_only = True`; one that checks the loss's finiteness
    itself, later (the pretraining loop: once an epoch), sets `check_finite = False`. With both,
    a call queues its work without waiting.
    """

    allow_fused: bool = True
    equal_batches: bool = False
    labelled_only: bool = False
    check_finite: bool = True
    last_path: str | None = None

    def __init__(
        self,
        *,
        negatives: Negatives,
        positives: Positives,
        hardening: HardeningFn | None = None,
        temperature: float = 0.5,
        M: float | None = None,
        tau_plus: float = 0.0,
        detach_weights: bool = False,
        name: str = "contrastive",
        unlabelled: int = UNLABELLED,
        unlabelled_negatives: bool = True,
        queue: MemoryQueue | None = None,
        queue_positives: bool = False,
    ) -> None:
        super().__init__()
        if negatives not in ("other-images", "other-labels"):
            raise ValueError(f"negatives must be 'other-images' or 'other-labels', got {negatives!r}.")
        if positives not in ("views", "labels"):
            raise ValueError(f"positives must be 'views' or 'labels', got {positives!r}.")
        if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature <= 0:
            raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}; the paper uses 0.5.")
        if M is not None and (not math.isfinite(M) or M <= 0):
            raise ValueError(f"M must be a finite number > 0, or None for (number of embeddings) - 2; got {M!r}.")
        if not 0.0 <= tau_plus < 1.0:
            raise ValueError(f"tau_plus is a class prior and must lie in [0, 1), got {tau_plus!r}.")
        if hardening is not None and not callable(hardening):
            raise ValueError(f"hardening must be callable (eta(t) -> weights) or None, got {hardening!r}.")
        self.negatives = negatives
        self.positives = positives
        self.hardening = hardening
        self.temperature = float(temperature)
        self.M = None if M is None else float(M)
        self.tau_plus = float(tau_plus)
        self.detach_weights = bool(detach_weights)
        self.name = name
        self.unlabelled = check_marker(unlabelled)
        self.unlabelled_negatives = bool(unlabelled_negatives)
        self.epoch: int | None = None
        self._warned_in: tuple[int | None, ...] = ()
        if queue_positives and (queue is None or positives != "labels"):
            raise ValueError(
                f"{name}: queue_positives=True needs a queue (queue_size > 0) and positives='labels' (got "
                f"{positives!r}): a queue row is never another view of the anchor's image, so only a same-label "
                "row can be a positive. Drop queue_positives, or use label positives."
            )
        self.queue = queue
        self.queue_positives = bool(queue_positives)

    @property
    def needs_labels(self) -> bool:
        return self.negatives == "other-labels" or self.positives == "labels"

    def set_epoch(self, epoch: int) -> None:
        """Advance a threshold schedule and switch a memory queue on at its start epoch, if this
        loss has them (1-based epoch); the warning about batches without a labelled image is given
        again once per epoch."""
        self.epoch = epoch
        level = getattr(self.hardening, "level", None)
        if isinstance(level, LinearThresholdSchedule):
            level.set_epoch(epoch)
        if self.queue is not None:
            self.queue.set_epoch(epoch)

    def extra_repr(self) -> str:
        return (
            f"name={self.name!r}, negatives={self.negatives!r}, positives={self.positives!r}, "
            f"hardening={self.hardening!r}, temperature={self.temperature}, M={self.M}, "
            f"tau_plus={self.tau_plus}, detach_weights={self.detach_weights}, queue={self.queue!r}, "
            f"queue_positives={self.queue_positives}"
        )

    def forward(self, features: Tensor, labels: Tensor | None = None) -> Tensor:
        labels = validate_inputs(features, labels, needs_labels=self.needs_labels, loss_name=self.name)
        if labels is not None and self.needs_labels and not self.labelled_only:
            check_negative_labels(labels, self.unlabelled, loss_name=self.name)
        with torch.autocast(device_type=features.device.type, enabled=False):
            z = normalized(features, loss_name=self.name, check_finite=self.check_finite)
            sizes = [z.shape[0]] * world_size() if self.equal_batches else None
            z_all, (labels_all,), offset = gather_with_grad(z, labels if self.needs_labels else None, sizes=sizes)
            pair_sum, pair_count = self.pair_psi_sum(z, z_all, labels_all, offset)
            if self.queue is not None and self.queue.active and self.training:
                row_labels = None if labels_all is None else labels_all.repeat_interleave(z.shape[1])
                self.queue.push(z_all.detach().flatten(0, 1), row_labels)
            if is_distributed():
                pair_count = pair_count.clone()
                torch.distributed.all_reduce(pair_count)
            return pair_sum * world_size() / pair_count.clamp_min(1).to(z.dtype)

    def pair_psi_sum(self, z: Tensor, z_all: Tensor, labels_all: Tensor | None, offset: int) -> tuple[Tensor, Tensor]:
        """Sum of psi over this process's (anchor, positive) pairs, and how many pairs there are.

        `z` (B, V, d) are this process's normalised features, `z_all` the global batch's (the same
        tensor outside torch.distributed), `offset` the first local image in it. Nothing is
        reduced over processes: `forward` does that; the diagnostics call this on one batch.
        """
        mixed = False
        if labels_all is not None and self.needs_labels and not self.labelled_only:
            unlabelled = int((labels_all == self.unlabelled).sum())
            if unlabelled == labels_all.numel():
                return self._without_labels(z, z_all, offset)
            mixed = unlabelled > 0
        candidates = z_all.shape[0] * z.shape[1]
        queued = self.queue.rows() if self.queue is not None and self.queue.active and len(self.queue) else None
        candidates += 0 if queued is None else queued[0].shape[0]
        M = self.M if self.M is not None else max(candidates - 2, 1)
        fused = queued is None and self.allow_fused and not mixed and fused_applicable(
            self.hardening, self.tau_plus, self.temperature, M, z.dtype, candidates)
        self.last_path = "fused" if fused else "general"
        if fused:
            return self._fused_psi_sum(z, z_all, labels_all, offset, M)
        return self._masked_psi_sum(z, z_all, labels_all, offset, M, queued, mixed=mixed)

    def _without_labels(self, z: Tensor, z_all: Tensor, offset: int) -> tuple[Tensor, Tensor]:
        """A global batch without a labelled image: every anchor is unlabelled, so the loss is
        UCL / H-UCL with this loss's hardening, computed as that loss computes it. Warns once per epoch."""
        if self._warned_in != (self.epoch,):
            self._warned_in = (self.epoch,)
            when = f" in epoch {self.epoch}" if self.epoch is not None else ""
            warnings.warn(f"{self.name}: a batch with no labelled image (every label is {self.unlabelled}){when}; the "
                          "loss used the unlabelled rule (UCL/H-UCL with its hardening) for it. Use larger batches or "
                          "a larger labelled_fraction for label-aware training.")
        unsupervised = ContrastiveLoss(negatives="other-images", positives="views", hardening=self.hardening,
                                       temperature=self.temperature, M=self.M, tau_plus=self.tau_plus,
                                       detach_weights=self.detach_weights, name=self.name)
        unsupervised.allow_fused = self.allow_fused
        result = unsupervised.pair_psi_sum(z, z_all, None, offset)
        self.last_path = unsupervised.last_path
        return result

    def _fused_psi_sum(self, z: Tensor, z_all: Tensor, labels_all: Tensor | None, offset: int, M: float) -> tuple[Tensor, Tensor]:
        """The fast path (hscl_zoo.losses.fused): image-level sets broadcast over views; its second
        derivative comes from the general path."""
        def general(z: Tensor, z_all: Tensor) -> Tensor:
            return self._masked_psi_sum(z, z_all, labels_all, offset, M)[0]

        return fused_psi_sum(z, z_all, labels_all, offset, label_positives=self.positives == "labels",
                             label_negatives=self.negatives == "other-labels", M=M, temperature=self.temperature,
                             hardening=self.hardening, detach_weights=self.detach_weights, general=general)

    def _masked_psi_sum(
        self, z: Tensor, z_all: Tensor, labels_all: Tensor | None, offset: int, M: float,
        queued: tuple[Tensor, Tensor | None] | None = None, *, mixed: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """The general path: any hardening function, H-UCL debiasing, any temperature, batches
        mixing labelled and unlabelled images (`mixed`), and the memory queue's rows (`queued`:
        embeddings and labels) as extra candidate columns."""
        B, V, d = z.shape
        n_all = z_all.shape[0] * V
        g = _ScaledGram.apply(z.reshape(B * V, d), z_all.reshape(n_all, d), 1.0 / self.temperature)
        sets = pair_sets(B, V, z_all.shape[0], offset, labels_all, device=z.device)
        negative = sets.other_images if self.negatives == "other-images" else sets.other_labels
        positive = sets.same_image if self.positives == "views" else sets.same_label
        if mixed:
            positive, negative = mixed_sets(positive, negative, sets.same_image, sets.other_images,
                                            labels_all[offset : offset + B].repeat_interleave(V),
                                            labels_all.repeat_interleave(V), unlabelled=self.unlabelled,
                                            unlabelled_negatives=self.unlabelled_negatives)
        if queued is not None:
            rows, row_labels = queued
            anchor_labels = None if labels_all is None else labels_all[offset : offset + B].repeat_interleave(V)
            extra = queue_masks(anchor_labels, row_labels, n_anchors=B * V, n_rows=rows.shape[0], device=z.device,
                                label_negatives=self.negatives == "other-labels", label_positives=self.queue_positives,
                                unlabelled=self.unlabelled, unlabelled_negatives=self.unlabelled_negatives)
            g = torch.cat([g, _ScaledGram.apply(z.reshape(B * V, d), rows.to(z), 1.0 / self.temperature)], dim=1)
            negative, positive = torch.cat([negative, extra[0]], dim=1), torch.cat([positive, extra[1]], dim=1)
        has_negative = negative.any(dim=1)
        log_mean = log_weighted_mean_exp(g, negative, has_negative, self.hardening, self.detach_weights)
        if self.tau_plus > 0:
            log_mean = debiased_log_mean(log_mean[:, None], g, self.tau_plus, self.temperature)
        else:
            log_mean = log_mean[:, None]
        psi = F.softplus(math.log(M) + log_mean - g)
        counted = positive & has_negative[:, None]
        return torch.where(counted, psi, 0.0).sum(), counted.sum()
