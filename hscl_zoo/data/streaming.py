"""Streaming training data: a Hub dataset or a folder of parquet files read as a stream, sharded
over processes, shuffled per epoch, decoded and augmented in DataLoader workers, resumable mid-epoch.

Everything that reads and orders the data is ``datasets``' own streaming engine:

* :func:`open_stream` opens ``hf:owner/name`` (or a registered dataset's Hub id) with
  ``datasets.load_dataset(..., streaming=True)``, or a local folder of ``SPLIT-*.parquet`` files
  with ``load_dataset("parquet", data_files=..., streaming=True)``, and reshards a parquet
  stream by row group so that processes and workers each read their own part of the files;
* :class:`StreamingViews` shuffles it (``IterableDataset.shuffle(seed=, buffer_size=)``: the
  shard order, then a buffer of examples), selects the epoch with ``set_epoch`` (another order
  every epoch, the same for the same seed), keeps this process's part
  (``datasets.distributed.split_dataset_by_node``) and, in each DataLoader worker (``datasets``
  splits the process's shards over its workers), decodes the images and cuts the SimCLR views;
* :class:`StreamLoader` batches it and keeps the stream's *position*: how many examples each
  worker has handed to the training loop in the current epoch.

**Resuming.** ``IterableDataset.load_state_dict`` does not restore a shuffle buffer's content
(its docstring: "examples from shuffle buffers are lost when resuming"), so a run resumed from
it would skip the examples that sat in the buffer. The position is therefore a count per worker:
the epoch's order is a pure function of (seed, epoch, process, worker), so a resumed run rebuilds
the same stream and passes over the examples already used before decoding them (it reads their
bytes again, it does not decode or augment them), and sees every remaining example exactly once.

**Epochs.** The length of a stream may be unknown. An epoch is one pass over the split: it ends
when the first process runs out of full batches (all processes stop together, so they take the
same number of steps); with ``epoch_examples`` it ends after ``epoch_examples // batch_size``
steps at the latest, and the next epoch starts a new pass (a new order).
"""

from __future__ import annotations

import io
import itertools
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from datasets.distributed import split_dataset_by_node
from PIL import Image

from hscl_zoo.data.source_options import UNLABELLED
from hscl_zoo.data.transforms import ImageTransform

__all__ = ["StreamSource", "StreamingViews", "StreamLoader", "UnreadableImage", "open_stream", "parquet_rows"]

IMAGE_COLUMN_GUESSES = ("image", "img", "picture", "pixel_values")
LABEL_COLUMN_GUESSES = ("label", "labels", "fine_label", "target", "class", "category")
_SPLIT_PREFIX = re.compile(r"^([A-Za-z]+)(?:[-_.]|$)")


class UnreadableImage(ValueError):
    """An image of the stream does not decode (and ``skip_unreadable`` is off)."""


@dataclass(frozen=True)
class StreamSource:
    """An opened stream and what is known about it.

    Attributes:
        name: how the user named it (``parquet:PATH``, ``hf:owner/name``, ``cifar10``).
        stream: the ``datasets.IterableDataset`` of the split, images left undecoded.
        image_column: its column of images.
        label_column: its column of class labels, None for an unlabelled stream.
        rows: the split's number of examples when the files or the dataset's card say it, else None.
    """

    name: str
    stream: datasets.IterableDataset
    image_column: str
    label_column: str | None
    rows: int | None


def parquet_rows(files: list[Path]) -> int:
    """The number of rows of parquet files, read from their footers (no data is read)."""
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(str(f)).num_rows for f in files)


def _split_files(folder: Path, split: str) -> list[Path]:
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder; a parquet stream needs a folder of {split}-*.parquet files.")
    files = [p for p in sorted(folder.rglob("*.parquet")) if (m := _SPLIT_PREFIX.match(p.name)) and m.group(1) == split]
    if not files:
        raise ValueError(f"{folder} holds no {split}-*.parquet files; name them like {split}-00000-of-00001.parquet "
                         "or choose the split with train_split.")
    return files


