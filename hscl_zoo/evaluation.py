"""Evaluation of frozen encoders: feature extraction, weighted kNN, a linear probe, and the
protocols built on them (retrieval, the representation audit, transfer to other datasets).

Protocol (recorded in :class:`ProbeResult.protocol` by :func:`linear_probe`): features of the
frozen encoder are extracted once with the deterministic evaluation transform (no
augmentation), a linear head is trained on the standardised train features, and top-1/top-5
accuracy on the test split after the last epoch is reported (no model selection on the test
split). Accuracies are percentages in [0, 100], the unit of the paper's tables.
:func:`evaluate_encoder` adds the metrics of :mod:`hscl_zoo.retrieval` and :mod:`hscl_zoo.audit`
on the same features; :func:`evaluate_transfer` runs :func:`evaluate_model` on several datasets,
each read through the model's own preprocessing. docs/evaluation-protocols.md describes them.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from hscl_zoo.audit import audit
from hscl_zoo.data.catalog import DATASETS
from hscl_zoo.data.datasets import load_splits, require_internal_columns
from hscl_zoo.data.labelling import partly_labelled
from hscl_zoo.data.sources import source_options as pick_source_options
from hscl_zoo.protocol import EVAL_DEFAULTS, METRICS, check_metrics
from hscl_zoo.data.transforms import DEFAULT_INTERPOLATION, eval_transform
from hscl_zoo.retrieval import retrieval_metrics

CONSTANT_FEATURE = 1e-5
"""A probe feature whose train standard deviation is at most this fraction of its mean's
magnitude is constant (float round-off, not signal): the probe gives it weight 0."""

if TYPE_CHECKING:
    from hscl_zoo.data.datasets import LoadedData


class _TransformedImages(torch.utils.data.Dataset):
    """Rows of an internal-form table as ``(transform(image), label)`` pairs."""

    def __init__(self, dataset: datasets.Dataset, transform: Callable[[Any], Tensor]) -> None:
        self.dataset = dataset
        self.transform = transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        row = self.dataset[int(index)]
        return self.transform(row["image"]), int(row["label"])


def extract_features(
    encode_fn: Callable[[Tensor], Tensor],
    dataset: datasets.Dataset,
    transform: Callable[[Any], Tensor],
    *,
    batch_size: int = 256,
    device: str | torch.device | None = None,
    num_workers: int = 0,
    progress: bool = True,
) -> tuple[Tensor, Tensor]:
    """Encode every row of ``dataset`` once, in order, with a frozen encoder.

    Args:
        encode_fn: maps a float batch (B, 3, H, W) to features (B, D), e.g. a model's
            ``forward_features`` plus pooling. If it is an ``nn.Module`` or a bound method of
            one, that module is put in eval mode for the pass and its mode restored afterwards.
        dataset: table with ``image`` and ``label`` columns (see ``hscl_zoo.data.datasets``).
        transform: deterministic preprocessing, normally ``hscl_zoo.data.transforms.eval_transform(cfg)``.
        batch_size: images per forward pass.
        device: where the batches go; by default the device of the module's first parameter,
            else CPU.
        num_workers: DataLoader workers decoding and transforming images.
        progress: show a tqdm bar.

    Returns:
        ``(features, labels)``: float32 (N, D) and int64 (N,), both on CPU, in dataset order.
    """
    require_internal_columns(dataset, "extract_features")
    if len(dataset) == 0:
        raise ValueError("extract_features got an empty dataset")
    module = _owning_module(encode_fn)
    target = torch.device(device) if device is not None else _module_device(module)
    loader = torch.utils.data.DataLoader(
        _TransformedImages(dataset, transform),
        batch_size=batch_size,
        shuffle=False,
        num_workers=num_workers,
    )
    was_training = module.training if module is not None else False
    if module is not None:
        module.eval()
    feats: list[Tensor] = []
    labels: list[Tensor] = []
    try:
        with torch.inference_mode():
            for images, batch_labels in tqdm(
                loader, desc="features", disable=not progress, leave=False
            ):
                out = encode_fn(images.to(target, non_blocking=True))
                if not isinstance(out, Tensor) or out.ndim != 2 or out.shape[0] != len(images):
                    shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                    raise ValueError(
                        f"encode_fn must return a (batch, dim) tensor, got {shape}; pool "
                        f"spatial maps first (e.g. timm's forward_head(x, pre_logits=True))"
                    )
                feats.append(out.detach().float().cpu())
                labels.append(batch_labels.to(torch.int64))
    finally:
        if module is not None:
            module.train(was_training)
    return torch.cat(feats), torch.cat(labels)


def knn_top1(
    train_feats: Tensor,
    train_labels: Tensor,
    test_feats: Tensor,
    test_labels: Tensor,
    *,
    k: int = 200,
    temperature: float = 0.1,
    chunk_size: int = 1024,
    device: str | torch.device | None = None,
) -> float:
    """Top-1 accuracy (%) of a similarity-weighted kNN classifier on cosine similarity.

    The monitor of InstDisc and SimCLR-style repositories: features are L2-normalised, each
    test point takes its ``k`` most similar train points (k is capped at the train size), and
    class c scores ``sum exp(s_j / temperature)`` over the neighbours of class c; the highest
    score is the prediction. Test points are processed ``chunk_size`` at a time, so memory is
    O(chunk_size * N_train). The search runs on ``device`` (default: where the training features
    are), e.g. the GPU for a 50,000-image bank.
    """
    _check_pairs(train_feats, train_labels, "train")
    _check_pairs(test_feats, test_labels, "test")
    _check_dims(train_feats, test_feats)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k!r}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    k = min(k, len(train_feats))
    device = train_feats.device if device is None else torch.device(device)
    bank = F.normalize(train_feats.to(device).float(), dim=1)
    bank_labels = train_labels.to(device).long()
    correct = torch.zeros((), dtype=torch.int64, device=device)
    for start in range(0, len(test_feats), chunk_size):
        queries = F.normalize(test_feats[start : start + chunk_size].to(device).float(), dim=1)
        sims, idx = (queries @ bank.T).topk(k, dim=1)
        scores = torch.zeros(len(queries), num_classes, dtype=sims.dtype, device=device)
        # Each row's weights relative to its nearest neighbour's: the same vote, and no overflow of
        # exp(s / T) at a small temperature (float32 overflows past s / T = 88.7).
        scores.scatter_add_(1, bank_labels[idx], ((sims - sims[:, :1]) / temperature).exp())
        predictions = scores.argmax(dim=1)
        correct += (predictions == test_labels[start : start + chunk_size].to(device).long()).sum()
    return 100.0 * int(correct) / len(test_feats)


@dataclass
class ProbeResult:
    """Outcome of :func:`linear_probe`.

    Attributes:
        top1: test top-1 accuracy (%) after the last epoch.
        top5: test top-k accuracy (%) with k = min(5, num_classes).
        train_top1: train top-1 accuracy (%) of the final head.
        head: ``{"weight": (C, D), "bias": (C,)}`` acting on *raw* features (the
            standardisation is folded in), ready for ``nn.Linear(D, C).load_state_dict``.
        protocol: every setting that determines the numbers, for results files and model cards.
    """

    top1: float
    top5: float
    train_top1: float
    head: dict[str, Tensor]
    protocol: dict[str, Any] = field(default_factory=dict)


def linear_probe(
    train_feats: Tensor,
    train_labels: Tensor,
    test_feats: Tensor,
    test_labels: Tensor,
    *,
    num_classes: int,
    epochs: int = 100,
    lr: float = 1e-3,
    weight_decay: float = 1e-6,
    batch_size: int = 512,
    seed: int = 0,
    device: str | torch.device | None = None,
    progress: bool = True,
) -> ProbeResult:
    """Train a linear classifier on precomputed frozen features and report test accuracy.

    Protocol: features are standardised per dimension with the train mean and standard
    deviation; a zero-initialised ``nn.Linear(D, num_classes)`` is trained with cross-entropy
    by Adam (``lr``, ``weight_decay`` — the paper's optimiser settings) for ``epochs`` epochs
    of seeded shuffled mini-batches of ``batch_size``, the learning rate following a cosine
    schedule to 0 per step; no augmentation (features are computed once); the head after the
    last epoch is evaluated on the test features (no early stopping or best-epoch selection).
    The standardisation is folded into the returned head, which therefore applies to raw
    features. A dimension constant on the train split (its standard deviation at most 1e-5 of
    its mean's magnitude, or 0) carries no information and gets weight 0: standardising its
    float round-off would blow it up to weights of 1e5 and more, whose cancellation in the folded
    head costs the logits their precision. On CPU this takes seconds for 50,000 x 2048 features and 100 epochs.
    """
    _check_pairs(train_feats, train_labels, "train")
    _check_pairs(test_feats, test_labels, "test")
    _check_dims(train_feats, test_feats)
    for name, labels in (("train", train_labels), ("test", test_labels)):
        if int(labels.min()) < 0 or int(labels.max()) >= num_classes:
            raise ValueError(
                f"{name} labels range over [{int(labels.min())}, {int(labels.max())}] but "
                f"num_classes={num_classes}; pass the dataset's number of classes"
            )
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1, got {epochs!r}, {batch_size!r}")
    target = torch.device(device) if device is not None else torch.device("cpu")
    x_train = train_feats.float().to(target)
    y_train = train_labels.long().to(target)
    mean = x_train.mean(dim=0)
    std = x_train.std(dim=0, unbiased=False)
    constant = std <= CONSTANT_FEATURE * mean.abs()
    std = torch.where(constant, torch.inf, std.clamp_min(1e-6))
    x_train = (x_train - mean) / std
    dim = x_train.shape[1]
    head = nn.Linear(dim, num_classes).to(target)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    optimizer = torch.optim.Adam(head.parameters(), lr=lr, weight_decay=weight_decay)
    steps_per_epoch = math.ceil(len(x_train) / batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs * steps_per_epoch)
    generator = torch.Generator().manual_seed(seed)
    for _ in tqdm(range(epochs), desc="linear probe", disable=not progress, leave=False):
        order = torch.randperm(len(x_train), generator=generator).to(target)
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            loss = F.cross_entropy(head(x_train[batch]), y_train[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
    with torch.no_grad():
        weight = (head.weight / std).cpu()
        bias = (head.bias - head.weight @ (mean / std)).cpu()
    folded = {"weight": weight.contiguous(), "bias": bias.contiguous()}
    top1, top5 = topk_accuracy(test_feats.float() @ weight.T + bias, test_labels, num_classes)
    train_top1, _ = topk_accuracy(train_feats.float() @ weight.T + bias, train_labels, num_classes)
    protocol = {
        "features": "frozen encoder, eval transform, extracted once (no augmentation)",
        "augmentation": False,
        "feature_normalisation": "per-dimension standardisation with train mean/std, folded into head",
        "head": f"linear {dim} -> {num_classes}, zero init",
        "loss": "cross-entropy",
        "optimizer": "Adam",
        "lr": lr,
        "weight_decay": weight_decay,
        "lr_schedule": "cosine to 0, per step",
        "epochs": epochs,
        "batch_size": batch_size,
        "seed": seed,
        "report": "last epoch",
        "top5_k": min(5, num_classes),
        "num_train": len(train_feats),
        "num_test": len(test_feats),
    }
    return ProbeResult(top1=top1, top5=top5, train_top1=train_top1, head=folded, protocol=protocol)


def topk_accuracy(logits: Tensor, labels: Tensor, num_classes: int) -> tuple[float, float]:
    """Top-1 and top-k (k = min(5, classes)) accuracy in %. A tie counts against the true class:
    its rank is the number of other classes scored at least as high, so an encoder whose logits
    are all equal scores 0, not 100, and the result does not depend on how `topk` orders ties."""
    k = min(5, num_classes)
    true = logits.gather(1, labels.long().view(-1, 1))
    rank = (logits >= true).sum(dim=1) - 1
    return 100.0 * float((rank == 0).float().mean()), 100.0 * float((rank < k).float().mean())


def _check_pairs(feats: Tensor, labels: Tensor, name: str) -> None:
    if feats.ndim != 2:
        raise ValueError(f"{name} features must be (N, D), got shape {tuple(feats.shape)}")
    if labels.ndim != 1 or len(labels) != len(feats):
        raise ValueError(
            f"{name} labels must be (N,) with N = {len(feats)} rows of features, got shape "
            f"{tuple(labels.shape)}"
        )
    if len(feats) == 0:
        raise ValueError(f"{name} features are empty")


def _check_dims(train_feats: Tensor, test_feats: Tensor) -> None:
    if train_feats.shape[1] != test_feats.shape[1]:
        raise ValueError(
            f"train features have {train_feats.shape[1]} dims but test features "
            f"{test_feats.shape[1]}; extract both with the same encoder"
        )


def _owning_module(encode_fn: Callable[[Tensor], Tensor]) -> nn.Module | None:
    if isinstance(encode_fn, nn.Module):
        return encode_fn
    owner = getattr(encode_fn, "__self__", None)
    return owner if isinstance(owner, nn.Module) else None


def _module_device(module: nn.Module | None) -> torch.device:
    if module is not None:
        for tensor in module.parameters():
            return tensor.device
    return torch.device("cpu")


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
) -> dict[str, Any]:
    """The ``metrics`` (see :data:`METRICS`) of a zoo encoder on a dataset's train/test splits
    (unlabelled training images left out; the result says how many were used and left out).

    Features come from ``encoder.encode`` with the encoder's own eval preprocessing
    (``encoder.transform``, else :func:`hscl_zoo.data.transforms.eval_transform` of
    ``encoder.pretrained_cfg``), extracted once per split and shared by every metric.

    Returns:
        A dict with ``dataset``, ``test_split``, ``train_images`` (labelled training images the
        metrics used), ``unlabelled_train_images`` (left out), ``metrics`` and ``protocol``, plus
        per metric: linear: ``top1``, ``top5``, ``train_top1`` (%), the probe's settings in
        ``protocol`` and ``head`` (a state dict for ``encoder.classifier``); knn: ``knn_top1`` (%),
        ``knn_k``, ``knn_temperature`` (settings under ``protocol["knn"]``); retrieval:
        ``retrieval`` (test queries against the training gallery, see
        :func:`hscl_zoo.retrieval.retrieval_metrics`); audit: ``audit`` (see
        :func:`hscl_zoo.audit.audit`). All but ``head`` is JSON-serialisable.
    """
    metrics = check_metrics(metrics)
    unlabelled = data.unlabelled
    data = data.labelled()
    transform = getattr(encoder, "transform", None)
    if transform is None:
        transform = eval_transform(encoder.pretrained_cfg)
    options = {"batch_size": batch_size, "device": device, "num_workers": num_workers}
    train_f, train_y = extract_features(encoder.encode, data.train, transform, progress=progress, **options)
    test_f, test_y = extract_features(encoder.encode, data.test, transform, progress=progress, **options)
    result: dict[str, Any] = {
        "dataset": data.spec.name,
        "test_split": data.spec.test_split,
        "train_images": len(data.train),
        "unlabelled_train_images": unlabelled,
        "metrics": list(metrics),
        "protocol": {},
    }
    if "linear" in metrics:
        probe = linear_probe(train_f, train_y, test_f, test_y, num_classes=len(data.class_names), epochs=epochs,
                             seed=seed, device=device, progress=progress)
        result.update(top1=probe.top1, top5=probe.top5, train_top1=probe.train_top1, head=probe.head)
        result["protocol"].update(probe.protocol)
    if "knn" in metrics:
        knn = knn_top1(train_f, train_y, test_f, test_y, k=knn_k, temperature=knn_temperature, device=device)
        result.update(knn_top1=knn, knn_k=knn_k, knn_temperature=knn_temperature)
        result["protocol"]["knn"] = {"k": knn_k, "temperature": knn_temperature,
                                     "weighting": "exp(cosine / temperature)"}
    if "retrieval" in metrics:
        result["retrieval"] = retrieval_metrics(test_f, test_y, train_f, train_y, device=device)
        result["protocol"]["retrieval"] = {"queries": data.spec.test_split, "gallery": "train",
                                           "similarity": "cosine", "ties": "earlier gallery row first"}
    if "audit" in metrics:
        result["audit"] = audit(encoder, data, head=probe.head, features=(test_f, test_y), batch_size=batch_size,
                                seed=seed, device=device, num_workers=num_workers, progress=progress)
    return result



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


def evaluate_model(
    source: Any,
    dataset: str | None = None,
    *,
    data_dir: str | None = None,
    subset: int | None = None,
    probe_epochs: int | None = None,
    knn_k: int | None = None,
    seed: int | None = None,
    full_test: bool | None = None,
    labelled_fraction: float | None = None,
    metrics: Iterable[str] = METRICS,
    device: str | torch.device | None = None,
    progress: bool = True,
    **source_options: Any,
) -> dict[str, Any]:
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
    """
    from hscl_zoo.zoo.hub import load  # the zoo imports this module

    metrics = check_metrics(metrics)
    target = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    model = load(source, device=target)
    training = model.training_summary or {}
    recipe = training.get("recipe_config") or {}
    dataset = dataset or training.get("dataset")
    if dataset is None:
        raise ValueError("the model's config names no training dataset: pass --dataset.")
    same_data = recipe if dataset == training.get("dataset") else {}
    if data_dir is None and same_data.get("data_dir") is not None:
        data_dir = same_data["data_dir"]
        if not Path(data_dir).is_dir():
            print(f"note: the run's data_dir {data_dir} is not here; reading {dataset} from the Hub "
                  "(pass --data_dir to use a local copy).", file=sys.stderr)
            data_dir = None
    given = {"probe_epochs": probe_epochs, "knn_k": knn_k, "seed": seed}
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
