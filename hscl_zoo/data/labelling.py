"""Partly labelled training data: keep a seeded, class-balanced fraction of the labels.

The recipe's ``labelled_fraction: f`` simulates a dataset of which only a part is labelled: of
every class, ``round(f * n)`` seeded images (at least one) keep their label and the others get
the label -1 (:data:`hscl_zoo.data.sources.UNLABELLED`), which every loss reads as "no class"
(docs/losses.md). Images that were unlabelled already stay so; the test split is untouched.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from hscl_zoo.data.datasets import INTERNAL_LABEL, LoadedData, label_array
from hscl_zoo.data.sources import UNLABELLED

__all__ = ["check_labelled_fraction", "labelled_rows", "partly_labelled"]


def check_labelled_fraction(fraction: float) -> None:
    """Raise ValueError unless ``fraction`` is a number in (0, 1]."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not (
            math.isfinite(fraction) and 0 < fraction <= 1):
        raise ValueError(f"labelled_fraction={fraction!r} must be a number in (0, 1]: the part of each class's "
                         "training labels kept (e.g. 0.1 keeps a tenth; 1 keeps all).")


def labelled_rows(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Sorted indices of the rows that keep their label: of each class with n labelled rows,
    ``max(1, round(fraction * n))`` drawn with ``seed``."""
    check_labelled_fraction(fraction)
    rng = np.random.default_rng(seed)
    kept = [rng.permutation(np.flatnonzero(labels == c))[: max(1, round(fraction * int(np.sum(labels == c))))]
            for c in np.unique(labels[labels != UNLABELLED])]
    return np.sort(np.concatenate(kept)) if kept else np.zeros(0, dtype=np.int64)


def partly_labelled(data: LoadedData, fraction: float, *, seed: int = 0) -> LoadedData:
    """``data`` with only a seeded, class-balanced ``fraction`` of its training labels kept (see
    :func:`labelled_rows`); the other training rows are labelled -1 and counted in ``unlabelled``.
    ``fraction=1`` returns ``data`` unchanged."""
    check_labelled_fraction(fraction)
    if fraction == 1:
        return data
    labels = label_array(data.train)
    keep = np.zeros(len(labels), dtype=bool)
    keep[labelled_rows(labels, fraction, seed)] = True
    masked = np.where(keep, labels, UNLABELLED)
    train = data.train.remove_columns(INTERNAL_LABEL).add_column(
        INTERNAL_LABEL, masked.tolist(), feature=data.train.features[INTERNAL_LABEL])
    unlabelled = int(np.sum(masked == UNLABELLED))
    print(f"labelled_fraction {fraction:g}: kept {len(labels) - unlabelled} of {len(labels)} training labels "
          f"(seed {seed}); {unlabelled} training images are unlabelled (-1).", flush=True)
    return dataclasses.replace(data, train=train, unlabelled=unlabelled)
