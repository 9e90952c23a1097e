"""The pair-set vocabulary of the loss contract (docs/losses.md): which candidates an anchor takes
as positives and which as negatives. Plain names, importable without torch, so that the method
table (and through it the zoo registry) is read without loading torch."""

from __future__ import annotations

from typing import Literal

__all__ = ["Positives", "Negatives"]

Positives = Literal["views", "labels"]
Negatives = Literal["other-images", "other-labels"]
