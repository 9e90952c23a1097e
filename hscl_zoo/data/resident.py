"""The training split resident on the device: batches gathered there, views made there.

With a DataLoader, every batch of a uint8 cache is gathered by a worker (or the main process),
collated, pinned and copied to the device, and the augmentation's random parameters are drawn
on the host and copied after it. On a fast accelerator that host work costs as much as the step.
:class:`ResidentBatches` instead copies the decoded split (:attr:`RawImageDataset.images
<hscl_zoo.data.raw_images.RawImageDataset>`, CIFAR's 50,000 training images are 150 MB as uint8)
and its labels to the device once, and each step gathers its images there by index. The only
host work of an epoch is its order: one permutation, drawn by :class:`~hscl_zoo.data.loaders.
SeededSampler` from ``(seed, epoch)`` and copied once. Paired with a
:class:`~hscl_zoo.data.device_augment.BatchSimCLRAugment` whose generator lives on the same device,
nothing inside an epoch waits for the device.

The order and the split over processes are those of the recipe's DataLoader path for one process:
batch ``s`` of process ``k`` (of ``P``) holds rows ``order[(s P + k) b : (s P + k + 1) b]`` of the
epoch's permutation, ``b`` the per-process batch size, and an incomplete last global batch is
dropped. On the CPU, with the augmenter's generator there too, one process's batches and views are
those of the DataLoader path, bit for bit (tested), so the two are interchangeable.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from hscl_zoo.data.loaders import SeededSampler

__all__ = ["ResidentBatches"]


class ResidentBatches:
    """Iterate ``(images, labels, index)`` batches of a uint8 image tensor kept on ``device``.

    Args:
        images: (N, 3, H, W) uint8, the decoded training split (on any device; copied once).
        labels: (N,) integer class ids (-1 for an unlabelled image).
        batch_size: images per process and step.
        device: where the split lives and the batches are made.
        seed: seed of the row order (the recipe's ``seed``).
        num_processes: processes sharing each global batch.
        process_index: this process's rank.

    One pass per ``iter``, ``len`` steps; :meth:`set_epoch` selects the epoch's order and
    :meth:`skip_first_batches` resumes within it. Returned tensors are on ``device``; ``index``
    holds the rows of the split.
    """

    def __init__(self, images: Tensor, labels: Tensor, batch_size: int, *, device: torch.device | str,
                 seed: int = 0, num_processes: int = 1, process_index: int = 0) -> None:
        if not isinstance(images, Tensor) or images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
            shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
            raise ValueError(f"images must be a uint8 tensor of shape (N, 3, H, W), got {shape}"
                             f"{f' {images.dtype}' if isinstance(images, Tensor) else ''}")
        if labels.shape != (images.shape[0],):
            raise ValueError(f"labels must have shape ({images.shape[0]},) to match the images, got {tuple(labels.shape)}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if not 0 <= process_index < num_processes:
            raise ValueError(f"process_index must lie in [0, {num_processes}), got {process_index!r}")
        self.device = torch.device(device)
        self.batch_size, self.num_processes, self.process_index = batch_size, num_processes, process_index
        self.images = images.to(self.device)
        self.labels = labels.to(self.device, torch.int64)
        self.sampler = SeededSampler(images.shape[0], seed=seed, shuffle=True)
        self._skip = 0
        if len(self) == 0:
            raise ValueError(f"{images.shape[0]} images make no full batch of {batch_size} x {num_processes} processes; "
                             "lower batch_size or use more images.")

    def __len__(self) -> int:
        return self.images.shape[0] // (self.batch_size * self.num_processes)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next pass yields."""
        self.sampler.set_epoch(epoch)

    def skip_first_batches(self, steps: int) -> ResidentBatches:
        """This pass starts at step ``steps`` of the epoch (a run resumed within it); returns self."""
        if not 0 <= steps <= len(self):
            raise ValueError(f"steps must lie in [0, {len(self)}], got {steps!r}")
        self._skip = steps
        return self

    def epoch_rows(self) -> Tensor:
        """(steps, batch_size) rows of this process's batches in the selected epoch, on the device;
        like the sampler, a pass moves on to the next epoch unless :meth:`set_epoch` selects one."""
        epoch, self.sampler.epoch = self.sampler.epoch, self.sampler.epoch + 1
        order = self.sampler.order(epoch)
        steps, b, P = len(self), self.batch_size, self.num_processes
        shards = order[: steps * P * b].view(steps, P, b)[:, self.process_index]
        return shards.to(self.device, non_blocking=True)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        rows, skip = self.epoch_rows(), self._skip
        self._skip = 0
        for step in range(skip, rows.shape[0]):
            index = rows[step]
            yield self.images.index_select(0, index), self.labels.index_select(0, index), index
