"""Your own data: a folder of images, a folder of parquet files, or any Hub dataset, as a zoo dataset.

A *source* is a dataset name with a prefix, accepted wherever a built-in name is
(``load_splits``, the recipe's ``dataset`` key, ``hscl-zoo eval --dataset``, ``hscl-zoo embed``):

* ``imagefolder:PATH``: one subfolder per class (class names are the folder names, sorted).
  ``train/`` and ``test/`` (or ``val/``, ``valid/``, ``validation/``) subfolders, if present,
  are the splits; otherwise a seeded, stratified ``test_fraction`` of each class is held out.
  A folder of images without class subfolders is *unlabelled* (label -1, no test split), and an
  ``unlabelled/`` folder beside the class folders adds label -1 images to the training split
  only. Images of any size and mode are decoded to RGB.
* ``parquet:PATH``: a folder of parquet files, split by file-name prefix (``train-*.parquet``,
  ``test-*.parquet``), with an image column (``{"bytes", "path"}`` structs or an ``Image``
  feature) and optionally a label column (ClassLabel, integers or strings).
* ``hf:owner/name``: a Hub dataset read by ``datasets.load_dataset`` (network or the local cache);
  with ``data_dir``, its parquet files from that folder instead.

For tables, ``image_column``, ``label_column``, ``train_split`` and ``test_split`` choose the
columns and splits; unset ones are guessed from the features and the guess is printed. One pass
over every image (with a progress bar) checks that each decodes, and measures on the training
split the per-channel mean/std and the median shorter side (the default image size); the result
is cached per dataset fingerprint under ``$HSCL_ZOO_CACHE`` (default ``~/.cache/hscl_zoo``).
:func:`source_spec` turns a source into a `DatasetSpec`, which ``register_dataset`` keeps under
a short name.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from PIL import Image, UnidentifiedImageError
from tqdm.auto import tqdm

from hscl_zoo.data.catalog import DatasetSpec
from hscl_zoo.data.source_options import SOURCE_KEYS, SOURCE_PREFIXES, UNLABELLED, SourceOptions, is_source, source_options
from hscl_zoo.data.hub_reach import check_hub_dataset, unavailable

__all__ = ["IMAGE_EXTENSIONS", "SOURCE_PREFIXES", "SOURCE_KEYS", "UNLABELLED", "UNLABELLED_FOLDER", "SourceOptions", "cache_dir",
           "is_source", "source_options", "source_spec"]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
UNLABELLED_FOLDER = "unlabelled"
TEST_FOLDERS = ("test", "val", "valid", "validation")
LABEL_COLUMN_GUESSES = ("label", "labels", "fine_label", "target", "class", "category")
IMAGE_COLUMN_GUESSES = ("image", "img", "picture", "pixel_values")


@dataclass(frozen=True)
class _Scan:
    """What one pass over the images found."""

    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    image_size: int
    unreadable: dict[str, list[int]]
    unreadable_names: list[str]


def source_spec(
    source: str,
    *,
    name: str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    options: SourceOptions | None = None,
    progress: bool = True,
) -> DatasetSpec:
    """Read ``source`` (see the module docstring) into a `DatasetSpec` whose builder returns its
    (train, test) tables in the internal form; ``register_dataset(source_spec(..., name="pets"))``
    makes it loadable as ``"pets"``.

    ``seed`` draws the stratified test split (when the source has none). The spec's mean/std and
    image size are measured on the training split. Raises ValueError, naming the problem and the
    fix, for an empty folder, a class without images, an unreadable image (unless
    ``skip_unreadable``), a missing column or split, and labels out of range.
    """
    if not is_source(source):
        raise ValueError(f"{source!r} is not an own data source; use imagefolder:PATH, parquet:PATH or "
                         "hf:owner/name.")
    options = options or SourceOptions()
    kind, _, location = source.partition(":")
    if not location:
        raise ValueError(f"{source!r} names no {'folder' if kind != 'hf' else 'dataset'} after '{kind}:'.")
    if kind == "imagefolder":
        if any(getattr(options, k) is not None for k in ("image_column", "label_column", "train_split",
                                                          "test_split")):
            raise ValueError(f"{source}: image_column, label_column, train_split and test_split apply to parquet: and "
                             "hf: sources; an image folder's classes are its subfolders.")
        train, test, names, test_name = _image_folder(Path(location).expanduser(), options, seed)
        identity = _folder_identity(train, test)
    else:
        raw = _read_tables(kind, location, data_dir)
        train, test, names, test_name = _from_tables(source, raw, options, seed)
        identity = f"{train._fingerprint}/{test._fingerprint}"
    scan = _scan(source, {"train": train, "test": test}, identity, progress)
    if scan.unreadable_names:
        listed = ", ".join(scan.unreadable_names[:5]) + (" ..." if len(scan.unreadable_names) > 5 else "")
        if not options.skip_unreadable:
            raise ValueError(f"{source}: {len(scan.unreadable_names)} image(s) cannot be decoded: {listed}. Fix or "
                             "remove them, or leave them out: --skip_unreadable on the command line, skip_unreadable=True in Python.")
        print(f"{source}: skipped {len(scan.unreadable_names)} unreadable image(s): {listed}")
        train, test = (_drop(t, scan.unreadable.get(split, [])) for split, t in (("train", train), ("test", test)))
    tables = (_internal(train, names), _internal(test, names))
    unlabelled = int(np.sum(np.asarray(train["label"]) == UNLABELLED))
    print(f"{source}: {len(train)} training images ({unlabelled} unlabelled), {len(test)} test images, "
          f"{len(names)} classes; mean {scan.mean}, std {scan.std} (from the training images); image size "
          f"{scan.image_size} px (their median shorter side; set image_size to choose another).")
    return DatasetSpec(name=name or source, hub_id=None, image_column="image", label_column="label",
                       train_split="train", test_split=test_name, num_classes=len(names),
                       image_size=scan.image_size, mean=scan.mean, std=scan.std,
                       class_names_source="folder names" if kind == "imagefolder" else "label column",
                       fallback_class_names=tuple(names), display=name or source, builder=lambda spec: tables)


# ---- image folders ----


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)


def _subfolders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _class_tree(folder: Path) -> tuple[list[str], list[int], list[str]]:
    """(files, labels, class names) of one split folder: class subfolders, or loose images
    (all unlabelled), plus an optional ``unlabelled/`` folder."""
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder; imagefolder: needs a folder with one subfolder of images per "
                         "class (or a folder of images, unlabelled).")
    loose = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    subfolders = _subfolders(folder)
    if loose and subfolders:
        raise ValueError(f"{folder} holds both image files ({loose[0].name}, ...) and class folders "
                         f"({subfolders[0].name}, ...); move the loose images into a class folder or into "
                         f"{UNLABELLED_FOLDER}/.")
    if loose:
        return [str(p) for p in loose], [UNLABELLED] * len(loose), []
    classes = [p for p in subfolders if p.name != UNLABELLED_FOLDER]
    files: list[str] = []
    labels: list[int] = []
    for index, class_dir in enumerate(classes):
        found = _images_in(class_dir)
        if not found:
            raise ValueError(f"class folder {class_dir} holds no images ({', '.join(IMAGE_EXTENSIONS)}); add images "
                             "or remove the folder.")
        files += [str(p) for p in found]
        labels += [index] * len(found)
    unlabelled = folder / UNLABELLED_FOLDER
    if unlabelled.is_dir():
        found = _images_in(unlabelled)
        files += [str(p) for p in found]
        labels += [UNLABELLED] * len(found)
    if not files:
        raise ValueError(f"{folder} holds no images ({', '.join(IMAGE_EXTENSIONS)}): give a folder with one "
                         "subfolder of images per class, or a folder of images.")
    return files, labels, [p.name for p in classes]


def _image_folder(root: Path, options: SourceOptions, seed: int
                  ) -> tuple[datasets.Dataset, datasets.Dataset, list[str], str]:
    if not root.is_dir():
        raise ValueError(f"imagefolder:{root}: no such folder.")
    test_dir = next((root / t for t in TEST_FOLDERS if (root / t).is_dir()), None)
    if (root / "train").is_dir() and test_dir is not None:
        files, labels, names = _class_tree(root / "train")
        test_files, test_labels, test_names = _class_tree(test_dir)
        unknown = sorted(set(test_names) - set(names))
        if unknown:
            raise ValueError(f"{test_dir} has class folders that {root / 'train'} lacks: {unknown}; the test classes "
                             "must be training classes.")
        remap = {i: names.index(n) for i, n in enumerate(test_names)}
        kept = [(f, remap[y]) for f, y in zip(test_files, test_labels) if y != UNLABELLED]
        if len(kept) < len(test_files):
            print(f"{test_dir}: left {len(test_files) - len(kept)} unlabelled image(s) out of the test split.")
        train = _file_table(files, labels)
        test = _file_table([f for f, _ in kept], [y for _, y in kept])
        return train, test, names, test_dir.name
    files, labels, names = _class_tree(root)
    train, test = _stratified_split(_file_table(files, labels), options.test_fraction, seed)
    return train, test, names, f"held-out {options.test_fraction:g} of each class (seed {seed})"


def _file_table(files: list[str], labels: list[int]) -> datasets.Dataset:
    for f in files:
        try:
            f.encode("utf-8")
        except UnicodeEncodeError:
            shown = f.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise ValueError(f"{shown}: the file name is not UTF-8, which the dataset tables cannot hold; rename the "
                             "file (or leave it out of the folder).") from None
    features = datasets.Features({"image": datasets.Image(decode=False), "label": datasets.Value("int64")})
    return datasets.Dataset.from_dict({"image": [{"path": f, "bytes": None} for f in files], "label": labels},
                                      features=features)


def _folder_identity(*tables: datasets.Dataset) -> str:
    parts = []
    for table in tables:
        for row in table.select_columns(["image"])["image"]:
            stat = os.stat(row["path"])
            parts.append(f"{row['path']}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _stratified_split(table: datasets.Dataset, fraction: float, seed: int
                      ) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Hold out ``round(fraction * n)`` images of each class of n >= 2 images (at least one,
    never all); unlabelled images all stay in training."""
    labels = np.asarray(table["label"], dtype=np.int64)
    rng = np.random.default_rng(seed)
    held: list[np.ndarray] = []
    for c in np.unique(labels[labels != UNLABELLED]):
        rows = rng.permutation(np.flatnonzero(labels == c))
        if len(rows) >= 2:
            held.append(rows[: min(len(rows) - 1, max(1, round(fraction * len(rows))))])
    test_rows = np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)
    train_rows = np.setdiff1d(np.arange(len(table)), test_rows)
    return table.select(train_rows.tolist()), table.select(test_rows.tolist())


