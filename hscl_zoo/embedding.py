"""Encoding a folder of images, or a dataset split, to a table of features (``hscl-zoo embed``).

Images go through the model's own eval preprocessing (``model.transform``) in batches, with a
progress bar, through the same loop the linear probe uses
(:func:`hscl_zoo.evaluation.extract_features`). Results are written as

* ``.npy``: the (N, D) float32 array, plus ``<name>.ids.csv`` beside it naming each row
  (``file``: the path relative to the folder; or ``row`` and ``label`` for a dataset split);
* ``.parquet``: one table with the same id columns and an ``embedding`` column
  (fixed-size list of float32), readable by pandas, polars and ``datasets``.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch

from hscl_zoo.data import DATASETS, load_splits
from hscl_zoo.data.sources import IMAGE_EXTENSIONS, is_source
from hscl_zoo.features import extract_features
from hscl_zoo.models import ContrastiveEncoder

__all__ = ["IMAGE_EXTENSIONS", "EMBEDDING_FORMATS", "Embeddings", "image_files", "check_output_path", "embed",
           "save_embeddings"]

EMBEDDING_FORMATS = (".npy", ".parquet")


@dataclass
class Embeddings:
    """Features of N images in a fixed order, with what identifies each row.

    ``ids`` are file paths relative to the folder (``id_column == "file"``) or row indices of a
    dataset split (``id_column == "row"``, with ``labels``).
    """

    features: np.ndarray
    ids: list[str] | list[int]
    id_column: str
    labels: np.ndarray | None = None


def image_files(folder: str | os.PathLike[str]) -> list[Path]:
    """Image files under ``folder`` (recursively, by extension, case-insensitive), sorted.

    Raises ``FileNotFoundError`` for a missing folder and ``ValueError`` for one without images.
    """
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder of images.")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    if not files:
        raise ValueError(f"{root} holds no image files (looked recursively for {', '.join(IMAGE_EXTENSIONS)}); "
                         "point at the folder that contains the images.")
    return files


def _readable(files: list[Path], root: Path) -> list[Path]:
    """The files that decode as images; prints how many were left out and which."""
    from PIL import Image

    readable, skipped = [], []
    for file in files:
        try:
            with Image.open(file) as image:
                image.convert("RGB")
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
            skipped.append(f"{file.relative_to(root).as_posix()} ({type(error).__name__})")
            continue
        readable.append(file)
    if skipped:
        print(f"{root}: skipped {len(skipped)} unreadable image(s): {', '.join(skipped[:5])}"
              + (" ..." if len(skipped) > 5 else ""))
    if not readable:
        raise ValueError(f"{root}: none of its {len(files)} image files can be decoded.")
    return readable


def _folder_table(files: list[Path]) -> datasets.Dataset:
    features = datasets.Features({"image": datasets.Image(mode="RGB"), "label": datasets.Value("int64")})
    return datasets.Dataset.from_dict({"image": [str(f) for f in files], "label": [0] * len(files)},
                                      features=features)


def check_output_path(out: str | os.PathLike[str]) -> Path:
    """The output path, if its suffix names a format in :data:`EMBEDDING_FORMATS`."""
    path = Path(out).expanduser()
    if path.suffix.lower() not in EMBEDDING_FORMATS:
        raise ValueError(f"cannot write embeddings to {path}: the file name must end in one of "
                         f"{', '.join(EMBEDDING_FORMATS)}.")
    return path


def embed(
    model: ContrastiveEncoder,
    images: str | os.PathLike[str],
    *,
    projection: bool = False,
    split: str = "test",
    data_dir: str | os.PathLike[str] | None = None,
    batch_size: int = 256,
    num_workers: int = 0,
    device: str | torch.device | None = None,
    progress: bool = True,
    **source_options: Any,
) -> Embeddings:
    """Encode a folder of image files (recursively) or one split of a zoo dataset.

    ``images`` is a folder, a dataset name of ``hscl_zoo.data.DATASETS`` or own data
    (``imagefolder:PATH``, ``parquet:PATH``, ``hf:owner/name``, with ``source_options``), of
    which ``split`` ``"train"`` or ``"test"`` is encoded (``data_dir`` as in ``load_splits``).
    Features are ``model.encode``,
    or the L2-normalised 128-d ``model.project`` with ``projection=True``. An unreadable image is
    a ``ValueError`` naming it, unless ``skip_unreadable=True`` leaves it out (of a folder too).
    """
    encode = model.project if projection else model.encode
    path = Path(images).expanduser()
    if path.is_dir():
        files = image_files(path)
        if source_options.get("skip_unreadable"):
            files = _readable(files, path)
        try:
            features, _ = extract_features(encode, _folder_table(files), model.transform, batch_size=batch_size,
                                           device=device, num_workers=num_workers, progress=progress)
        except OSError as error:
            raise ValueError(f"cannot read an image under {path}: {error}. Fix or remove that file, or leave "
                             "unreadable images out: --skip_unreadable on the command line, skip_unreadable=True "
                             "in Python.") from error
        return Embeddings(features.numpy(), [f.relative_to(path).as_posix() for f in files], "file")
    if str(images) not in DATASETS and not is_source(str(images)):
        raise FileNotFoundError(f"{images!r} is neither a folder nor a dataset name; give a folder of images, one "
                                f"of {', '.join(sorted(DATASETS))}, or imagefolder:PATH, parquet:PATH, hf:owner/name.")
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}.")
    data = load_splits(str(images), data_dir, **source_options)
    table = data.train if split == "train" else data.test
    features, labels = extract_features(encode, table, model.transform, batch_size=batch_size, device=device,
                                        num_workers=num_workers, progress=progress)
    return Embeddings(features.numpy(), list(range(len(table))), "row", labels.numpy())


def save_embeddings(embeddings: Embeddings, out: str | os.PathLike[str]) -> list[Path]:
    """Write ``embeddings`` as ``.npy`` (+ ``.ids.csv``) or ``.parquet`` (see the module docstring);
    returns the files written."""
    path = check_output_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns: dict[str, list] = {embeddings.id_column: list(embeddings.ids)}
    if embeddings.labels is not None:
        columns["label"] = embeddings.labels.tolist()
    features = np.ascontiguousarray(embeddings.features, dtype=np.float32)
    if path.suffix.lower() == ".npy":
        np.save(path, features)
        ids_path = path.with_suffix(".ids.csv")
        with ids_path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(list(columns))
            writer.writerows(zip(*columns.values()))
        return [path, ids_path]
    import pyarrow as pa
    import pyarrow.parquet as pq

    flat = pa.array(features.reshape(-1), type=pa.float32())
    table = pa.table({**columns, "embedding": pa.FixedSizeListArray.from_arrays(flat, features.shape[1])})
    pq.write_table(table, path)
    return [path]
