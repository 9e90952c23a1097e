"""Probes of frozen features: a similarity-weighted kNN classifier and a linear probe, with the
accuracy they report. They take feature tensors (:mod:`hscl_zoo.features` makes them) and know
nothing of images, models or datasets.

Protocol (recorded in :class:`ProbeResult.protocol` by :func:`linear_probe`): a linear head is
trained on the standardised train features, and top-1/top-5 accuracy on the test split after the
last epoch is reported (no model selection on the test split). Accuracies are percentages in
[0, 100], the unit of the paper's tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from hscl_zoo._options import gather_options

__all__ = ["CONSTANT_FEATURE", "ProbeResult", "ProbeSettings", "knn_top1", "linear_probe", "topk_accuracy"]

CONSTANT_FEATURE = 1e-5
"""A probe feature whose train standard deviation is at most this fraction of its mean's
magnitude is constant (float round-off, not signal): the probe gives it weight 0."""


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


@dataclass(frozen=True)
class ProbeSettings:
    """The linear probe's training settings: `epochs` of seeded (`seed`) shuffled mini-batches of
    `batch_size`, Adam with `lr` and `weight_decay` (the paper's optimiser), on `device` (default
    the CPU), with a progress bar when `progress`."""

    epochs: int = 100
    lr: float = 1e-3
    weight_decay: float = 1e-6
    batch_size: int = 512
    seed: int = 0
    device: str | torch.device | None = None
    progress: bool = True


def linear_probe(
    train_feats: Tensor,
    train_labels: Tensor,
    test_feats: Tensor,
    test_labels: Tensor,
    *,
    num_classes: int,
    **options: Any,
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

    ``options`` are the fields of :class:`ProbeSettings` (``epochs``, ``lr``, ``weight_decay``,
    ``batch_size``, ``seed``, ``device``, ``progress``), keyword-only, with its defaults.
    """
    settings = gather_options(ProbeSettings, options, "linear_probe")
    epochs, lr, weight_decay, batch_size = settings.epochs, settings.lr, settings.weight_decay, settings.batch_size
    seed, device, progress = settings.seed, settings.device, settings.progress
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
        "num_classes": num_classes,
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
