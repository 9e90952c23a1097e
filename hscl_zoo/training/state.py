"""What a pretraining run has while it trains, in two objects the loop passes around.

:class:`TrainingParts` is what `hscl_zoo.training.setup.prepare_training` builds (the encoder,
the prepared model, the batches, the augmenter, the loss, the optimiser), :class:`RunState` the run
around them (its config, accelerator, folder, data, monitor, device plan and stop signal), and
:class:`EpochStart` where a pass over an epoch begins (a run resumed within it). Adding something a
run needs means adding a field here, not a parameter to every function of the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import Dataset

from hscl_zoo.data.datasets import LoadedData
from hscl_zoo.data.device_augment import BatchSimCLRAugment
from hscl_zoo.losses.objective import ContrastiveLoss
from hscl_zoo.models import ContrastiveEncoder
from hscl_zoo.training.config import PretrainConfig
from hscl_zoo.training.monitoring import KnnMonitor
from hscl_zoo.training.preemption import StopOnSignal

__all__ = ["EpochStart", "RunState", "TrainingParts"]


@dataclass
class TrainingParts:
    """What the epochs train with, built by `prepare_training`: the encoder (whose weights the
    run exports), the prepared model, the batches (a seeded loader, or the split resident on the
    device) and the training set behind them, the device augmenter (None when DataLoader workers
    augment), the (possibly compiled) forward, the optimiser, the loss and the resolved fast-path
    switches."""

    encoder: ContrastiveEncoder | None
    model: torch.nn.Module | None
    train_set: Dataset | None
    augment: BatchSimCLRAugment | None
    loader: Any
    forward: Callable[[torch.Tensor], torch.Tensor]
    optimizer: torch.optim.Optimizer
    loss_fn: ContrastiveLoss
    fast: dict[str, bool] = field(default_factory=lambda: {"channels_last": False})


@dataclass
class RunState:
    """A run while it trains: `cfg` (the resolved config), the `accelerator`, the `parts` it trains
    with, the device `plan` (``sync_batchnorm``, ``diagnostics_every``: `PretrainConfig.device_plan`),
    the run folder (None: nothing is written, as in a benchmark's bare epochs), the loaded `data`
    and the main process's kNN `monitor`, the `stop` signal watcher, and whether it `resume`s from
    the folder's latest checkpoint."""

    cfg: PretrainConfig
    accelerator: Accelerator
    parts: TrainingParts
    plan: dict[str, Any] = field(default_factory=lambda: {"diagnostics_every": 1})
    run_dir: Path | None = None
    data: LoadedData | None = None
    monitor: KnnMonitor | None = None
    stop: StopOnSignal | None = None
    resume: bool = False

    @property
    def epoch_steps(self) -> int | None:
        """Steps in a whole epoch (the batches' length; None for a stream of unknown length)."""
        try:
            return len(self.parts.loader)
        except TypeError:
            return None


@dataclass
class EpochStart:
    """Where a pass over an epoch begins: at `step` (0: its first), after steps whose losses summed
    to `loss_sum` and whose diagnostics sums, pooled over processes, were `diagnostics` (None:
    none carried), as a checkpoint taken within the epoch saved them."""

    step: int = 0
    loss_sum: float = 0.0
    diagnostics: list[float] | None = None