def open_stream(
    source: str,
    *,
    split: str = "train",
    data_dir: str | os.PathLike[str] | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
    needs_labels: bool = False,
) -> StreamSource:
    """Open one split of ``source`` as a stream, images undecoded, and check its columns.

    ``source`` is ``parquet:PATH`` (or a folder path), ``hf:owner/name``, or a registered dataset
    (its Hub id, or its parquet files in ``data_dir``). Unset columns are guessed from the
    features. Raises ValueError, naming the fix, for a missing folder or split, an image column
    that holds no images, a label column that holds no integer classes, and a stream without a
    label column when ``needs_labels``.
    """
    kind, _, location = source.partition(":")
    rows: int | None = None
    if kind not in ("parquet", "hf") and Path(source).expanduser().is_dir():
        kind, location = "parquet", source
    if kind not in ("parquet", "hf"):
        from hscl_zoo.data.catalog import get_spec

        spec = get_spec(source)
        if spec.hub_id is None:
            raise ValueError(f"{source} is built in memory and cannot be streamed; stream a parquet folder or a Hub "
                             "dataset, or drop streaming.")
        kind, location = ("parquet", str(data_dir)) if data_dir is not None else ("hf", spec.hub_id)
        image_column = image_column or spec.image_column
        label_column = label_column or spec.label_column
    elif kind == "hf" and data_dir is not None:
        kind, location = "parquet", str(data_dir)
    if kind == "parquet":
        files = _split_files(Path(location).expanduser(), split)
        stream = datasets.load_dataset("parquet", data_files={split: [str(f) for f in files]}, split=split,
                                       streaming=True)
        rows = parquet_rows(files)
    else:
        from hscl_zoo.data.hub_reach import check_hub_dataset

        check_hub_dataset(source, location)
        stream = datasets.load_dataset(location, split=split, streaming=True)
        known = (stream.info.splits or {}).get(split)
        rows = known.num_examples if known is not None and known.num_examples else None
    image_column, label_column = _columns(source, stream.features, image_column, label_column, needs_labels)
    stream = stream.select_columns([c for c in (image_column, label_column) if c is not None])
    stream = stream.cast_column(image_column, datasets.Image(decode=False)).reshard()
    return StreamSource(source, stream, image_column, label_column, rows)


def _columns(source: str, features: datasets.Features | None, image_column: str | None, label_column: str | None,
             needs_labels: bool) -> tuple[str, str | None]:
    if features is None:
        raise ValueError(f"{source}: the stream does not declare its features; give a parquet folder or a Hub "
                         "dataset with a dataset card, or use the map-style path (drop streaming).")
    columns = list(features)
    for given, what in ((image_column, "image_column"), (label_column, "label_column")):
        if given is not None and given not in columns:
            raise ValueError(f"{source}: no column {given!r} ({what}); the columns are {columns}.")
    images = [c for c, f in features.items() if isinstance(f, datasets.Image)]
    image_column = image_column or next((c for c in images + list(IMAGE_COLUMN_GUESSES) if c in columns), None)
    if image_column is None:
        raise ValueError(f"{source}: cannot tell which column holds the images among {columns}; pass image_column=NAME.")
    feature = features[image_column]
    is_struct = isinstance(feature, dict) and "bytes" in feature
    if not (isinstance(feature, datasets.Image) or is_struct or getattr(feature, "dtype", None) == "binary"):
        raise ValueError(f"{source}: column {image_column!r} holds {_kind(feature)}, not images (an Image feature, "
                         "{bytes, path} structs or binary); pass image_column=NAME for the column of images.")
    label_column = label_column or next((c for c in LABEL_COLUMN_GUESSES if c in columns), None)
    if label_column is None:
        if needs_labels:
            raise ValueError(f"{source}: the stream has no label column (columns {columns}) and the objective needs "
                             "labels; pass label_column=NAME, or train an unlabelled method (ucl, hucl).")
        return image_column, None
    feature = features[label_column]
    if not (isinstance(feature, datasets.ClassLabel) or str(getattr(feature, "dtype", "")).startswith(("int", "uint"))):
        raise ValueError(f"{source}: label column {label_column!r} holds {_kind(feature)}, not integer classes; "
                         "cast it to a ClassLabel or integers, pass label_column=NAME, or (ucl, hucl) leave it out.")
    return image_column, label_column


def _kind(feature: Any) -> str:
    return getattr(feature, "dtype", None) or type(feature).__name__