# ---- tables (parquet folders and Hub datasets) ----


def _read_tables(kind: str, location: str, data_dir: str | os.PathLike[str] | None) -> datasets.DatasetDict:
    if kind == "parquet" or data_dir is not None:
        folder = Path(data_dir if data_dir is not None else location).expanduser()
        if not folder.is_dir():
            raise ValueError(f"{folder} is not a folder; parquet: needs a folder of train-*.parquet (and "
                             "test-*.parquet) files.")
        if not any(folder.rglob("*.parquet")):
            raise ValueError(f"{folder} holds no .parquet files; name them like train-00000-of-00001.parquet.")
        return datasets.load_dataset("parquet", data_dir=str(folder))
    check_hub_dataset(f"hf:{location}", location)
    try:
        return datasets.load_dataset(location)
    except (ConnectionError, OSError) as err:
        raise unavailable(f"hf:{location}", location, f"it is neither reachable nor in the local cache "
                          f"({' '.join(str(err).split())[:200]})") from err


def _guess(source: str, what: str, given: str | None, candidates: Sequence[str], available: Sequence[str],
           guessed: list[str]) -> str | None:
    if given is not None:
        if given not in available:
            raise ValueError(f"{source}: no {what} {given!r}; the {what}s are {list(available)}.")
        return given
    choice = next((c for c in candidates if c in available), None)
    guessed.append(f"{what.replace(' ', '_')}={choice!r}")
    return choice


