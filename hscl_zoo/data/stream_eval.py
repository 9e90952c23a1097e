"""What a streamed run evaluates on, without reading its training split into a table.

A run that streams its training split (`hscl_zoo.data.streaming`) still needs labelled images in
memory for the per-epoch kNN monitor and the final linear probe and kNN. :func:`stream_eval_data`
reads them from streams too: ``examples`` training examples drawn class-balanced from the shuffled
stream (a split stored sorted by class still gives every class its share), and the whole test
split, which is small next to the training split. Both become tables
in the internal form (``image``, ``label``), so evaluation runs as it does for any run.
"""

from __future__ import annotations

import itertools

import datasets

from hscl_zoo.data.catalog import get_spec
from hscl_zoo.data.datasets import INTERNAL_IMAGE, INTERNAL_LABEL, LoadedData
from hscl_zoo.data.source_options import UNLABELLED
from hscl_zoo.data.spec import DatasetSpec
from hscl_zoo.data.streaming import StreamSource, open_stream

__all__ = ["stream_eval_data", "stream_spec"]

SHUFFLE_BUFFER = 10_000
"""The largest shuffle buffer the evaluation sample is drawn through."""
READ_FACTOR = 10
"""The evaluation sample reads at most this many times its size in rows to fill every class's share."""


def stream_spec(source: str, *, image_size: int | None, mean: list | None, std: list | None) -> DatasetSpec:
    """The spec of a streamed dataset: a registered one's own, or for your own stream (``parquet:``,
    ``hf:``) one made of the run's `image_size`, `mean` and `std`, which a stream cannot measure
    without reading it whole. Raises ValueError naming the missing settings."""
    if ":" not in source:
        return get_spec(source)
    missing = [key for key, value in (("image_size", image_size), ("mean", mean), ("std", std)) if value is None]
    if missing:
        raise ValueError(f"{source}: a stream of your own data is not scanned for its image size and colour "
                         f"statistics; pass {', '.join(f'--{key}' for key in missing)} (for example --image_size 32 "
                         "--mean [0.5,0.5,0.5] --std [0.25,0.25,0.25]).")
    return DatasetSpec(name=source, hub_id=None, image_column="image", label_column="label", train_split="train",
                       test_split="test", num_classes=0, image_size=int(image_size), mean=tuple(mean), std=tuple(std),
                       builder=_read_as_stream)


def _read_as_stream(spec: DatasetSpec) -> tuple[datasets.Dataset, datasets.Dataset]:
    raise ValueError(f"{spec.name} is read as a stream (streaming=true): its tables are never built whole.")


def stream_eval_data(source: str, data_dir: str | None, *, examples: int, spec: DatasetSpec,
                     columns: dict[str, str | None], train_split: str | None = None,
                     test_split: str | None = None, seed: int = 0) -> LoadedData:
    """`examples` training examples (class-balanced, from the stream shuffled by `seed`) and the whole
    test split of `source`, read as streams, as :class:`LoadedData` (`columns`: the image and label
    columns, None to guess). Labels come from the training stream's ClassLabel names where it has
    them, else are named by number."""
    opened = {split: open_stream(source, split=split, data_dir=data_dir, image_column=columns.get("image_column"),
                                 label_column=columns.get("label_column"))
              for split in (train_split or spec.train_split, test_split or spec.test_split)}
    train, test = opened.values()
    names = _class_names(train)
    rows = [_balanced_rows(train, examples, len(names), seed), _rows(test, None)]
    seen = max((label for _, labels in rows for label in labels), default=-1)
    names = names or [str(i) for i in range(seen + 1)]
    features = datasets.Features({INTERNAL_IMAGE: datasets.Image(mode="RGB"),
                                  INTERNAL_LABEL: datasets.ClassLabel(names=names)})
    tables = [datasets.Dataset.from_dict({INTERNAL_IMAGE: images, INTERNAL_LABEL: labels}, features=features)
              for images, labels in rows]
    return LoadedData(train=tables[0], test=tables[1], class_names=names, spec=spec)


def _class_names(source: StreamSource) -> list[str]:
    feature = source.stream.features.get(source.label_column) if source.label_column else None
    return list(feature.names) if isinstance(feature, datasets.ClassLabel) else []


def _balanced_rows(source: StreamSource, examples: int, classes: int, seed: int) -> tuple[list, list[int]]:
    """Up to `examples` labelled examples of the shuffled stream, at most ``ceil(examples / classes)``
    of each class (a split stored sorted by class gives every class its share), reading at most
    `READ_FACTOR` times `examples` rows; without known classes, its first `examples` examples."""
    stream = source.stream.shuffle(seed=seed, buffer_size=min(examples, SHUFFLE_BUFFER))
    if not classes or source.label_column is None:
        return _rows(StreamSource(source.name, stream, source.image_column, source.label_column, source.rows), examples)
    quota, counts = -(-examples // classes), [0] * classes
    images, labels = [], []
    for row in itertools.islice(stream, READ_FACTOR * examples):
        label = row[source.label_column]
        if label is None or not 0 <= int(label) < classes or counts[int(label)] >= quota:
            continue
        counts[int(label)] += 1
        images.append(row[source.image_column])
        labels.append(int(label))
        if len(labels) >= examples or min(counts) >= quota:
            break
    return images, labels


def _rows(source: StreamSource, limit: int | None) -> tuple[list, list[int]]:
    """The undecoded images and the labels (-1 where none) of the stream's first `limit` examples (None: all)."""
    images, labels = [], []
    for row in itertools.islice(source.stream, limit):
        images.append(row[source.image_column])
        label = row[source.label_column] if source.label_column else None
        labels.append(UNLABELLED if label is None else int(label))
    return images, labels
