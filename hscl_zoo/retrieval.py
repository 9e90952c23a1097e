"""Retrieval metrics of frozen features: Recall@K, Precision@1, MAP@R and mAP by cosine similarity.

Each query ranks the whole gallery by decreasing cosine similarity; a gallery item is relevant
when it has the query's label. With ``R`` the number of relevant gallery items of a query (the
query itself excluded when the gallery is the query split, "leave-one-out"):

- Recall@K: some relevant item is among the first K (the metric-learning Recall@K of Song et
  al., 2016, not the fraction of relevant items retrieved);
- Precision@1: the first item is relevant (equal to Recall@1);
- MAP@R (Musgrave et al., 2020, "A Metric Learning Reality Check"):
  ``(1/R) * sum_{i<=R} P(i) * rel(i)`` with ``P(i)`` the precision of the first i items;
- mAP: the same sum over every rank, i.e. average precision.

Queries with ``R = 0`` (their class is absent from the gallery, or a leave-one-out class of
one) have no defined score and are left out of every mean; the result counts them. Equal
similarities rank in gallery order (the earlier row first), so the numbers do not depend on the
chunking or the sorting algorithm; similarities are computed in float64, so that features whose
cosines differ only beyond float32's precision (an untrained encoder's, nearly parallel) still
rank by their true values. Scores are percentages in [0, 100], like the accuracies of
:mod:`hscl_zoo.evaluation`.

Queries are processed in chunks whose working memory (similarities, ranking and relevance of
one chunk against the whole gallery) stays under ``max_chunk_bytes``; no query x gallery matrix
is ever held whole, so 50,000 queries against a 10,000-image gallery fit in CPU memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["RECALL_KS", "retrieval_metrics"]

RECALL_KS = (1, 5, 10)
_BYTES_PER_CELL = 56  # per query x gallery cell: similarity, order, labels, relevance, hit counts, precisions


def retrieval_metrics(
    query_feats: Tensor,
    query_labels: Tensor,
    gallery_feats: Tensor | None = None,
    gallery_labels: Tensor | None = None,
    *,
    ks: Sequence[int] = RECALL_KS,
    max_chunk_bytes: int = 256 * 2**20,
    device: str | torch.device | None = None,
) -> dict[str, Any]:
    """Recall@K, Precision@1, MAP@R and mAP (%) of ``query_feats`` against a gallery.

    Args:
        query_feats: (Nq, D) features of the queries.
        query_labels: (Nq,) integer labels of the queries.
        gallery_feats: (Ng, D) features of the gallery; ``None`` with ``gallery_labels`` for
            leave-one-out within the query split (each query ranks the other queries).
        gallery_labels: (Ng,) integer labels of the gallery, or ``None`` (see ``gallery_feats``).
        ks: the K of Recall@K.
        max_chunk_bytes: bound on the working memory of one chunk of queries (256 MiB by default).
        device: where the similarities are computed (default: where the gallery features are).

    Returns:
        ``recall_at_{k}`` for each k, ``precision_at_1``, ``map_at_r``, ``map`` (%), and
        ``queries`` (scored), ``queries_without_match`` (left out, R = 0), ``gallery_size``
        and ``leave_one_out``.
    """
    leave_one_out = gallery_feats is None and gallery_labels is None
    if leave_one_out:
        gallery_feats, gallery_labels = query_feats, query_labels
    elif gallery_feats is None or gallery_labels is None:
        raise ValueError("pass both gallery_feats and gallery_labels, or neither for leave-one-out")
    _check(query_feats, query_labels, "query")
    _check(gallery_feats, gallery_labels, "gallery")
    if query_feats.shape[1] != gallery_feats.shape[1]:
        raise ValueError(f"query features have {query_feats.shape[1]} dims but gallery features "
                         f"{gallery_feats.shape[1]}; extract both with the same encoder")
    ks = tuple(int(k) for k in ks)
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be integers >= 1, got {ks!r}")
    target = gallery_feats.device if device is None else torch.device(device)
    gallery = F.normalize(gallery_feats.to(target, torch.float64), dim=1)
    g_labels = gallery_labels.to(target).long()
    size = len(gallery)
    chunk = max(1, int(max_chunk_bytes) // (_BYTES_PER_CELL * size))
    ranks = torch.arange(1, size + 1, device=target, dtype=torch.float64)
    sums = torch.zeros(len(ks) + 3, dtype=torch.float64, device=target)
    scored = 0
    for start in range(0, len(query_feats), chunk):
        queries = F.normalize(query_feats[start : start + chunk].to(target, torch.float64), dim=1)
        labels = query_labels[start : start + chunk].to(target).long()
        sims = queries @ gallery.T
        rows = torch.arange(len(queries), device=target)
        if leave_one_out:
            sims[rows, start + rows] = -torch.inf
        order = torch.sort(-sims, dim=1, stable=True).indices
        del sims
        relevant = g_labels[order] == labels[:, None]
        if leave_one_out:
            relevant[:, -1] = False  # the query itself, ranked last by its -inf similarity
        del order
        r = relevant.sum(dim=1)
        keep = r > 0
        relevant, r = relevant[keep], r[keep].to(torch.float64)
        precision = torch.where(relevant, relevant.cumsum(dim=1) / ranks, 0.0)
        within_r = ranks[None, :] <= r[:, None]
        sums += torch.stack([
            *(relevant[:, :k].any(dim=1).sum() for k in ks),
            relevant[:, 0].sum(),
            (torch.where(within_r, precision, 0.0).sum(dim=1) / r).sum(),
            (precision.sum(dim=1) / r).sum(),
        ]).to(torch.float64)
        scored += int(keep.sum())
    means = (100.0 * sums / scored).tolist() if scored else [float("nan")] * len(sums)
    result: dict[str, Any] = {f"recall_at_{k}": v for k, v in zip(ks, means)}
    result.update(precision_at_1=means[len(ks)], map_at_r=means[len(ks) + 1], map=means[len(ks) + 2])
    result.update(queries=scored, queries_without_match=len(query_feats) - scored, gallery_size=size - leave_one_out,
                  leave_one_out=leave_one_out)
    return result


def _check(feats: Tensor, labels: Tensor, name: str) -> None:
    if feats.ndim != 2 or len(feats) == 0:
        raise ValueError(f"{name} features must be a non-empty (N, D) tensor, got shape {tuple(feats.shape)}")
    if labels.ndim != 1 or len(labels) != len(feats):
        raise ValueError(f"{name} labels must be (N,) with N = {len(feats)} rows of features, got shape "
                         f"{tuple(labels.shape)}")
