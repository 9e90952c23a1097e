"""The dataset table: one `DatasetSpec` per dataset, read by loading, training, the zoo and the cards.

A spec says where a dataset comes from (a Hugging Face Hub id, or a function that builds it),
how its columns map to the internal ``image``/``label`` form, and what every other module needs
to know: display name, classes, native resolution, normalisation statistics. Adding a dataset
is one `register_dataset(DatasetSpec(...))`; your own images, parquet files or Hub dataset are
one `register_dataset(source_spec("imagefolder:/data/pets", name="pets"))`
(:mod:`hscl_zoo.data.sources`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hscl_zoo._table import NamedTable
from hscl_zoo.data.digits import DIGITS_IMAGE_SIZE, digits_tables

if TYPE_CHECKING:
    import datasets

__all__ = ["DatasetSpec", "DATASETS", "register_dataset", "get_spec"]

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


DATASETS: NamedTable[DatasetSpec] = NamedTable("dataset", DatasetSpec)
"""Every registered dataset by name (read-only; see `register_dataset`)."""


def register_dataset(spec: DatasetSpec, *, replace: bool = False) -> DatasetSpec:
    """Add a dataset to the table, so `load_splits`, the pretraining recipe and the cards know it.

    A name that is taken is refused unless ``replace=True``. Returns the spec.
    """
    return DATASETS.register(spec, replace=replace)


def get_spec(name: str) -> DatasetSpec:
    """Return the registered spec for ``name``; a ValueError lists the known names otherwise."""
    try:
        return DATASETS[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(DATASETS))
        raise ValueError(f"unknown dataset {name!r}; known datasets: {known}") from None


def _hub(name: str, display: str, hub_id: str, columns: tuple[str, str], num_classes: int, image_size: int,
         mean: tuple[float, float, float], std: tuple[float, float, float], *, test_split: str = "test",
         names: tuple[str, ...] = ()) -> DatasetSpec:
    return DatasetSpec(name=name, hub_id=hub_id, image_column=columns[0], label_column=columns[1],
                       train_split="train", test_split=test_split, num_classes=num_classes, image_size=image_size,
                       mean=mean, std=std, fallback_class_names=names, display=display)


register_dataset(DatasetSpec(
    name="digits",
    hub_id=None,
    image_column="image",
    label_column="label",
    train_split="train",
    test_split="test",
    num_classes=10,
    image_size=DIGITS_IMAGE_SIZE,
    mean=(0.3054, 0.3054, 0.3054),
    std=(0.3187, 0.3187, 0.3187),
    class_names_source="scikit-learn load_digits target (digit as text)",
    fallback_class_names=tuple(str(d) for d in range(10)),
    builder=digits_tables,
))
register_dataset(_hub(
    "cifar10", "CIFAR-10", "uoft-cs/cifar10", ("img", "label"), 10, 32, (0.4914, 0.4822, 0.4465),
    (0.2470, 0.2435, 0.2616),
    names=("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
))
register_dataset(_hub(
    "cifar100", "CIFAR-100", "uoft-cs/cifar100", ("img", "fine_label"), 100, 32, (0.5071, 0.4865, 0.4409),
    (0.2673, 0.2564, 0.2762),
))
register_dataset(_hub(
    "cifar100-coarse", "CIFAR-100 (20 superclasses)", "uoft-cs/cifar100", ("img", "coarse_label"), 20, 32,
    (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762),
))
register_dataset(_hub(
    "stl10", "STL-10", "tanganke/stl10", ("image", "label"), 10, 96, (0.4467, 0.4398, 0.4066),
    (0.2603, 0.2566, 0.2713),
    names=("airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"),
))
register_dataset(_hub(
    "tinyimagenet", "Tiny ImageNet", "zh-plus/tiny-imagenet", ("image", "label"), 200, 64,
    (0.4802, 0.4481, 0.3975), (0.2770, 0.2691, 0.2821), test_split="valid",
))