class StreamingViews(torch.utils.data.IterableDataset):
    """This process's part of a stream as V augmented views per example, for a DataLoader.

    Each item is a dict: ``views`` (V, 3, H, W), ``label`` (-1 without a label column),
    ``index`` (an id unique within the epoch over all processes, for same-image positives),
    ``worker`` and ``count`` (the item's place in its worker's stream: the position), ``skipped``
    (the worker's unreadable images so far) and ``key`` (the image's path, for checks).

    The augmentation of an item is seeded by (seed, epoch, rank, worker, count), so a resumed
    epoch makes the views the uninterrupted one would have made.
    """

    def __init__(self, source: StreamSource, transform: ImageTransform, *, views: int = 2, seed: int = 0,
                 buffer_size: int = 1000, rank: int = 0, world_size: int = 1, skip_unreadable: bool = False) -> None:
        if views < 1:
            raise ValueError(f"views must be a positive integer, got {views!r}")
        if buffer_size < 0:
            raise ValueError(f"buffer_size={buffer_size} must be >= 0 (0: shuffle the shard order only).")
        self.source = source
        self.transform = transform
        self.views = views
        self.seed = int(seed)
        self.buffer_size = int(buffer_size)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.skip_unreadable = skip_unreadable
        self.epoch = 0
        self.skip: list[int] = []
        self.skipped_before: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (its order and views); a new epoch starts at its beginning."""
        self.epoch = int(epoch)

    def part(self) -> datasets.IterableDataset:
        """This process's part of the epoch's shuffled stream (images undecoded)."""
        stream = self.source.stream
        if self.buffer_size:
            stream = stream.shuffle(seed=self.seed, buffer_size=self.buffer_size)
        else:
            stream = stream.shuffle(seed=self.seed, buffer_size=1)
        stream = split_dataset_by_node(stream, rank=self.rank, world_size=self.world_size)
        stream.set_epoch(self.epoch)
        return stream

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        start = self.skip[worker] if worker < len(self.skip) else 0
        skipped = self.skipped_before[worker] if worker < len(self.skipped_before) else 0
        image_column, label_column = self.source.image_column, self.source.label_column
        for count, row in enumerate(itertools.islice(self.part(), start, None), start=start):
            image = self._decode(row[image_column], count, worker)
            if image is None:
                skipped += 1
                continue
            label = int(row[label_column]) if label_column is not None and row[label_column] is not None else UNLABELLED
            yield {"views": self._views(image, worker, count), "label": label,
                   "index": (count * workers + worker) * self.world_size + self.rank,
                   "worker": worker, "count": count, "skipped": skipped, "key": _key(row[image_column])}

    def _decode(self, value: Any, count: int, worker: int) -> Image.Image | None:
        try:
            if isinstance(value, dict):
                data = value.get("bytes")
                image = Image.open(io.BytesIO(data) if data is not None else value["path"])
            else:
                image = Image.open(io.BytesIO(value))
            return image.convert("RGB")
        except Exception as error:  # noqa: BLE001 - any decoding failure is an unreadable image
            if self.skip_unreadable:
                return None
            raise UnreadableImage(
                f"{self.source.name}: example {count} of worker {worker} of process {self.rank} in epoch {self.epoch} "
                f"({_key(value) or 'no path'}) cannot be decoded ({type(error).__name__}); fix or remove it, or pass "
                "--skip_unreadable true to leave unreadable images out.") from None

    def _views(self, image: Image.Image, worker: int, count: int) -> torch.Tensor:
        sequence = np.random.SeedSequence([self.seed, self.epoch, self.rank, worker, count])
        saved = torch.random.get_rng_state()
        torch.manual_seed(int(sequence.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1)))
        try:
            return torch.stack([self.transform(image) for _ in range(self.views)])
        finally:
            torch.random.set_rng_state(saved)


def _key(value: Any) -> str:
    return (value.get("path") or "") if isinstance(value, dict) else ""


AllHave = Callable[[bool], bool]
"""Given whether this process has a batch, whether every process has one (a collective call)."""


class StreamLoader:
    """Batches of a :class:`StreamingViews` as ``(views, labels, index)``, and the stream's position.

    ``all_have`` keeps processes in step: each batch is yielded only when every process has one
    (pass a function that all-reduces the flag; None for one process). ``max_steps`` caps an
    epoch. ``state_dict()`` is the position after the batches yielded so far; ``load_state_dict``
    makes the next pass resume there. Raises ValueError when an epoch yields no batch (a stream
    shorter than one batch per process) and a one-line ValueError for an unreadable image.
    """

    def __init__(self, dataset: StreamingViews, batch_size: int, *, num_workers: int = 0,
                 all_have: AllHave | None = None, max_steps: int | None = None, pin_memory: bool = False) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.num_workers = int(num_workers)
        self.all_have = all_have
        self.max_steps = max_steps
        self.pin_memory = pin_memory
        self.consumed = [0] * max(1, self.num_workers)
        self.skipped = [0] * max(1, self.num_workers)
        self.steps = 0
        self.epoch_unreadable = 0
        self.keys: list[str] = []
        rows = dataset.source.rows
        if rows is not None and rows // dataset.world_size < batch_size:
            raise ValueError(f"{dataset.source.name}: {rows} examples make {rows // dataset.world_size} per process, "
                             f"fewer than one batch of {batch_size} per process; lower batch_size or use fewer processes.")

    @property
    def epoch(self) -> int:
        return self.dataset.epoch

    def __len__(self) -> int:
        """Steps in an epoch where the split's length is known: at most its rows over the processes'
        batches (a process whose shard runs out first ends the epoch sooner), or ``max_steps``.
        TypeError for a stream of unknown length without ``max_steps``."""
        rows = self.dataset.source.rows
        full = rows // (self.batch_size * self.dataset.world_size) if rows is not None else None
        if self.max_steps is not None:
            return self.max_steps if full is None else min(self.max_steps, full)
        if full is None:
            raise TypeError(f"{self.dataset.source.name}: a stream of unknown length has no len()")
        return full

    @property
    def unreadable(self) -> int:
        """Unreadable images left out so far in the current epoch (with ``skip_unreadable``)."""
        return sum(self.skipped)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` at its beginning, unless it is the epoch a loaded position is in."""
        if int(epoch) != self.dataset.epoch:
            self.consumed = [0] * len(self.consumed)
            self.skipped = [0] * len(self.skipped)
            self.steps = 0
        self.dataset.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The position: the epoch, its steps done and the examples each worker has handed over in it."""
        d = self.dataset
        return {"epoch": d.epoch, "steps": self.steps, "consumed": list(self.consumed), "skipped": list(self.skipped), "seed": d.seed,
                "buffer_size": d.buffer_size, "world_size": d.world_size, "num_workers": self.num_workers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state``'s position; the layout (processes, workers, seed, buffer) must match."""
        mine = self.state_dict()
        differ = [k for k in ("seed", "buffer_size", "world_size", "num_workers") if state.get(k) != mine[k]]
        if differ:
            saved = ", ".join(f"{k} {state.get(k)}" for k in differ)
            raise ValueError(f"the stream position was saved with {saved}; resume with the same settings (now "
                             f"{', '.join(f'{k} {mine[k]}' for k in differ)}) or start the run again.")
        self.dataset.set_epoch(state["epoch"])
        self.consumed = [int(c) for c in state["consumed"]]
        self.skipped = [int(s) for s in state["skipped"]]
        self.steps = int(state["steps"])

    def _loader(self) -> torch.utils.data.DataLoader:
        self.dataset.skip = list(self.consumed)
        self.dataset.skipped_before = list(self.skipped)
        return torch.utils.data.DataLoader(self.dataset, batch_size=self.batch_size, num_workers=self.num_workers,
                                           drop_last=True, pin_memory=self.pin_memory)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        steps = 0
        batches = iter(self._loader())
        while self.max_steps is None or self.steps < self.max_steps:
            try:
                batch = next(batches, None)
            except UnreadableImage as error:  # a worker's arrives with its traceback in the message
                raise UnreadableImage(str(error).strip().splitlines()[-1].split("UnreadableImage: ")[-1]) from None
            have = batch is not None
            if self.all_have is not None:
                have = self.all_have(have)
            if not have:
                break
            for worker, count, skipped in zip(batch["worker"].tolist(), batch["count"].tolist(), batch["skipped"].tolist()):
                self.consumed[worker] = max(self.consumed[worker], count + 1)
                self.skipped[worker] = max(self.skipped[worker], skipped)
            self.keys = list(batch["key"])
            self.steps += 1
            steps += 1
            yield batch["views"], batch["label"], batch["index"]
        if steps == 0 and self.steps == 0:
            raise ValueError(f"{self.dataset.source.name}: epoch {self.epoch} gave no full batch of {self.batch_size} "
                             "per process (the stream is shorter than one batch per process, or a worker's part is); "
                             "lower batch_size or num_workers, or use fewer processes.")
        self.epoch_unreadable = self.unreadable
        self.set_epoch(self.epoch + 1)
