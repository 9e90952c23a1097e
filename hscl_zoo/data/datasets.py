"""Datasets of the zoo, loaded into one internal form.

Every dataset, whatever its source (the Hugging Face Hub, a local folder of parquet files in the
Hub's layout, or the embedded scikit-learn digits), comes out of :func:`load_splits` as two
``datasets.Dataset`` tables with exactly two columns:

* ``image``: ``datasets.Image(mode="RGB")``, so every decoded row is a 3-channel PIL image
  (grayscale sources such as some Tiny ImageNet JPEGs are converted on decode);
* ``label``: ``datasets.ClassLabel`` with the class names, integer values in ``[0, num_classes)``.

Each source's own column names (``img``, ``fine_label``, ...) are mapped to that form by the
:class:`DatasetSpec` registered under the dataset's name in the dataset table
(:mod:`hscl_zoo.data.catalog`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from hscl_zoo.data.catalog import DatasetSpec, get_spec
from hscl_zoo.data.hub_reach import check_hub_dataset, unavailable
from hscl_zoo.data.sources import UNLABELLED, SourceOptions, is_source, source_spec

INTERNAL_IMAGE = "image"
INTERNAL_LABEL = "label"


@dataclass(frozen=True)
class LoadedData:
    """Train and test tables of one dataset in the internal form, with its names and spec.

    ``unlabelled`` counts the training rows with label -1 (images without a class, from an
    image folder's ``unlabelled/`` folder or a folder without class folders); they are for
    training only and never in ``test``.
    """

    train: datasets.Dataset
    test: datasets.Dataset
    class_names: list[str]
    spec: DatasetSpec
    unlabelled: int = 0

    def labelled(self) -> LoadedData:
        """The same data without the unlabelled training rows, for evaluation."""
        if not self.unlabelled:
            return self
        train = self.train.select(np.flatnonzero(label_array(self.train) != UNLABELLED).tolist())
        return LoadedData(train=train, test=self.test, class_names=self.class_names, spec=self.spec)


def require_internal_columns(dataset: datasets.Dataset, user: str) -> None:
    """Raise a ValueError naming `user` unless `dataset` has the internal `image` and `label` columns."""
    missing = [c for c in (INTERNAL_IMAGE, INTERNAL_LABEL) if c not in dataset.column_names]
    if missing:
        raise ValueError(
            f"{user} needs columns ['image', 'label'], missing {missing} (found {dataset.column_names}); "
            "load data with hscl_zoo.data.load_splits"
        )


def load_splits(
    name: str,
    data_dir: str | Path | None = None,
    *,
    subset: int | None = None,
    seed: int = 0,
    full_test: bool = False,
    **options: Any,
) -> LoadedData:
    """Load the train and test splits of dataset ``name`` in the internal form.

    Args:
        name: a registered dataset (``digits``, ``cifar10``, ``cifar100``, ``stl10``,
            ``tinyimagenet``, or one added with ``register_dataset``), or your own data:
            ``imagefolder:PATH``, ``parquet:PATH`` or ``hf:owner/name`` (see
            :mod:`hscl_zoo.data.sources`; with ``hf:``, ``data_dir`` is a local parquet copy).
        data_dir: a folder of parquet files in the Hub layout (searched recursively); a file
            belongs to a split when its name starts with the split name followed by ``-``, ``_``
            or ``.`` (``train-00000-of-00001.parquet``). ``None`` reads ``spec.hub_id`` with
            ``datasets.load_dataset`` (network or the local Hub cache). Not used by a dataset
            built by its spec's ``builder`` (``digits``).
        subset: if given, keep a class-balanced, seeded subset of this many train rows and the
            same fraction of the test rows (see :func:`balanced_subset`), for CPU-budget runs.
        seed: seed of the subset draw, and of the held-out split of a source without a test split.
        full_test: with ``subset``, keep the whole test split instead of the same fraction of it
            (a small training budget evaluated on the full test set).
        **options: for own data, the fields of :class:`hscl_zoo.data.sources.SourceOptions`
            (``image_column``, ``label_column``, ``train_split``, ``test_split``,
            ``test_fraction``, ``skip_unreadable``).

    Returns:
        :class:`LoadedData` with ``train``/``test`` tables (columns ``image`` and ``label``),
        the class names (from the label's ClassLabel feature when the source has one) and the
        spec.

    Raises:
        ValueError: unknown name, a data_dir that is missing, holds no parquet files for the
            expected splits, or lacks the expected columns, labels outside ``[0, num_classes)``,
            or a bad ``subset``.
    """
    try:
        source_options = SourceOptions(**options)
    except TypeError:
        raise ValueError(f"unknown option(s) {sorted(options)}; own data sources take "
                         f"{list(SourceOptions.__dataclass_fields__)}.") from None
    if is_source(name):
        spec = source_spec(name, data_dir=data_dir, seed=seed, options=source_options)
        data_dir = None
    else:
        spec = get_spec(name)
        if source_options.non_default():
            raise ValueError(f"{sorted(source_options.non_default())} apply to own data (imagefolder:, parquet:, hf:), "
                             f"not to the registered dataset {name!r}; drop them.")
    if subset is not None:
        _check_positive_int(subset, "subset")
    if spec.builder is not None:
        if data_dir is not None:
            raise ValueError(
                f"the {spec.name} dataset is built in memory by its spec's builder; "
                f"call load_splits({spec.name!r}) without data_dir"
            )
        train, test = spec.builder(spec)
        require_internal_columns(train, f"the {spec.name} builder's output")
    else:
        train = load_split(name, spec.train_split, data_dir)
        test = load_split(name, spec.test_split, data_dir)
    class_names = list(train.features[INTERNAL_LABEL].names)
    if subset is not None:
        if not full_test and len(test):
            test = balanced_subset(test, _proportional_test_size(subset, len(train), len(test)), seed=seed)
        train = balanced_subset(train, subset, seed=seed)
    unlabelled = int(np.sum(label_array(train) == UNLABELLED))
    return LoadedData(train=train, test=test, class_names=class_names, spec=spec, unlabelled=unlabelled)


def load_split(name: str, split: str, data_dir: str | Path | None = None) -> datasets.Dataset:
    """Load one split of a Hub-backed dataset in the internal form (see :func:`load_splits`).

    Useful when only one split is needed, e.g. evaluating on Tiny ImageNet's ``valid`` split
    without reading its 100,000 training images.
    """
    spec = get_spec(name)
    if spec.hub_id is None:
        raise ValueError(f"{name!r} has no Hub or parquet source; use load_splits({name!r})")
    expected_splits = (spec.train_split, spec.test_split)
    if split not in expected_splits:
        raise ValueError(
            f"{name!r} has splits {list(expected_splits)}; got split {split!r}"
        )
    if data_dir is not None:
        files = _parquet_files_by_split(Path(data_dir), spec)
        raw = datasets.load_dataset(
            "parquet", data_files={split: [str(f) for f in files[split]]}, split=split
        )
    else:
        raw = _load_from_hub(spec, split)
    return to_internal(raw, spec, source=str(data_dir) if data_dir is not None else spec.hub_id)


def to_internal(raw: datasets.Dataset, spec: DatasetSpec, *, source: str = "") -> datasets.Dataset:
    """Rename ``spec``'s columns to ``image``/``label``, drop the others, decode images as RGB.

    A source already in the internal form (``image``/``label``) is accepted too. A label column
    that is a plain integer column is cast to a ClassLabel with ``spec``'s fallback names.
    """
    image_col = _pick_column(raw, (spec.image_column, INTERNAL_IMAGE))
    label_col = _pick_column(raw, (spec.label_column, INTERNAL_LABEL))
    if image_col is None or label_col is None:
        expected = [spec.image_column, spec.label_column]
        if expected != [INTERNAL_IMAGE, INTERNAL_LABEL]:
            expected_text = f"{expected} (or {[INTERNAL_IMAGE, INTERNAL_LABEL]})"
        else:
            expected_text = str(expected)
        where = f" in {source}" if source else ""
        raise ValueError(
            f"{spec.name}: expected columns {expected_text}{where}, found columns "
            f"{raw.column_names}; rename the columns or pick the dataset name whose layout "
            f"matches these files"
        )
    ds = raw.select_columns([image_col, label_col])
    if image_col != INTERNAL_IMAGE:
        ds = ds.rename_column(image_col, INTERNAL_IMAGE)
    if label_col != INTERNAL_LABEL:
        ds = ds.rename_column(label_col, INTERNAL_LABEL)
    ds = ds.cast_column(INTERNAL_IMAGE, datasets.Image(mode="RGB"))
    return _as_class_label(ds, spec, source)


def balanced_subset(ds: datasets.Dataset, size: int, *, seed: int = 0) -> datasets.Dataset:
    """Return a seeded subset of ``size`` rows with as equal a count per class as possible.

    Each class contributes ``size // C`` rows (C = classes present), the remainder goes to a
    seeded random choice of classes, and a class with too few rows gives all it has while the
    shortfall is spread over the others. Rows keep their original order.
    """
    _check_positive_int(size, "subset")
    if size > len(ds):
        raise ValueError(
            f"subset={size} is larger than the split ({len(ds)} rows); "
            f"pass subset <= {len(ds)} or subset=None for all rows"
        )
    labels = label_array(ds)
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    pools = {c: rng.permutation(np.flatnonzero(labels == c)) for c in classes}
    quota = _balanced_quota({c: len(p) for c, p in pools.items()}, size, rng)
    chosen = np.concatenate([pools[c][: quota[c]] for c in classes])
    return ds.select(np.sort(chosen).tolist())


def label_array(ds: datasets.Dataset) -> np.ndarray:
    """The ``label`` column of an internal-form table as an int64 numpy array."""
    return np.asarray(ds.select_columns([INTERNAL_LABEL])[INTERNAL_LABEL], dtype=np.int64)


def _balanced_quota(
    available: dict[int, int], size: int, rng: np.random.Generator
) -> dict[int, int]:
    quota: dict[int, int] = {}
    remaining = size
    by_size = sorted(available, key=lambda c: available[c])
    for position, c in enumerate(by_size):
        share = remaining // (len(by_size) - position)
        if available[c] > share:
            rest = by_size[position:]
            extra = remaining - share * len(rest)
            lucky = set(rng.permutation(rest)[:extra].tolist())
            quota.update({r: share + (r in lucky) for r in rest})
            return quota
        quota[c] = available[c]
        remaining -= available[c]
    return quota


def _check_positive_int(value: object, name: str) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _proportional_test_size(subset: int, n_train: int, n_test: int) -> int:
    return max(1, min(n_test, round(subset * n_test / n_train)))


def _pick_column(ds: datasets.Dataset, candidates: tuple[str, ...]) -> str | None:
    return next((c for c in candidates if c in ds.column_names), None)


def _as_class_label(ds: datasets.Dataset, spec: DatasetSpec, source: str) -> datasets.Dataset:
    feature = ds.features[INTERNAL_LABEL]
    where = f" in {source}" if source else ""
    if isinstance(feature, datasets.ClassLabel):
        if feature.num_classes != spec.num_classes:
            raise ValueError(
                f"{spec.name}: the label column{where} is a ClassLabel with "
                f"{feature.num_classes} classes, expected {spec.num_classes}; "
                f"these files are not {spec.name}"
            )
        return ds
    labels = label_array(ds)
    if labels.size and (labels.min() < 0 or labels.max() >= spec.num_classes):
        raise ValueError(
            f"{spec.name}: labels{where} range over [{labels.min()}, {labels.max()}], expected "
            f"integers in [0, {spec.num_classes - 1}]"
        )
    names = list(spec.fallback_class_names) or [str(i) for i in range(spec.num_classes)]
    return ds.cast_column(INTERNAL_LABEL, datasets.ClassLabel(names=names))


_SPLIT_PREFIX = re.compile(r"^([A-Za-z]+)(?:[-_.]|$)")


def _parquet_files_by_split(data_dir: Path, spec: DatasetSpec) -> dict[str, list[Path]]:
    if not data_dir.is_dir():
        raise ValueError(
            f"data_dir {str(data_dir)!r} is not a folder; pass the folder holding "
            f"{spec.train_split}-*.parquet and {spec.test_split}-*.parquet for {spec.name}"
        )
    found: dict[str, list[Path]] = {}
    for path in sorted(data_dir.rglob("*.parquet")):
        match = _SPLIT_PREFIX.match(path.name)
        key = match.group(1) if match else path.name
        found.setdefault(key, []).append(path)
    expected = [spec.train_split, spec.test_split]
    missing = [s for s in expected if s not in found]
    if missing:
        raise ValueError(
            f"{spec.name}: data_dir {str(data_dir)!r} has parquet files for splits "
            f"{sorted(found)}, expected splits {expected} (missing {missing}); files must be "
            f"named like '{spec.train_split}-00000-of-00001.parquet' and "
            f"'{spec.test_split}-00000-of-00001.parquet'"
        )
    return found


def _load_from_hub(spec: DatasetSpec, split: str) -> datasets.Dataset:
    assert spec.hub_id is not None
    check_hub_dataset(spec.name, spec.hub_id)
    try:
        return datasets.load_dataset(spec.hub_id, split=split)
    except (ConnectionError, OSError) as err:
        raise unavailable(spec.name, spec.hub_id, f"split {split!r} is neither reachable nor in the local cache "
                          f"({' '.join(str(err).split())[:200]})") from err
