"""The evaluation protocols of frozen encoders: the metrics of an encoder on a dataset, of any
model ``hscl_zoo.load`` accepts with its training run's settings, and transfer to other datasets.

Features are extracted once per split (:mod:`hscl_zoo.features`) with the deterministic
evaluation transform (no augmentation) and shared by every metric: the linear probe and kNN
(:mod:`hscl_zoo.probes`), retrieval (:mod:`hscl_zoo.retrieval`) and the representation audit
(:mod:`hscl_zoo.audit`). :func:`evaluate_transfer` runs :func:`evaluate_model` on several
datasets, each read through the model's own preprocessing. docs/evaluation-protocols.md
describes them. The feature and probe functions are importable from here too, where the public
API has always named them.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hscl_zoo._options import gather_options, split_options
from hscl_zoo.audit import audit
from hscl_zoo.data.catalog import DATASETS
from hscl_zoo.data.datasets import load_splits
from hscl_zoo.data.labelling import partly_labelled
from hscl_zoo.data.source_options import SourceOptions
from hscl_zoo.data.sources import source_options as pick_source_options
from hscl_zoo.data.transforms import DEFAULT_INTERPOLATION, eval_transform
from hscl_zoo.features import extract_features
from hscl_zoo.probes import CONSTANT_FEATURE, ProbeResult, knn_top1, linear_probe, topk_accuracy
from hscl_zoo.protocol import EVAL_DEFAULTS, METRICS, check_metrics
from hscl_zoo.retrieval import retrieval_metrics
from hscl_zoo.zoo.hub import load

if TYPE_CHECKING:
    from hscl_zoo.data.datasets import LoadedData

__all__ = ["CONSTANT_FEATURE", "METRICS", "EvalOptions", "ProbeResult", "evaluate_encoder", "evaluate_model", "evaluate_transfer",
           "extract_features", "knn_top1", "linear_probe", "preprocessing", "topk_accuracy"]


def evaluate_encoder(
    encoder: nn.Module,
    data: LoadedData,
    *,
    metrics: Iterable[str] = ("linear", "knn"),
    epochs: int = 100,
    knn_k: int = 200,
    knn_temperature: float = 0.1,
    seed: int = 0,
    device: str | torch.device | None = None,
    batch_size: int = 256,
    num_workers: int = 0,
    progress: bool = True,
    images: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """The ``metrics`` (see :data:`METRICS`) of a zoo encoder on a dataset's train/test splits
    (unlabelled training images left out; the result says how many were used and left out).

    Features come from ``encoder.encode`` with the encoder's own eval preprocessing
    (``encoder.transform``, else :func:`hscl_zoo.data.transforms.eval_transform` of
    ``encoder.pretrained_cfg``), extracted once per split and shared by every metric.
    ``images`` maps ``"train"`` (the labelled training rows) and/or ``"test"`` to those rows
    already decoded into uint8 tensors (a training run's image caches): such a split is encoded
    from its tensor on the device, not decoded image by image again.

    Returns:
        A dict with ``dataset``, ``test_split``, ``train_images`` (labelled training images the
        metrics used), ``unlabelled_train_images`` (left out), ``metrics`` and ``protocol``, plus
        per metric: linear: ``top1``, ``top5``, ``train_top1`` (%), the probe's settings in
        ``protocol`` and ``head`` (a state dict for ``encoder.classifier``); knn: ``knn_top1`` (%),
        ``knn_k``, ``knn_temperature`` (settings under ``protocol["knn"]``); retrieval:
        ``retrieval`` (test queries against the training gallery, see
        :func:`hscl_zoo.retrieval.retrieval_metrics`); audit: ``audit`` (see
        :func:`hscl_zoo.audit.audit`). Also ``features_from`` (per split: ``"image cache"`` or
        ``"decoded images"``) and ``seconds`` (wall time of the features and of each metric).
        All but ``head`` is JSON-serialisable.
    """
    metrics = check_metrics(metrics)
    unlabelled = data.unlabelled
    data = data.labelled()
    images = dict(images or {})
    if unknown := sorted(set(images) - {"train", "test"}):
        raise ValueError(f"images has splits {unknown}; name them 'train' and 'test'.")
    transform = getattr(encoder, "transform", None)
    if transform is None:
        transform = eval_transform(encoder.pretrained_cfg)
    options = {"batch_size": batch_size, "device": device, "num_workers": num_workers, "progress": progress}
    clock = _Clock()
    with clock("features"):
        train_f, train_y = extract_features(encoder.encode, data.train, transform, images=images.get("train"), **options)
        test_f, test_y = extract_features(encoder.encode, data.test, transform, images=images.get("test"), **options)
    result: dict[str, Any] = {
        "dataset": data.spec.name,
        "test_split": data.spec.test_split,
        "train_images": len(data.train),
        "unlabelled_train_images": unlabelled,
        "metrics": list(metrics),
        "protocol": {},
        "features_from": {split: "image cache" if split in images else "decoded images" for split in ("train", "test")},
    }
    if "linear" in metrics:
        with clock("linear"):
            probe = linear_probe(train_f, train_y, test_f, test_y, num_classes=len(data.class_names), epochs=epochs,
                                 seed=seed, device=device, progress=progress)
        result.update(top1=probe.top1, top5=probe.top5, train_top1=probe.train_top1, head=probe.head)
        result["protocol"].update(probe.protocol)
    if "knn" in metrics:
        with clock("knn"):
            knn = knn_top1(train_f, train_y, test_f, test_y, k=knn_k, temperature=knn_temperature, device=device)
        result.update(knn_top1=knn, knn_k=knn_k, knn_temperature=knn_temperature)
        result["protocol"]["knn"] = {"k": knn_k, "temperature": knn_temperature,
                                     "weighting": "exp(cosine / temperature)"}
    if "retrieval" in metrics:
        with clock("retrieval"):
            result["retrieval"] = retrieval_metrics(test_f, test_y, train_f, train_y, device=device)
        result["protocol"]["retrieval"] = {"queries": data.spec.test_split, "gallery": "train",
                                           "similarity": "cosine", "ties": "earlier gallery row first"}
    if "audit" in metrics:
        with clock("audit"):
            result["audit"] = audit(encoder, data, head=probe.head, features=(test_f, test_y), batch_size=batch_size,
                                    seed=seed, device=device, num_workers=num_workers, progress=progress)
    result["seconds"] = clock.seconds
    return result


class _Clock:
    """Wall seconds of named parts (``with clock("features"): ...``), kept in ``seconds``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - started, 3)