def _from_tables(source: str, raw: datasets.DatasetDict, options: SourceOptions, seed: int
                 ) -> tuple[datasets.Dataset, datasets.Dataset, list[str], str]:
    guessed: list[str] = []
    splits = list(raw)
    train_split = _guess(source, "train split", options.train_split, ("train",), splits, guessed)
    if train_split is None:
        raise ValueError(f"{source}: no 'train' split among {splits}; pass train_split=NAME.")
    test_split = _guess(source, "test split", options.test_split,
                        [s for s in ("test", "validation", "valid", "val") if s != train_split], splits, guessed)
    features = raw[train_split].features
    columns = list(features)
    images = [c for c, f in features.items() if isinstance(f, datasets.Image)]
    image_column = _guess(source, "image column", options.image_column, images + list(IMAGE_COLUMN_GUESSES),
                          columns, guessed)
    if image_column is None:
        raise ValueError(f"{source}: cannot tell which column holds the images among {columns}; pass "
                         "image_column=NAME.")
    labels = [c for c, f in features.items() if isinstance(f, datasets.ClassLabel)]
    label_column = _guess(source, "label column", options.label_column, labels + list(LABEL_COLUMN_GUESSES),
                          [c for c in columns if c != image_column], guessed)
    if guessed:
        print(f"{source}: guessed {', '.join(guessed)} from the features {columns}; pass these options to choose.")
    train, names = _image_label(source, raw[train_split], image_column, label_column, None)
    if test_split is not None:
        test, _ = _image_label(source, raw[test_split], image_column, label_column, names)
        return train, test.filter(lambda y: y != UNLABELLED, input_columns="label"), names, test_split
    train, test = _stratified_split(train, options.test_fraction, seed)
    return train, test, names, f"held-out {options.test_fraction:g} of each class of {train_split} (seed {seed})"


