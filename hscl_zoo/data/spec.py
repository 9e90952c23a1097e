"""`DatasetSpec`: how one dataset is found and what its columns mean, the row type of the dataset
table (:mod:`hscl_zoo.data.catalog`). Kept apart from the table so that a dataset's builder (the
embedded digits) can take its spec without importing the table that registers it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import datasets

__all__ = ["DatasetSpec", "TableBuilder"]

TableBuilder = Callable[["DatasetSpec"], "tuple[datasets.Dataset, datasets.Dataset]"]
"""Builds the (train, test) tables of a dataset that has no Hub or parquet source."""


@dataclass(frozen=True)
class DatasetSpec:
    """How one dataset is found and what its columns mean.

    Attributes:
        name: registry name (``"cifar10"``).
        hub_id: Hugging Face dataset repo read by ``load_dataset`` when no ``data_dir`` is given
            (``None`` for a dataset built by `builder`, such as the embedded digits).
        image_column: column holding the image in the source (renamed to ``image``).
        label_column: column holding the class index in the source (renamed to ``label``).
        train_split: name of the training split; also the parquet file-name prefix in a data_dir.
        test_split: name of the held-out split used for evaluation (``valid`` for Tiny ImageNet).
        num_classes: number of classes of ``label_column`` (0 for an unlabelled dataset made by a
            builder, such as an image folder without class folders).
        image_size: side length in pixels of the stored images (the native size), used as the
            default training and evaluation resolution.
        mean: per-channel RGB mean of the training images in [0, 1], for normalisation.
        std: per-channel RGB standard deviation (over all pixels) of the training images.
        class_names_source: where :func:`load_splits` takes class names from; ``"ClassLabel"``
            means the label feature's names, used whenever the label column is a ClassLabel.
        fallback_class_names: names used when the label column is a plain integer column;
            empty means ``"0"``, ``"1"``, ...
        display: the name people use (``"CIFAR-10"``); defaults to `name`.
        builder: for a dataset without a Hub or parquet source, a function of the spec returning
            its (train, test) tables already in the internal form.
        crops_and_flips_keep_class: whether a random crop or a mirror image still shows its class
            (False for the 8x8 digits, where a flipped 2 is no digit and a crop cuts a 7 to a 1);
            fine-tuning's default augmentation is none where it does not.
    """

    name: str
    hub_id: str | None
    image_column: str
    label_column: str
    train_split: str
    test_split: str
    num_classes: int
    image_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    class_names_source: str = "ClassLabel"
    fallback_class_names: tuple[str, ...] = ()
    display: str = ""
    builder: TableBuilder | None = None
    crops_and_flips_keep_class: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a dataset name is a non-empty string, got {self.name!r}.")
        if (self.hub_id is None) == (self.builder is None):
            raise ValueError(f"{self.name}: give exactly one source, hub_id (a Hub dataset, or parquet files in a "
                             f"data_dir) or builder (a function making the tables); got hub_id={self.hub_id!r}, "
                             f"builder={self.builder!r}.")
        for key, least in (("num_classes", 0 if self.builder is not None else 1), ("image_size", 1)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{self.name}: {key} must be an integer >= {least}, got {value!r}.")
        if len(self.mean) != 3 or len(self.std) != 3 or any(s <= 0 for s in self.std):
            raise ValueError(f"{self.name}: mean and std need one value per RGB channel and std > 0, "
                             f"got mean={self.mean!r}, std={self.std!r}.")
        if self.fallback_class_names and len(self.fallback_class_names) != self.num_classes:
            raise ValueError(f"{self.name}: fallback_class_names lists {len(self.fallback_class_names)} names "
                             f"for {self.num_classes} classes.")
        if not self.display:
            object.__setattr__(self, "display", self.name)

    @property
    def native_size(self) -> int:
        """The stored images' side length in pixels (the same as `image_size`)."""
        return self.image_size
