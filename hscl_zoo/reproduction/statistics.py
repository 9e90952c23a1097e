"""Paired comparisons over seeds: the same seed gives every method the same initialisation, batch
order and augmentations, so per-seed differences cancel most of the seed-to-seed variation."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from scipy.stats import t as student_t


@dataclass(frozen=True)
class PairedDifference:
    """Mean of per-seed differences a - b with a two-sided 95 % Student-t interval (None with one seed)."""

    seeds: tuple[int, ...]
    differences: tuple[float, ...]
    mean: float
    low: float | None
    high: float | None

    @property
    def n(self) -> int:
        return len(self.differences)

    def describe(self, unit: str = " points") -> str:
        """'+1.23 points [95 % CI +0.4, +2.1], 3 seeds' or the single difference."""
        if self.low is None:
            return f"{self.mean:+.2f}{unit} (1 seed, no interval)"
        return f"{self.mean:+.2f}{unit} [95 % CI {self.low:+.2f}, {self.high:+.2f}], {self.n} seeds"


def paired_difference(a: dict[int, float], b: dict[int, float]) -> PairedDifference | None:
    """Differences a[seed] - b[seed] over the seeds both have; None when they share none."""
    seeds = tuple(sorted(set(a) & set(b)))
    if not seeds:
        return None
    diffs = tuple(a[s] - b[s] for s in seeds)
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return PairedDifference(seeds, diffs, mean, None, None)
    half = student_t.ppf(0.975, len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return PairedDifference(seeds, diffs, mean, mean - half, mean + half)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def epochs_to_reach(curve: list[float], target: float) -> int | None:
    """First epoch (1-based) at which a per-epoch curve reaches `target`; None if it never does."""
    return next((i + 1 for i, value in enumerate(curve) if value >= target), None)
