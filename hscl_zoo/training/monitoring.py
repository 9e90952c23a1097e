"""What the pretraining loop watches each epoch: the kNN monitor, the paper's diagnostics, and the
metrics file kept consistent with the checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import torch
from accelerate import Accelerator

from hscl_zoo.data.datasets import LoadedData, balanced_subset
from hscl_zoo.data.raw_images import RawImageDataset
from hscl_zoo.features import encode_uint8, extract_features
from hscl_zoo.losses.diagnostics import DiagnosticsMeter
from hscl_zoo.losses.hardening import ExponentialTilt
from hscl_zoo.losses.objective import ContrastiveLoss
from hscl_zoo.models import ContrastiveEncoder
from hscl_zoo.probes import knn_top1
from hscl_zoo.training.config import PretrainConfig

__all__ = ["collapse_warning", "diagnostics_meter", "monitor_split", "monitor_test_split", "KnnMonitor", "reduce_diagnostics",
           "read_metrics", "rewrite_metrics_upto"]


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


def monitor_test_split(test: datasets.Dataset, cfg: PretrainConfig) -> datasets.Dataset:
    """The `monitor_test_size` class-balanced test images the kNN monitor classifies (all by default)."""
    if cfg.monitor_test_size is None or len(test) <= cfg.monitor_test_size:
        return test
    return balanced_subset(test, cfg.monitor_test_size, seed=cfg.seed)


class KnnMonitor:
    """The per-epoch kNN monitor: top-1 of the test images (`monitor_test_split`) against a bank
    of training images (`monitor_split`), features from the encoder's `encode`.

    The images are decoded once, at construction, into uint8 tensors on `device` (the image cache
    of :class:`RawImageDataset`; 15,000 CIFAR images take 46 MB), and every call applies the
    encoder's evaluation transform to batches of them on the device, under bf16 autocast on CUDA.
    Decoding 15,000 images with PIL on the main process every epoch, while the other processes
    wait, cost about as much as a GPU epoch. Where the images are at the model's input size (the
    zoo trains at the native size) the transform only scales and normalises, as on PIL images;
    a resize runs torch's antialiased kernel, which differs slightly from PIL's. Splits whose
    images differ in size are read through `extract_features` every call instead.
    """

    def __init__(self, data: LoadedData, cfg: PretrainConfig, device: torch.device, *, batch_size: int = 512) -> None:
        self.splits = (monitor_split(data.labelled().train, cfg), monitor_test_split(data.test, cfg))
        self.k = cfg.knn_k
        self.device = device
        self.batch_size = batch_size
        try:
            self.images: list[torch.Tensor] | None = [
                RawImageDataset(split, cache=True).images.to(device) for split in self.splits
            ]
        except ValueError:
            self.images = None
        self.labels = [torch.as_tensor(split["label"], dtype=torch.int64) for split in self.splits]

    def __call__(self, encoder: ContrastiveEncoder) -> float:
        was_training = encoder.training
        encoder.eval()
        try:
            bank, test = (self._features(encoder, i) for i in range(2))
        finally:
            encoder.train(was_training)
        return knn_top1(bank, self.labels[0], test, self.labels[1], k=self.k, device=self.device)

    def _features(self, encoder: ContrastiveEncoder, index: int) -> torch.Tensor:
        if self.images is None:
            return extract_features(encoder.encode, self.splits[index], encoder.transform, device=self.device,
                                    progress=False)[0]
        return encode_uint8(encoder.encode, encoder.transform, self.images[index], batch_size=self.batch_size,
                            device=self.device, autocast_dtype=torch.bfloat16 if self.device.type == "cuda" else None)


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl file. A last line that does not parse (the run was killed
    while writing it) is dropped with a warning naming the file; a bad line before it raises
    ValueError naming the file and the line."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number < len(lines):
                raise ValueError(f"{path}, line {number}, is not a JSON record ({error}); the file was edited or "
                                 "damaged. Remove that line, or start again with --overwrite.") from None
            print(f"warning: {path}: dropped its last line, cut off mid-write: {line[:60]!r}", flush=True)
    return records


def rewrite_metrics_upto(path: Path, epoch: int) -> None:
    """Keep the records of epochs a checkpoint covers (a crash may have logged a later one, or
    cut the last line off)."""
    if not path.is_file():
        return
    kept = [record for record in read_metrics(path) if record["epoch"] <= epoch]
    path.write_text("".join(json.dumps(record) + "\n" for record in kept))


def reduce_diagnostics(accelerator: Accelerator, meter: DiagnosticsMeter) -> dict[str, float]:
    """Pool the per-process diagnostics with one all-reduce of the meter's summed state."""
    return meter.summarise(accelerator.reduce(meter.state().to(accelerator.device), reduction="sum"))


# 95 % of the negative pairs closer than this (neg_cos_q05) means a collapse: in the committed runs
# a healthy epoch never exceeds 0.78, the collapsed epoch-1 queue run sits at 0.97-0.99.
COLLAPSED_COSINE = 0.9


def collapse_warning(record: dict, cfg: PretrainConfig) -> str | None:
    """A warning when the epoch's diagnostics show the embeddings gathered onto one direction
    (the 5th percentile of the negatives' cosines at least `COLLAPSED_COSINE`), with what to change;
    None otherwise, or without diagnostics (no neg_cos_q05, or NaN: no other-label negative seen)."""
    q05 = record.get("neg_cos_q05")
    if q05 is None or not q05 >= COLLAPSED_COSINE:
        return None
    why = (f"queue_size={cfg.queue_size}: queue rows take a share of every anchor's negatives but are never "
           "pushed themselves, and a large share lets the embeddings collapse (docs/losses.md, 'The memory "
           "queue'); train without it, or reach more negatives with chunk_size (the gradient cache, exact)."
           if cfg.queue_size else "lower lr, or raise temperature.")
    return (f"warning: epoch {record['epoch']}: the embeddings are collapsing onto one direction: 95 % of the "
            f"negative pairs have cosine >= {q05:.3f} (neg_cos_q05 in metrics.jsonl). Likely cause: {why}")