def _image_label(source: str, table: datasets.Dataset, image_column: str, label_column: str | None,
                 names: list[str] | None) -> tuple[datasets.Dataset, list[str]]:
    """The (image, label) columns of a split with integer labels (-1: unlabelled) and the class
    names; ``names`` (the training split's) maps a test split's string labels."""
    image = table.select_columns([image_column]).cast_column(image_column, datasets.Image(decode=False))
    if image_column != "image":  # datasets refuses a rename to the name a column already has
        image = image.rename_column(image_column, "image")
    if label_column is None:
        return image.add_column("label", [UNLABELLED] * len(table)), []
    feature = table.features[label_column]
    values = table.select_columns([label_column])[label_column]
    if isinstance(feature, datasets.ClassLabel):
        names = list(feature.names)
        labels = np.asarray(values, dtype=np.int64)
    elif isinstance(feature, datasets.Value) and feature.dtype == "string":
        names = names if names is not None else sorted({v for v in values if v is not None})
        unknown = sorted({v for v in values if v is not None} - set(names))
        if unknown:
            raise ValueError(f"{source}: label(s) {unknown[:5]} of column {label_column!r} are not training classes.")
        index = {n: i for i, n in enumerate(names)}
        labels = np.asarray([UNLABELLED if v is None else index[v] for v in values], dtype=np.int64)
    elif isinstance(feature, datasets.Value) and feature.dtype.startswith(("int", "uint")):
        labels = np.asarray(values, dtype=np.int64)
        if names is None:
            present = np.unique(labels[labels != UNLABELLED])
            names = [str(i) for i in range(int(present.max()) + 1)] if present.size else []
            missing = sorted(set(range(len(names))) - set(present.tolist()))
            if missing:
                raise ValueError(f"{source}: label column {label_column!r} has no rows for class(es) {missing[:10]} "
                                 f"of 0..{len(names) - 1}; relabel to consecutive integers 0..K-1.")
    else:
        raise ValueError(f"{source}: label column {label_column!r} is {feature}; labels must be a ClassLabel, "
                         "integers or strings. Pass label_column=NAME of such a column.")
    bad = labels[(labels < UNLABELLED) | (labels >= len(names))]
    if bad.size:
        raise ValueError(f"{source}: label column {label_column!r} holds {bad.size} value(s) out of range, e.g. "
                         f"{int(bad[0])}; labels must lie in 0..{len(names) - 1} (or -1 for unlabelled).")
    out = image.add_column("label", labels.tolist())
    return out.cast_column("label", datasets.Value("int64")), names


