"""A plain-loop implementation of the loss contract (docs/losses.md), written from the formulas.

Slow and obvious on purpose: the tests compare the vectorised losses with it, and
benchmarks/loss_bench.py times it as the naive baseline. Fed float64, it is the yardstick of the
float32 losses; `random_batch` and `trained_batch` make the float32 inputs of those comparisons.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

UNSUPERVISED = ("ucl", "hucl")


def reference_loss(
    features: torch.Tensor,
    labels: torch.Tensor | None,
    *,
    method: str,
    positives: str,
    temperature: float = 0.5,
    eta: Callable[[torch.Tensor], torch.Tensor] | None = None,
    tau_plus: float = 0.0,
    M: float | None = None,
    unlabelled: int = -1,
    unlabelled_negatives: bool = True,
    queue: tuple[torch.Tensor, torch.Tensor | None] | None = None,
    queue_positives: bool = False,
) -> torch.Tensor:
    """Mean over (anchor, positive) pairs of log(1 + M e^{-g_ip} E_i), E_i the eta-weighted mean
    of e^{g_ij} over anchor i's negatives. Returns a differentiable scalar.

    A label equal to `unlabelled` marks an image without a class: as anchor it has no label
    positives and every other image as negative; a labelled anchor of a method that uses labels
    has the unlabelled images as negatives unless `unlabelled_negatives` is False.

    `queue` (rows (K, d), labels (K,) or None) appends K candidates after the batch, each an image
    of its own and never an anchor; a same-label row is a positive only with `queue_positives`."""
    B, V, _ = features.shape
    rows, row_labels = queue if queue is not None else (features.new_zeros(0, features.shape[-1]), None)
    z = features / features.norm(dim=-1, keepdim=True)
    image = [b for b in range(B) for _ in range(V)] + [B + k for k in range(rows.shape[0])]
    flat = torch.cat([z.reshape(B * V, -1), rows / rows.norm(dim=-1, keepdim=True)])
    N = B * V
    label = [] if labels is None else [int(labels[a]) for a in image[:N]]
    label += [] if row_labels is None else [int(y) for y in row_labels]
    M = len(image) - 2 if M is None else M
    terms = []
    for i in range(N):
        def is_unlabelled(k: int) -> bool:
            return labels is not None and label[k] == unlabelled

        def same_label(j: int) -> bool:
            return labels is not None and not is_unlabelled(i) and label[j] == label[i]

        uses_labels = method not in UNSUPERVISED or positives == "labels"
        negatives = [
            j for j in range(len(image))
            if image[j] != image[i] and (method in UNSUPERVISED or not same_label(j))
            and (unlabelled_negatives or not uses_labels or is_unlabelled(i) or not is_unlabelled(j))
        ]
        positive = [
            j for j in range(len(image))
            if j != i and (image[j] == image[i]
                           or (positives == "labels" and same_label(j) and (j < N or queue_positives)))
        ]
        if not negatives or not positive:
            continue
        g = {j: flat[i] @ flat[j] / temperature for j in negatives + positive}
        weights = [1.0 if eta is None else eta(g[j]) for j in negatives]
        if sum(float(w.detach()) if isinstance(w, torch.Tensor) else w for w in weights) == 0:
            weights = [1.0] * len(negatives)
        mean = sum(w * torch.exp(g[j]) for w, j in zip(weights, negatives)) / sum(weights)
        for p in positive:
            e = mean
            if tau_plus > 0:
                e = torch.clamp((mean - tau_plus * torch.exp(g[p])) / (1 - tau_plus), min=math.exp(-1 / temperature))
            terms.append(torch.log1p(M * torch.exp(-g[p]) * e))
    if not terms:
        return features.sum() * 0
    return torch.stack(terms).mean()


def exp_tilt(beta: float) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda t: torch.exp(beta * t)


def threshold(level: float, temperature: float) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda t: (t * temperature >= level).to(t.dtype)


def random_batch(B: int, V: int, d: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 Gaussian features (B, V, d) and labels cycling through `classes`."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, V, d, generator=gen, dtype=torch.float32), torch.arange(B) % classes


def trained_batch(B: int, V: int, d: int, classes: int, seed: int, spread: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 features as a trained encoder gives them: each class a random direction, each image
    that direction plus noise of norm `spread` (1.0: distinct images; 0.1: a tight class), its V
    views the image plus noise of norm 1e-3. At a low temperature psi is then tiny: e^-10 to e^-30."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(B) % classes
    centres = torch.nn.functional.normalize(torch.randn(classes, d, generator=gen, dtype=torch.float64), dim=-1)
    noise = torch.nn.functional.normalize(torch.randn(B, d, generator=gen, dtype=torch.float64), dim=-1)
    images = torch.nn.functional.normalize(centres[labels] + spread * noise, dim=-1)
    views = images[:, None, :] + 1e-3 * torch.nn.functional.normalize(torch.randn(B, V, d, generator=gen, dtype=torch.float64), dim=-1)
    return views.float(), labels


# The precision cases (tests/test_precision.py, benchmarks/loss_precision.py): name ->
# (build_loss method, its keyword arguments, the reference's eta at a temperature, tau_plus).
PRECISION_CASES: dict[str, tuple[str, dict, Callable[[float], Callable | None], float]] = {
    "ucl": ("ucl", {}, lambda T: None, 0.0),
    "hucl": ("hucl", dict(beta=1.0), lambda T: exp_tilt(1.0), 0.0),
    "hucl-debiased": ("hucl", dict(beta=1.0, tau_plus=0.1), lambda T: exp_tilt(1.0), 0.1),
    "scl": ("scl", {}, lambda T: None, 0.0),
    "hscl-beta": ("hscl-beta", dict(beta=1.0), lambda T: exp_tilt(1.0), 0.0),
    "hscl-tau": ("hscl-tau", dict(threshold=0.0), lambda T: threshold(0.0, T), 0.0),
}


def reference_value_and_grad(features: torch.Tensor, labels: torch.Tensor | None, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference loss of the float64 copy of `features` and its gradient (kwargs as reference_loss)."""
    x = features.double().requires_grad_()
    value = reference_loss(x, labels, **kwargs)
    value.backward()
    return value.detach(), x.grad


def relative_errors(loss: Callable, features: torch.Tensor, labels: torch.Tensor | None, reference: torch.Tensor,
                    reference_grad: torch.Tensor) -> tuple[float, float]:
    """Relative error of loss(features, labels) against `reference`, and of its gradient against
    `reference_grad` as max |error| / max |reference entry|."""
    x = features.clone().requires_grad_()
    value = loss(x, labels)
    value.backward()
    value_err = abs(value.item() - reference.item()) / abs(reference.item())
    grad_err = ((x.grad.double() - reference_grad).abs().max() / reference_grad.abs().max()).item()
    return value_err, grad_err
