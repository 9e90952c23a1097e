"""Unlabelled images in a batch: the label marker, its checks, and the labelled part of a batch.

A label equal to the marker (-1 unless a loss is given another ``unlabelled=``) means "no class".
The losses' rule for such images is in docs/losses.md; the diagnostics of the paper, which need
every anchor's class, use the labelled images only (`labelled_part`).
"""

from __future__ import annotations

from torch import Tensor

UNLABELLED = -1
"""The default label of an image without a class (the same value as `hscl_zoo.data.sources.UNLABELLED`)."""

__all__ = ["UNLABELLED", "check_marker", "check_negative_labels", "labelled_part"]


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
