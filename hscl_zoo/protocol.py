"""Choices that the command line shows and the modules behind it apply, importable without torch
so that ``hscl-zoo --help`` loads none: the evaluation protocol's defaults
(:mod:`hscl_zoo.evaluation`) and what an exported graph computes (:mod:`hscl_zoo.export`)."""

from __future__ import annotations

__all__ = ["EVAL_DEFAULTS", "OUTPUTS"]

EVAL_DEFAULTS = {"probe_epochs": 100, "knn_k": 20, "seed": 0}
"""Probe settings used when neither the caller nor the model's recipe config sets them."""

OUTPUTS = ("features", "projection", "logits")
"""What an exported graph computes: ``model.encode``, ``model.project`` or ``model(x)``."""
