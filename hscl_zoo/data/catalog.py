"""The dataset table: one `DatasetSpec` per dataset, read by loading, training, the zoo and the cards.

A spec says where a dataset comes from (a Hugging Face Hub id, or a function that builds it),
how its columns map to the internal ``image``/``label`` form, and what every other module needs
to know: display name, classes, native resolution, normalisation statistics. Adding a dataset
is one `register_dataset(DatasetSpec(...))`; your own images, parquet files or Hub dataset are
one `register_dataset(source_spec("imagefolder:/data/pets", name="pets"))`
(:mod:`hscl_zoo.data.sources`).
"""

from __future__ import annotations

from hscl_zoo._table import NamedTable
from hscl_zoo.data.digits import DIGITS_IMAGE_SIZE, digits_tables
from hscl_zoo.data.spec import DatasetSpec

__all__ = ["DatasetSpec", "DATASETS", "register_dataset", "get_spec"]

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
    crops_and_flips_keep_class=False,
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
