"""Tolerances derived from floating-point arithmetic, for results that two code paths (or two
thread counts) compute from the same formula in a different order.

A CPU kernel may sum in any order: blocked, vectorised, split over threads, or with the bias added
first or last. Only the same call on the same inputs with the same threads repeats its bits. When
two paths are compared, the gap they may show is bounded by the standard rounding-error analysis of
a sum (each of `n` terms passes through at most n - 1 roundings, unit roundoff u), and a decision
taken on such values (a comparison, a histogram bin, an argmax) may go either way only for values
within that gap of its boundary.
"""

from __future__ import annotations

import torch


def unit_roundoff(dtype: torch.dtype) -> float:
    """u: half the gap between 1 and the next number of `dtype` (2**-24 for float32)."""
    return torch.finfo(dtype).eps / 2


def reordered_sum_bound(magnitude: torch.Tensor | float, n_terms: int, dtype: torch.dtype) -> torch.Tensor | float:
    """The largest gap between two float sums of the same `n_terms` exact terms added in any two
    orders, where `magnitude` is the sum of the terms' absolute values.

    Each order lies within gamma_(n-1) * magnitude of the exact sum, gamma_k = k u / (1 - k u),
    so two orders lie within twice that of each other."""
    k = max(n_terms - 1, 0)
    u = unit_roundoff(dtype)
    if k * u >= 1:
        raise ValueError(f"{n_terms} terms of {dtype}: the bound k u / (1 - k u) needs k u < 1")
    return 2 * (k * u / (1 - k * u)) * magnitude


def dot_product_bound(magnitude: torch.Tensor | float, n_terms: int, dtype: torch.dtype) -> torch.Tensor | float:
    """The largest gap between two float dot products (or matrix products) of length `n_terms`
    computed in any two orders, `magnitude` the exact sum of |a_i b_i|: each product rounds once
    more than a plain sum's terms (gamma_n instead of gamma_(n-1)), in either order."""
    return reordered_sum_bound(magnitude, n_terms + 1, dtype)


def near_a_boundary(values: torch.Tensor, boundaries: torch.Tensor | float, distance: torch.Tensor | float) -> int:
    """How many `values` lie within `distance` of any of `boundaries`: the decisions that two
    computations of the values, each within `distance` of the other, may take differently."""
    values = values.reshape(-1, 1).double()
    edges = torch.as_tensor(boundaries, dtype=torch.float64).reshape(1, -1)
    gap = torch.as_tensor(distance, dtype=torch.float64).reshape(-1, 1)
    return int(((values - edges).abs() <= gap).any(dim=1).sum())


def undecided_argmax(logits: torch.Tensor, reach: torch.Tensor | float) -> torch.Tensor:
    """Rows of `logits` whose argmax another computation, each logit within `reach` of this one's,
    may pick differently: the largest and the second largest lie within twice the reach."""
    top2 = logits.topk(2, dim=1).values
    reach = torch.as_tensor(reach, dtype=logits.dtype)
    row_reach = reach.amax(dim=1) if reach.dim() == 2 else reach
    return top2[:, 0] - top2[:, 1] <= 2 * row_reach
