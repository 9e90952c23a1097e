"""Choices that the command line shows and the modules behind it apply, importable without torch
so that ``hscl-zoo --help`` loads none: the evaluation protocol's defaults and metrics
(:mod:`hscl_zoo.evaluation`) and what an exported graph computes (:mod:`hscl_zoo.export`)."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["EVAL_DEFAULTS", "METRICS", "OUTPUTS", "check_metrics", "top5_phrase"]

EVAL_DEFAULTS = {"probe_epochs": 100, "knn_k": 20, "seed": 0}
"""Probe settings used when neither the caller nor the model's recipe config sets them."""

METRICS = ("linear", "knn", "retrieval", "audit")
"""What :func:`hscl_zoo.evaluation.evaluate_encoder` can measure: the linear probe, weighted kNN,
retrieval of the test split against the training split (:mod:`hscl_zoo.retrieval`) and the
representation audit (:mod:`hscl_zoo.audit`, which reads the probe's predictions)."""


def check_metrics(metrics: Iterable[str]) -> tuple[str, ...]:
    """``metrics`` in :data:`METRICS` order; raises ``ValueError`` for an unknown one, none, or an
    audit without the linear probe."""
    metrics = tuple(metrics)
    unknown = [m for m in metrics if m not in METRICS]
    if unknown or not metrics:
        raise ValueError(f"unknown metrics {unknown or metrics!r}; choose from {', '.join(METRICS)} "
                         "(e.g. linear,knn,retrieval).")
    if "audit" in metrics and "linear" not in metrics:
        raise ValueError("the audit reads the linear probe's predictions: add linear to the metrics.")
    return tuple(m for m in METRICS if m in metrics)


OUTPUTS = ("features", "projection", "logits")
"""What an exported graph computes: ``model.encode``, ``model.project`` or ``model(x)``."""


def top5_phrase(top5: float, num_classes: int) -> str | None:
    """``"top-5 X.XX%"`` for a printed summary, or None with 5 classes or fewer: the top-k accuracy
    (k = min(5, classes)) is then over every class, always 100 %, and would read as a score."""
    return f"top-5 {top5:.2f}%" if num_classes > 5 else None