def _internal(table: datasets.Dataset, names: list[str]) -> datasets.Dataset:
    return (table.cast_column("label", datasets.ClassLabel(names=names))
            .cast_column("image", datasets.Image(mode="RGB")))


def _drop(table: datasets.Dataset, rows: list[int]) -> datasets.Dataset:
    return table.select(np.setdiff1d(np.arange(len(table)), rows).tolist()) if rows else table


# ---- the pass over the images ----


def cache_dir() -> Path:
    """Where measured dataset statistics are kept (``$HSCL_ZOO_CACHE``, else ``~/.cache/hscl_zoo``)."""
    return Path(os.environ.get("HSCL_ZOO_CACHE", Path.home() / ".cache" / "hscl_zoo")) / "dataset_stats"


def _open(cell: dict[str, Any]) -> Image.Image:
    data = cell.get("bytes")
    image = Image.open(io.BytesIO(data) if data else cell["path"])
    return image.convert("RGB")


def _scan(source: str, tables: dict[str, datasets.Dataset], identity: str, progress: bool) -> _Scan:
    """Decode every image once: unreadable rows per split, and on the readable training images
    the per-channel mean/std over all pixels and the median shorter side. Cached by ``identity``."""
    key = hashlib.sha256(f"{source}\n{identity}".encode()).hexdigest()[:32]
    cached = cache_dir() / f"{key}.json"
    if cached.is_file():
        saved = json.loads(cached.read_text())
        return _Scan(**{**saved, "mean": tuple(saved["mean"]), "std": tuple(saved["std"])})
    total, total_sq, pixels = np.zeros(3), np.zeros(3), 0
    sides: list[int] = []
    unreadable: dict[str, list[int]] = {}
    names: list[str] = []
    bar = tqdm(total=sum(len(t) for t in tables.values()), desc=f"checking {source}", disable=not progress,
               leave=False)
    for split, table in tables.items():
        for row, cell in enumerate(table.select_columns(["image"])["image"]):
            bar.update()
            try:
                image = _open(cell)
                array = np.asarray(image, dtype=np.float64).reshape(-1, 3) / 255.0
            except (OSError, UnidentifiedImageError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
                unreadable.setdefault(split, []).append(row)
                names.append(f"{cell.get('path') or f'{split} row {row}'} ({type(error).__name__})")
                continue
            if split == "train":
                total += array.sum(axis=0)
                total_sq += (array * array).sum(axis=0)
                pixels += array.shape[0]
                sides.append(min(image.size))
    bar.close()
    if not pixels:
        raise ValueError(f"{source}: its training split has no readable images.")
    mean = total / pixels
    std = np.sqrt(np.maximum(total_sq / pixels - mean * mean, 0.0))
    scan = _Scan(mean=tuple(round(float(v), 4) for v in mean),
                 std=tuple(max(round(float(v), 4), 1e-4) for v in std),
                 image_size=int(np.median(sides)), unreadable=unreadable, unreadable_names=names)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(scan)))
    os.replace(tmp, cached)
    return scan
