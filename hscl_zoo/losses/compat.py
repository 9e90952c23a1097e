"""Drop-in losses with the call signatures of three other libraries, each a `build_loss` objective.

A project already calling one of these losses swaps the import and gains the method table's
hardness options (``method``, ``beta``, ``threshold``, ``tau_plus``, ``M``, ...) without
touching its training loop:

    SupConLoss          SupContrast's ``SupConLoss``: forward(features [B, V, d], labels=None, mask=None)
    NTXentLoss          lightly's ``NTXentLoss``: forward(out0, out1)
    MetricLearningLoss  pytorch-metric-learning's losses: forward(embeddings, labels,
                        indices_tuple=None, ref_emb=None, ref_labels=None)

Each computes the loss contract of docs/losses.md, not the other library's formula; the table
"Drop-in losses for other libraries" there says where the two agree (UCL with view positives is
NT-Xent; SCL with M = the number of negatives is pytorch-metric-learning's ``NTXentLoss``) and
how they differ elsewhere. Arguments whose meaning these losses cannot honour raise a ValueError
that says what to do instead. Temperatures default to the other library's default, so that a
swapped import keeps the scale of the logits.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from hscl_zoo.losses.methods import build_loss
from hscl_zoo.losses.objective import ContrastiveLoss
from hscl_zoo.losses.terms import normalized
from hscl_zoo.losses.unlabelled import check_negative_labels

__all__ = ["MetricLearningLoss", "NTXentLoss", "SupConLoss"]


class SupConLoss(nn.Module):
    """SupContrast's ``SupConLoss`` call, computing ``build_loss(method, **options)``.

    As in SupContrast, ``labels=None`` and ``mask=None`` is the self-supervised case: each image is
    its own class, so label-aware methods (SCL, H-SCL) become their unsupervised counterparts
    (UCL, and H-UCL with the same weights). A ``mask`` is accepted when it is a class partition
    (mask[i, j] = 1 exactly when images i and j share a class), and read as those classes.

    Args:
        temperature: the temperature (SupContrast's default 0.07).
        contrast_mode: only ``"all"`` (every view is an anchor), as in every hscl_zoo loss.
        method: a registered method name (``"scl"``, ``"hscl-beta"``, ...).
        **options: the method's `build_loss` keywords (beta, threshold, tau_plus, M, ...).
    """

    def __init__(self, temperature: float = 0.07, contrast_mode: str = "all", method: str = "scl",
                 **options: Any) -> None:
        super().__init__()
        if contrast_mode != "all":
            raise ValueError(f"SupConLoss: contrast_mode={contrast_mode!r} is not supported; hscl_zoo's losses take "
                             "every view as an anchor. Use contrast_mode='all'.")
        self.loss: ContrastiveLoss = build_loss(method, temperature=temperature, **options)

    def forward(self, features: Tensor, labels: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        if labels is not None and mask is not None:
            raise ValueError("SupConLoss: pass labels or mask, not both.")
        if isinstance(features, Tensor) and features.ndim > 3:
            features = features.flatten(2)
        if mask is not None:
            labels = labels_from_mask(mask)
        if labels is None and self.loss.needs_labels and isinstance(features, Tensor) and features.ndim == 3:
            labels = torch.arange(features.shape[0], device=features.device)
        return self.loss(features, labels)


def labels_from_mask(mask: Tensor) -> Tensor:
    """The class of each image from a (B, B) same-class mask: the first image of its class.
    Raises ValueError if the mask is not a class partition."""
    if not isinstance(mask, Tensor) or mask.ndim != 2 or mask.shape[0] != mask.shape[1]:
        shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"SupConLoss: mask must be a (B, B) tensor, got {shape}; or pass labels of shape (B,).")
    same = mask.bool()
    labels = same.to(torch.uint8).argmax(dim=1)
    if not torch.equal(same, labels[:, None] == labels[None, :]):
        raise ValueError("SupConLoss: mask is not a class partition (symmetric, 1 on the diagonal, transitive), so "
                         "it cannot be read as classes; pass labels of shape (B,) instead.")
    return labels


class NTXentLoss(nn.Module):
    """lightly's ``NTXentLoss`` call, computing ``build_loss(method, **options)`` on the two views.

    With the default ``method="ucl"`` it is NT-Xent: the other view is the positive and every view
    of the other images a negative, M = 2B - 2 of them. A label-aware method needs
    ``labels`` (an extra keyword lightly does not have). Under torch.distributed the global batch is
    always gathered, as lightly does with ``gather_distributed=True``.

    Args:
        temperature: the temperature (lightly's default 0.5).
        memory_bank_size: only 0; for extra negatives from earlier batches pass ``queue_size``
            (hscl_zoo's memory queue, docs/losses.md).
        method: a registered method name (``"ucl"``, ``"hucl"``, ...).
        **options: the method's `build_loss` keywords.
    """

    def __init__(self, temperature: float = 0.5, memory_bank_size: int = 0, method: str = "ucl",
                 **options: Any) -> None:
        super().__init__()
        if memory_bank_size:
            raise ValueError(f"NTXentLoss: memory_bank_size={memory_bank_size} is not supported; pass "
                             f"queue_size={memory_bank_size} for hscl_zoo's memory queue (docs/losses.md).")
        self.loss: ContrastiveLoss = build_loss(method, temperature=temperature, **options)

    def forward(self, out0: Tensor, out1: Tensor, labels: Tensor | None = None) -> Tensor:
        if not isinstance(out0, Tensor) or not isinstance(out1, Tensor) or out0.ndim != 2 or out0.shape != out1.shape:
            shapes = [tuple(o.shape) if isinstance(o, Tensor) else type(o).__name__ for o in (out0, out1)]
            raise ValueError(f"NTXentLoss: out0 and out1 must be (B, d) tensors of one shape, got {shapes[0]} and "
                             f"{shapes[1]}.")
        return self.loss(torch.stack([out0, out1], dim=1), labels)


class MetricLearningLoss(nn.Module):
    """pytorch-metric-learning's loss call, computing ``build_loss(method, **options)`` with the
    labels deciding positives and negatives, as in that library.

    Every embedding is an anchor; its positives are the other embeddings of its label and its
    negatives those of other labels, weighted by the method's hardening (so ``"ucl"`` and ``"scl"``
    are the same loss here, as are ``"hucl"`` with a beta and ``"hscl-beta"``; ``"hucl"`` adds
    ``tau_plus``). With labels = image indices (each image's views share one) it is the method's
    self-supervised loss; with class labels, M = the number of negatives per anchor, and classes of
    equal size in the batch, ``"scl"`` is pytorch-metric-learning's ``NTXentLoss``. Nothing is
    gathered across processes (wrap it as that library's ``DistributedLossWrapper`` would, or use
    `SupConLoss`).

    Args:
        temperature: the temperature (pytorch-metric-learning's ``NTXentLoss`` default 0.07).
        method: a registered method name.
        **options: the method's `build_loss` keywords except ``positives`` (the labels decide) and
            the memory queue's.
    """

    def __init__(self, temperature: float = 0.07, method: str = "scl", **options: Any) -> None:
        super().__init__()
        refused = sorted({"positives", "queue_size", "queue_positives", "queue_start_epoch"} & set(options))
        if refused:
            raise ValueError(f"MetricLearningLoss: {', '.join(refused)} is not supported: the labels decide the "
                             "positives and negatives, and there is no queue; use SupConLoss for those options.")
        self.loss: ContrastiveLoss = build_loss(method, temperature=temperature, positives="labels", **options)
        self.loss.negatives = "other-labels"

    def forward(self, embeddings: Tensor, labels: Tensor, indices_tuple: Any = None, ref_emb: Tensor | None = None,
                ref_labels: Tensor | None = None) -> Tensor:
        if indices_tuple is not None:
            raise ValueError("MetricLearningLoss: indices_tuple (a miner's pairs) is not supported: the loss uses every "
                             "pair and weights negatives by hardness itself; drop the miner and choose the hardness "
                             "with method= and its options (e.g. method='hscl-beta', beta=1.0).")
        if ref_emb is not None or ref_labels is not None:
            raise ValueError("MetricLearningLoss: ref_emb/ref_labels are not supported; concatenate them with "
                             "embeddings and labels (every embedding is then both anchor and candidate).")
        name = self.loss.name
        if not isinstance(embeddings, Tensor) or embeddings.ndim != 2:
            shape = tuple(embeddings.shape) if isinstance(embeddings, Tensor) else type(embeddings).__name__
            raise ValueError(f"{name}: embeddings must have shape (N, d), got {shape}.")
        if not isinstance(labels, Tensor) or labels.shape != embeddings.shape[:1]:
            shape = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
            raise ValueError(f"{name}: labels must be a tensor of shape ({embeddings.shape[0]},), got {shape}.")
        if labels.dtype.is_floating_point or labels.dtype == torch.bool:
            raise ValueError(f"{name}: labels must be integer class ids (int64), got {labels.dtype}; use labels.long().")
        labels = labels.to(device=embeddings.device, dtype=torch.int64)
        check_negative_labels(labels, self.loss.unlabelled, loss_name=name)
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            z = normalized(embeddings[:, None, :], loss_name=name)
            pair_sum, pair_count = self.loss.pair_psi_sum(z, z, labels, 0)
            return pair_sum / pair_count.clamp_min(1).to(z.dtype)
