"""scikit-learn's bundled 8x8 digits as a dataset of the zoo: no network and no files needed.

The 1,797 images are scaled to 0-255, upscaled bilinearly to 16x16 and replicated to RGB; the
train/test split is stratified with a fixed seed, so every machine gets the same 360 test images.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import datasets

    from hscl_zoo.data.spec import DatasetSpec

DIGITS_IMAGE_SIZE = 16
DIGITS_TEST_SIZE = 360
DIGITS_SPLIT_SEED = 0


def digits_tables(spec: DatasetSpec) -> tuple[datasets.Dataset, datasets.Dataset]:
    """The (train, test) tables of the digits in the internal form (``image``, ``label``), with
    `spec`'s class names."""
    return _digits_splits(spec.fallback_class_names)


@functools.lru_cache(maxsize=1)
def _digits_splits(class_names: tuple[str, ...]) -> tuple[datasets.Dataset, datasets.Dataset]:
    import datasets
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    pixels = np.clip(np.rint(bunch.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    images = [
        Image.fromarray(p)
        .resize((DIGITS_IMAGE_SIZE, DIGITS_IMAGE_SIZE), Image.Resampling.BILINEAR)
        .convert("RGB")
        for p in pixels
    ]
    labels = bunch.target.astype(np.int64)
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)),
        test_size=DIGITS_TEST_SIZE,
        stratify=labels,
        random_state=DIGITS_SPLIT_SEED,
    )
    features = datasets.Features(
        {"image": datasets.Image(mode="RGB"), "label": datasets.ClassLabel(names=list(class_names))}
    )

    def table(idx: np.ndarray) -> datasets.Dataset:
        order = np.sort(idx)
        return datasets.Dataset.from_dict(
            {"image": [images[i] for i in order], "label": labels[order].tolist()},
            features=features,
        )

    return table(train_idx), table(test_idx)
