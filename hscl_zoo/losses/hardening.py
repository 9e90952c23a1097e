"""Hardening functions: how much weight a negative gets from its similarity to the anchor.

A hardening function eta is non-negative and non-decreasing (Jiang et al., Definition 1). The
losses call it on the scaled similarity t = s / temperature and work with log(eta(t)), so each
provided function exposes `log_weight` directly; any other callable is accepted and its log is
taken with eta = 0 mapped to -inf (no weight).
"""

from __future__ import annotations

import math
from typing import Callable, Protocol, runtime_checkable

import torch
from torch import Tensor

HardeningFn = Callable[[Tensor], Tensor]


@runtime_checkable
class LogHardening(Protocol):
    """A hardening function that can give log(eta(t)) without forming eta(t)."""

    def log_weight(self, t: Tensor) -> Tensor: ...


class ExponentialTilt:
    """eta(t) = exp(beta * t): the exponential tilt of H-SCL(beta) and H-UCL (Robinson et al.)."""

    def __init__(self, beta: float) -> None:
        if not math.isfinite(beta) or beta < 0:
            raise ValueError(f"beta must be a finite number >= 0, got {beta!r}; the paper's grid is 0.1, 0.5, 1, 2, 5.")
        self.beta = float(beta)

    def __call__(self, t: Tensor) -> Tensor:
        return torch.exp(self.beta * t)

    def log_weight(self, t: Tensor) -> Tensor:
        return self.beta * t

    def __repr__(self) -> str:
        return f"ExponentialTilt(beta={self.beta})"


class LinearThresholdSchedule:
    """The paper's H-SCL(tau) schedule of the cosine threshold l over training.

    l(epoch) = start + (epoch - 1) / (epochs - 1) * (end - start) for epoch = 1..epochs, so the
    first epoch uses `start` and the last `end`; the paper's tau is exp(l / temperature). Call
    `set_epoch(epoch)` (1-based) at the start of every epoch.
    """

    def __init__(self, start: float, end: float, epochs: int) -> None:
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1 for a threshold schedule, got {epochs}.")
        for name, value in (("start", start), ("end", end)):
            if not -1.0 <= value <= 1.0:
                raise ValueError(f"threshold {name} is a cosine similarity and must lie in [-1, 1], got {value}.")
        self.start, self.end, self.epochs = float(start), float(end), int(epochs)
        self.epoch = 1

    def set_epoch(self, epoch: int) -> None:
        if not 1 <= epoch <= self.epochs:
            raise ValueError(f"epoch must lie in 1..{self.epochs} (1-based), got {epoch}.")
        self.epoch = int(epoch)

    @property
    def value(self) -> float:
        if self.epochs == 1:
            return self.start
        return self.start + (self.epoch - 1) / (self.epochs - 1) * (self.end - self.start)

    def __repr__(self) -> str:
        return f"LinearThresholdSchedule(start={self.start}, end={self.end}, epochs={self.epochs}, epoch={self.epoch})"


class Threshold:
    """eta = 1(s >= level) on the cosine similarity s, i.e. 1(e^t >= tau) with tau = exp(level / temperature).

    `level` is a float or a `LinearThresholdSchedule` whose current value is read at every call.
    """

    def __init__(self, level: float | LinearThresholdSchedule, temperature: float) -> None:
        if not isinstance(level, LinearThresholdSchedule):
            level = float(level)
            if not -1.0 <= level <= 1.0 and not math.isinf(level):
                raise ValueError(f"threshold is a cosine similarity and must lie in [-1, 1], got {level}.")
        self.level = level
        self.temperature = float(temperature)

    @property
    def current_level(self) -> float:
        return self.level.value if isinstance(self.level, LinearThresholdSchedule) else self.level

    def __call__(self, t: Tensor) -> Tensor:
        return (t * self.temperature >= self.current_level).to(t.dtype)

    def log_weight(self, t: Tensor) -> Tensor:
        hard = t * self.temperature >= self.current_level
        return torch.zeros_like(t).masked_fill(~hard, -math.inf)

    def __repr__(self) -> str:
        return f"Threshold(level={self.level!r}, temperature={self.temperature})"


def log_hardening_weight(eta: HardeningFn, t: Tensor) -> Tensor:
    """log(eta(t)), with zero weight as -inf and no NaN gradient where eta is 0."""
    if isinstance(eta, LogHardening):
        return eta.log_weight(t)
    weight = eta(t)
    if not isinstance(weight, Tensor) or weight.shape != t.shape:
        raise ValueError(
            "a hardening function must map a tensor of scaled similarities to a tensor of the same shape; "
            f"{eta!r} returned {type(weight).__name__} of shape {getattr(weight, 'shape', None)}."
        )
    if bool((weight < 0).any()) or not bool(torch.isfinite(weight).all()):
        raise ValueError(f"hardening function {eta!r} returned negative or non-finite weights; it must be non-negative and finite.")
    positive = weight > 0
    return torch.where(positive, torch.log(weight.clamp_min(torch.finfo(weight.dtype).tiny)), -math.inf)