def preprocessing(pretrained_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """How :func:`hscl_zoo.data.transforms.eval_transform` brings any image to the model's input
    size, as a results file states it (a transfer target's images are resized the same way)."""
    _, height, width = (int(v) for v in pretrained_cfg["input_size"])
    crop_pct = float(pretrained_cfg.get("crop_pct") or 1.0)
    mode = pretrained_cfg.get("crop_mode") or "center"
    interpolation = pretrained_cfg.get("interpolation") or DEFAULT_INTERPOLATION
    if mode == "squash":
        resize = f"{math.floor(height / crop_pct)}x{math.floor(width / crop_pct)} ignoring aspect ratio"
    else:
        resize = f"shorter side to {math.floor(min(height, width) / crop_pct)}"
    return {"input_size": [3, height, width],
            "resize": f"{resize} ({interpolation}, antialiased), then centre crop {height}x{width}",
            "mean": list(pretrained_cfg["mean"]), "std": list(pretrained_cfg["std"])}


@dataclass(frozen=True)
class EvalOptions:
    """:func:`evaluate_model`'s options. Unset (None), each is the training run's own setting for
    its own dataset (its config.json), else :data:`EVAL_DEFAULTS`'s; ``metrics`` defaults to all of
    :data:`METRICS`, ``device`` to CUDA when present."""

    data_dir: str | None = None
    subset: int | None = None
    probe_epochs: int | None = None
    knn_k: int | None = None
    seed: int | None = None
    full_test: bool | None = None
    labelled_fraction: float | None = None
    metrics: Iterable[str] = METRICS
    device: str | torch.device | None = None
    progress: bool = True


def evaluate_model(source: Any, dataset: str | None = None, **options: Any) -> dict[str, Any]:
    """The ``metrics`` (linear probe, kNN, retrieval, audit: :data:`METRICS`, by default all, as
    the recipe's final evaluation) of any model ``hscl_zoo.load`` accepts, with the training run's
    settings as defaults.

    ``dataset`` may be own data (``imagefolder:PATH``, ...); ``source_options`` are its options
    (see ``hscl_zoo.data.load_splits``), by default the run's own for its own dataset.

    ``dataset``, ``data_dir``, ``subset``, ``full_test``, ``labelled_fraction``, ``seed``,
    ``probe_epochs`` and ``knn_k`` default to those of the run that trained the model (the recipe
    config in its config.json), else to :data:`EVAL_DEFAULTS`, so evaluating a run's hub folder
    repeats the run's own evaluation; the run's data settings apply to its own dataset only, and a
    ``data_dir`` that is not on this machine falls back to the Hub (with a note on stderr).
    ``labelled_fraction`` keeps that seeded, class-balanced part of the training labels
    (``hscl_zoo.data.labelling``): the probe and kNN then use those images only. Returns the
    :func:`evaluate_encoder` dict without the head, plus ``model``, ``dataset``, ``data_dir``,
    ``subset``, ``full_test``, ``labelled_fraction``, ``trained_on`` (the model's training
    dataset), ``transfer`` (whether ``dataset`` is another one), ``preprocessing`` (see
    :func:`preprocessing`) and ``native_size`` (the side of a registered dataset's stored images,
    None for own data); JSON-serialisable.

    The probe trains its own head on frozen features, so any dataset works (transfer included).
    Raises ``ValueError`` (or ``OSError``) for a model that does not load, a bad dataset, and a
    model without a training dataset when ``dataset`` is not given.
    Options: the fields of :class:`EvalOptions` (``data_dir``, ``subset``, ``probe_epochs``,
    ``knn_k``, ``seed``, ``full_test``, ``labelled_fraction``, ``metrics``, ``device``,
    ``progress``) and the own-data options of :class:`hscl_zoo.data.SourceOptions`; any other
    keyword is a TypeError, raised before the model loads.
    """
    chosen, source_options = split_options(EvalOptions, options)
    gather_options(SourceOptions, source_options, "evaluate_model")  # a misspelt option is refused before any load
    data_dir, subset, full_test, labelled_fraction = chosen.data_dir, chosen.subset, chosen.full_test, chosen.labelled_fraction
    metrics = check_metrics(chosen.metrics)
    device, progress = chosen.device, chosen.progress
    target = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    model = load(source, device=target)
    if not hasattr(model, "pretrained_cfg"):
        raise ValueError(f"{source} loads as a {type(model).__name__}, not an image encoder, and evaluate_model scores "
                         f"image encoders; score a graph encoder with `hscl-zoo eval {source}` (in Python: "
                         "hscl_zoo.graphs.recipe.evaluate_graph_encoder).")
    training = model.training_summary or {}
    recipe = training.get("recipe_config") or {}
    dataset = dataset or training.get("dataset")
    if dataset is None:
        raise ValueError("the model's config names no training dataset: pass --dataset.")
    same_data = recipe if dataset == training.get("dataset") else {}
    if data_dir is None and same_data.get("data_dir") is not None:
        data_dir = same_data["data_dir"]
        if not Path(data_dir).is_dir():
            print(f"note: reading {dataset} from the Hub (the folder the model was trained from is not on this "
                  "machine); --data_dir reads a local copy.", file=sys.stderr)
            data_dir = None
    given = {"probe_epochs": chosen.probe_epochs, "knn_k": chosen.knn_k, "seed": chosen.seed}
    settings = {key: given[key] if given[key] is not None else recipe.get(key, default)
                for key, default in EVAL_DEFAULTS.items()}
    subset = subset if subset is not None else same_data.get("subset")
    full_test = bool(same_data.get("full_test", False)) if full_test is None else full_test
    if labelled_fraction is None:
        labelled_fraction = float(same_data.get("labelled_fraction", 1.0))
    options = {**pick_source_options(same_data), **source_options}
    data = load_splits(dataset, data_dir, subset=subset, seed=settings["seed"], full_test=full_test, **options)
    data = partly_labelled(data, labelled_fraction, seed=settings["seed"])
    result = evaluate_encoder(model, data, metrics=metrics, epochs=settings["probe_epochs"], knn_k=settings["knn_k"],
                              seed=settings["seed"], device=target, progress=progress)
    result.pop("head", None)
    result.update(model=str(source), dataset=dataset, data_dir=data_dir, subset=subset, full_test=full_test,
                  labelled_fraction=labelled_fraction, trained_on=training.get("dataset"),
                  transfer=dataset != training.get("dataset"), preprocessing=preprocessing(model.pretrained_cfg),
                  native_size=DATASETS[dataset].native_size if dataset in DATASETS else None)
    return result


def evaluate_transfer(
    source: Any,
    targets: Sequence[str],
    *,
    data_dirs: Sequence[str | None] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """:func:`evaluate_model` of one model on several datasets, one row each, under one protocol.

    Every target is read through the model's own eval preprocessing (:func:`preprocessing`:
    images resized and centre-cropped to the model's input size, whatever their native size),
    and gets a linear probe of its own on frozen features. ``data_dirs`` gives each target's
    local folder (``None`` for the default), in the order of ``targets``; ``options`` are those
    of :func:`evaluate_model` and apply to every target.

    Returns ``model``, ``trained_on``, ``protocol`` (what every row shares: preprocessing, metrics
    and the probe and kNN settings equal in every row) and ``rows`` (one :func:`evaluate_model` dict per target, in order).
    """
    targets = list(targets)
    data_dirs = list(data_dirs) if data_dirs is not None else [None] * len(targets)
    if not targets or len(data_dirs) != len(targets):
        raise ValueError(f"got {len(targets)} datasets and {len(data_dirs)} data_dirs; give one data_dir per dataset "
                         "(empty for the default), in the same order.")
    repeated = sorted({t for t in targets if targets.count(t) > 1})
    if repeated:
        raise ValueError(f"dataset {repeated[0]!r} is listed twice; name each target once.")
    rows = [evaluate_model(source, target, data_dir=data_dir, **options) for target, data_dir in zip(targets, data_dirs)]
    common = {key: value for key, value in rows[0]["protocol"].items()
              if all(row["protocol"].get(key) == value for row in rows)}
    return {"model": str(source), "trained_on": rows[0]["trained_on"],
            "protocol": {"transfer": "frozen features of every target through the model's eval preprocessing, "
                                     "a linear probe trained per target",
                         "preprocessing": rows[0]["preprocessing"], "metrics": rows[0]["metrics"], **common},
            "rows": rows}
