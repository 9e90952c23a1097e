"""Unlabelled images in a batch: the label marker, its checks, and the labelled part of a batch.

A label equal to the marker (-1 unless a loss is given another ``unlabelled=``) means "no class".
The losses' rule for such images is in docs/losses.md; the diagnostics of the paper, which need
every anchor's class, use the labelled images only (`labelled_part`).
"""

from __future__ import annotations

import torch
from torch import Tensor

UNLABELLED = -1
"""The default label of an image without a class (the same value as `hscl_zoo.data.sources.UNLABELLED`)."""

__all__ = ["UNLABELLED", "check_marker", "check_negative_labels", "labelled_part", "mixed_sets"]


def check_marker(unlabelled: int) -> int:
    """Return the marker as an int; raise ValueError unless it is a negative integer (class ids are >= 0)."""
    if isinstance(unlabelled, bool) or not isinstance(unlabelled, int) or unlabelled >= 0:
        raise ValueError(f"unlabelled={unlabelled!r} must be a negative integer (the label that marks an image "
                         "without a class; the default is -1), since class ids are >= 0.")
    return unlabelled


def check_negative_labels(labels: Tensor, unlabelled: int, *, loss_name: str) -> None:
    """Raise ValueError if a label is negative but not the marker ``unlabelled``."""
    bad = labels[(labels < 0) & (labels != unlabelled)]
    if bad.numel():
        raise ValueError(f"{loss_name}: label {int(bad[0])} is negative; class ids are >= 0 and {unlabelled} marks an "
                         f"unlabelled image (unlabelled={unlabelled}). Relabel, or pass unlabelled={int(bad[0])} if "
                         "that value is your marker.")


def labelled_part(features: Tensor, labels: Tensor, unlabelled: int = UNLABELLED) -> tuple[Tensor, Tensor]:
    """The images of a (B, V, d) batch whose label is not the marker, and their labels (possibly none)."""
    keep = labels != unlabelled
    return features[keep], labels[keep]


def mixed_sets(
    positive: Tensor,
    negative: Tensor,
    same_image: Tensor,
    other_images: Tensor,
    anchor_labels: Tensor,
    candidate_labels: Tensor,
    *,
    unlabelled: int,
    unlabelled_negatives: bool,
) -> tuple[Tensor, Tensor]:
    """The (anchors x candidates) positive and negative masks of a batch mixing labelled and
    unlabelled images (docs/losses.md): an unlabelled anchor's positives are the other views of its
    image and its negatives every other image; a labelled anchor keeps ``positive`` and
    ``negative`` (the method's sets, in which an unlabelled candidate's label differs from the
    anchor's), less the unlabelled candidates when ``unlabelled_negatives`` is False."""
    anchor_unlabelled = (anchor_labels == unlabelled)[:, None]
    positive = torch.where(anchor_unlabelled, same_image, positive)
    negative = torch.where(anchor_unlabelled, other_images, negative)
    if not unlabelled_negatives:
        negative = negative & (anchor_unlabelled | (candidate_labels != unlabelled)[None, :])
    return positive, negative
