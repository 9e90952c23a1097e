"""A representation audit of a trained encoder on a dataset's test split.

:func:`audit` reports, in one JSON-ready dict:

- per-class accuracy (%) and the most-confused class pairs, from the linear probe's predictions;
- alignment and uniformity (Wang and Isola, 2020, "Understanding Contrastive Representation
  Learning through Alignment and Uniformity") of the L2-normalised projections the loss trains:
  ``alignment = E ||f(x) - f(x+)||^alpha`` over positive pairs (two augmented views of one test
  image, alpha = 2) and ``uniformity = log E exp(-t ||f(x) - f(y)||^2)`` over pairs of distinct
  test images (t = 2, the mean of the two views' values, as in their loss); lower is better for
  both, alignment lies in [0, 4] and uniformity in [-4, 0];
- the paper's Assumption 1 fraction on shuffled test batches of two views per image, computed by
  :class:`hscl_zoo.losses.diagnostics.DiagnosticsMeter` with the training run's temperature and
  hardening (the exponential tilt of its beta, or its threshold), as the recipe reports it per
  epoch on training batches.

The feature-level functions (:func:`alignment`, :func:`uniformity`, :func:`class_accuracy`,
:func:`confused_pairs`) work on tensors and are what :func:`audit` calls.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from hscl_zoo.data.transforms import eval_transform, simclr_transform
from hscl_zoo.data.views import MultiViewDataset
from hscl_zoo.features import extract_features
from hscl_zoo.losses.diagnostics import DiagnosticsMeter
from hscl_zoo.losses.hardening import ExponentialTilt, Threshold

if TYPE_CHECKING:
    from hscl_zoo.data.datasets import LoadedData

__all__ = ["alignment", "uniformity", "class_accuracy", "confused_pairs", "audit"]


def alignment(a: Tensor, b: Tensor, *, alpha: float = 2.0) -> float:
    """Mean of ``||a_i - b_i||^alpha`` over the rows of two (N, D) tensors of positive pairs,
    after L2-normalising each row."""
    if a.shape != b.shape or a.ndim != 2 or len(a) == 0:
        raise ValueError(f"alignment needs two non-empty (N, D) tensors of the same shape, got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    distance = (F.normalize(a.double(), dim=1) - F.normalize(b.double(), dim=1)).norm(dim=1)
    return float(distance.pow(alpha).mean())


def uniformity(z: Tensor, *, t: float = 2.0, chunk_size: int = 1024) -> float:
    """``log`` of the mean of ``exp(-t ||z_i - z_j||^2)`` over pairs ``i < j`` of the L2-normalised
    rows of ``z`` (N >= 2), summed in log space ``chunk_size`` rows at a time (O(chunk x N) memory),
    on the device ``z`` is on."""
    if z.ndim != 2 or len(z) < 2:
        raise ValueError(f"uniformity needs an (N, D) tensor with N >= 2, got shape {tuple(z.shape)}")
    z = F.normalize(z.double(), dim=1)
    n = len(z)
    parts = []
    index = torch.arange(n, device=z.device)
    for start in range(0, n, chunk_size):
        rows = z[start : start + chunk_size]
        squared = (2.0 - 2.0 * rows @ z[start:].T).clamp_min(0.0)  # the columns at or right of the chunk's diagonal
        above = index[None, start:] > index[start : start + len(rows), None]
        parts.append(torch.where(above, -t * squared, -torch.inf).logsumexp(dim=(0, 1)))
    return float(torch.stack(parts).logsumexp(dim=0) - math.log(n * (n - 1) / 2))


def class_accuracy(predictions: Tensor, labels: Tensor, num_classes: int) -> list[float]:
    """Accuracy (%) of ``predictions`` on the images of each class 0..num_classes-1 (NaN for a
    class without test images)."""
    _check_predictions(predictions, labels, num_classes)
    images = torch.bincount(labels, minlength=num_classes).double()
    correct = torch.bincount(labels[predictions == labels], minlength=num_classes).double()
    return (100.0 * correct / images).tolist()


def confused_pairs(predictions: Tensor, labels: Tensor, num_classes: int, *, top: int = 5) -> list[dict[str, Any]]:
    """The ``top`` class pairs {a, b} (a < b) with the most images of one predicted as the other,
    most first (ties: smaller class ids first); each with ``a_as_b``, ``b_as_a`` (image counts)
    and ``rate``: those confusions as a % of the two classes' test images. Pairs never confused
    are not listed."""
    _check_predictions(predictions, labels, num_classes)
    confusion = torch.bincount(labels * num_classes + predictions, minlength=num_classes**2).view(num_classes, -1)
    images = confusion.sum(dim=1)
    pairs = []
    for a in range(num_classes):
        for b in range(a + 1, num_classes):
            count = int(confusion[a, b] + confusion[b, a])
            if count:
                pairs.append((-count, a, b))
    pairs.sort()
    return [{"a": a, "b": b, "a_as_b": int(confusion[a, b]), "b_as_a": int(confusion[b, a]),
             "rate": 100.0 * -negative / int(images[a] + images[b])} for negative, a, b in pairs[:top]]


def _check_predictions(predictions: Tensor, labels: Tensor, num_classes: int) -> None:
    if predictions.shape != labels.shape or labels.ndim != 1 or len(labels) == 0:
        raise ValueError(f"predictions and labels must be non-empty (N,) tensors of the same shape, got "
                         f"{tuple(predictions.shape)} and {tuple(labels.shape)}")
    for name, values in (("labels", labels), ("predictions", predictions)):
        if int(values.min()) < 0 or int(values.max()) >= num_classes:
            raise ValueError(f"{name} range over [{int(values.min())}, {int(values.max())}] but num_classes="
                             f"{num_classes}; pass the dataset's number of classes")


def _run_hardening(model: nn.Module) -> tuple[float, Any, str]:
    """The temperature and hardening of the run that trained ``model`` (its config's training
    summary): its threshold when it had a fixed one, else the exponential tilt of its beta (1.0
    when it had none, as the recipe watches a method with uniform weights)."""
    hyper = (getattr(model, "training_summary", None) or {}).get("hyperparameters") or {}
    temperature = float(hyper.get("temperature", 0.5))
    threshold = hyper.get("threshold")
    if isinstance(threshold, (int, float)) and not isinstance(threshold, bool):
        return temperature, Threshold(float(threshold), temperature), f"threshold {float(threshold):g}"
    beta = float(hyper.get("beta") or 1.0)
    return temperature, ExponentialTilt(beta), f"exponential tilt, beta {beta:g}"


def audit(
    model: nn.Module,
    data: LoadedData,
    *,
    head: dict[str, Tensor] | None = None,
    features: tuple[Tensor, Tensor] | None = None,
    batch_size: int = 256,
    top_pairs: int = 5,
    seed: int = 0,
    device: str | torch.device | None = None,
    num_workers: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """The representation audit of a zoo encoder on ``data``'s test split (see the module doc).

    Args:
        model: a :class:`hscl_zoo.ContrastiveEncoder` (``encode``, ``project``, ``classifier``,
            ``pretrained_cfg``; ``training_summary`` for the run's temperature and hardening).
        data: labelled splits; only the test split is read.
        head: the linear probe, ``{"weight": (C, D), "bias": (C,)}`` on raw features (what
            :func:`hscl_zoo.probes.linear_probe` returns); default: ``model.classifier``.
        features: the test split's ``(features, labels)`` from ``model.encode`` with the eval
            transform, when already extracted (saves a pass).
        batch_size: test images per batch of the Assumption 1 meter (two views each).
        top_pairs: how many most-confused pairs to list.
        seed: seed of the batch order and of the augmentations.

    Returns:
        ``class_accuracy`` ({class name: %}), ``confused_pairs`` (class names, counts, rate %),
        ``alignment``, ``uniformity``, ``assumption_fraction``, ``assumption_anchors`` and
        ``protocol``; JSON-serialisable.
    """
    if not data.class_names:
        raise ValueError("the audit needs labels: this dataset is unlabelled.")
    test = data.test
    num_classes = len(data.class_names)
    parameters_device = next((p.device for p in model.parameters()), torch.device("cpu"))  # none: a fixed map
    target = torch.device(device) if device is not None else parameters_device
    cfg = model.pretrained_cfg
    if features is None:
        features = extract_features(model.encode, test, eval_transform(cfg), batch_size=batch_size, device=target,
                                    num_workers=num_workers, progress=progress)
    feats, labels = features
    weight, bias = (head["weight"], head["bias"]) if head is not None else (model.classifier.weight,
                                                                            model.classifier.bias)
    predictions = (feats.float() @ weight.detach().cpu().float().T + bias.detach().cpu().float()).argmax(dim=1)
    per_class = class_accuracy(predictions, labels, num_classes)
    pairs = confused_pairs(predictions, labels, num_classes, top=top_pairs)

    temperature, hardening, hardening_text = _run_hardening(model)
    meter = DiagnosticsMeter(temperature=temperature, hardening=hardening)
    augment = simclr_transform(int(cfg["input_size"][-1]), mean=cfg["mean"], std=cfg["std"])
    views = MultiViewDataset(test, augment, views=2, seed=seed)
    loader = torch.utils.data.DataLoader(views, batch_size=batch_size, shuffle=True, num_workers=num_workers,
                                         generator=torch.Generator().manual_seed(seed))
    projected = []
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for images, batch_labels, _ in tqdm(loader, desc="audit", disable=not progress, leave=False):
                b, v = images.shape[:2]
                z = model.project(images.to(target).flatten(0, 1)).float().view(b, v, -1)
                meter.update(z, batch_labels.to(target))
                projected.append(z.cpu())
    finally:
        model.train(was_training)
    z = torch.cat(projected).to(target)  # uniformity's N x N similarities run where the model does
    diagnostics = meter.compute()
    names = [str(name) for name in data.class_names]
    return {
        "split": data.spec.test_split,
        "images": len(test),
        "class_accuracy": dict(zip(names, per_class)),
        "confused_pairs": [{"classes": [names[p.pop("a")], names[p.pop("b")]], **p} for p in pairs],
        "alignment": alignment(z[:, 0], z[:, 1]),
        "uniformity": (uniformity(z[:, 0]) + uniformity(z[:, 1])) / 2,
        "assumption_fraction": diagnostics["assumption_fraction"],
        "assumption_anchors": diagnostics["diagnostics_anchors"],
        "protocol": {
            "predictions": "linear probe on frozen features, eval transform",
            "features": "L2-normalised projections (model.project)",
            "positive_pairs": "two SimCLR-augmented views of each test image",
            "alignment_alpha": 2,
            "uniformity_t": 2,
            "uniformity_pairs": "distinct test images, mean of the two views' values",
            "assumption_batches": f"shuffled test batches of {batch_size} images x 2 views",
            "assumption_temperature": temperature,
            "assumption_hardening": hardening_text,
            "seed": seed,
        },
    }
