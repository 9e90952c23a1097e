"""What the pretraining loop watches each epoch: the kNN monitor, the paper's diagnostics, and the
metrics file kept consistent with the checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import torch
from accelerate import Accelerator

from hscl_zoo.data.datasets import LoadedData, balanced_subset
from hscl_zoo.evaluation import extract_features, knn_top1
from hscl_zoo.losses.diagnostics import DiagnosticsMeter
from hscl_zoo.losses.hardening import ExponentialTilt
from hscl_zoo.losses.objective import ContrastiveLoss
from hscl_zoo.models import ContrastiveEncoder
from hscl_zoo.training.config import PretrainConfig

__all__ = ["diagnostics_meter", "monitor_split", "monitor_knn", "reduce_diagnostics", "rewrite_metrics_upto"]


def diagnostics_meter(cfg: PretrainConfig, loss_fn: ContrastiveLoss) -> DiagnosticsMeter:
    """The paper's diagnostics with the run's own hardening (H-SCL(tau)'s threshold at its current
    level, H-SCL(beta)'s tilt, ...); a method with uniform weights is watched with the exponential
    tilt of the config's beta."""
    hardening = loss_fn.hardening if loss_fn.hardening is not None else ExponentialTilt(cfg.beta)
    return DiagnosticsMeter(temperature=cfg.temperature, hardening=hardening)


def monitor_split(train: datasets.Dataset, cfg: PretrainConfig) -> datasets.Dataset:
    """The fixed, class-balanced part of the training split the kNN monitor uses as its bank
    (parquet splits are often sorted by class, so a leading slice would hold few classes)."""
    if cfg.monitor_train_size is None or len(train) <= cfg.monitor_train_size:
        return train
    return balanced_subset(train, cfg.monitor_train_size, seed=cfg.seed)


def monitor_knn(encoder: ContrastiveEncoder, data: LoadedData, cfg: PretrainConfig, device: torch.device) -> float:
    """kNN top-1 on `monitor_test_size` class-balanced test images (all by default), from
    `monitor_split` of the labelled training images: the per-epoch monitor."""
    train = monitor_split(data.labelled().train, cfg)
    test = data.test
    if cfg.monitor_test_size is not None and len(test) > cfg.monitor_test_size:
        test = balanced_subset(test, cfg.monitor_test_size, seed=cfg.seed)
    was_training = encoder.training
    encoder.eval()
    try:
        train_f, train_y = extract_features(encoder.encode, train, encoder.transform, device=device, progress=False)
        test_f, test_y = extract_features(encoder.encode, test, encoder.transform, device=device, progress=False)
    finally:
        encoder.train(was_training)
    return knn_top1(train_f, train_y, test_f, test_y, k=cfg.knn_k)


def rewrite_metrics_upto(path: Path, epoch: int) -> None:
    """Keep the lines of epochs a checkpoint covers (a crash may have logged a later one)."""
    if not path.is_file():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["epoch"] <= epoch]
    path.write_text("".join(line + "\n" for line in kept))


def reduce_diagnostics(accelerator: Accelerator, meter: DiagnosticsMeter) -> dict[str, float]:
    """Pool the per-process diagnostics with one all-reduce of the meter's summed state."""
    return meter.summarise(accelerator.reduce(meter.state().to(accelerator.device), reduction="sum"))
