"""Seeded data loading: a row order and worker seeds that are pure functions of (seed, epoch)."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import DataLoader


def seed_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: seed Python's and NumPy's RNGs from the worker's torch seed.

    Torch seeds each worker from the loader's generator; this carries that seed over to
    ``random`` and ``numpy.random`` so transforms that use them are reproducible too.
    """
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


class SeededSampler(torch.utils.data.Sampler[int]):
    """Row order for one epoch as a pure function of ``(seed, epoch)``.

    With ``shuffle`` the order is a random permutation seeded by ``(seed, epoch)``, otherwise
    ``0..n-1``. :meth:`set_epoch` selects the epoch (Accelerate's prepared loaders call it from
    ``loader.set_epoch``); every pass also advances the epoch by one, so a loop that never calls
    it still reshuffles. Unlike a generator-driven ``RandomSampler``, the order does not
    depend on how many iterators were created before (persistent workers, resumed runs).
    """

    def __init__(self, num_rows: int, *, seed: int = 0, shuffle: bool = True) -> None:
        self.num_rows = int(num_rows)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next pass yields."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.num_rows

    def __iter__(self):
        epoch, self.epoch = self.epoch, self.epoch + 1
        return iter(self.order(epoch).tolist())

    def order(self, epoch: int) -> torch.Tensor:
        """Epoch ``epoch``'s row order as an int64 tensor (on the CPU)."""
        if not self.shuffle:
            return torch.arange(self.num_rows)
        state = np.random.SeedSequence([self.seed, int(epoch)]).generate_state(1, dtype=np.uint64)[0]
        generator = torch.Generator().manual_seed(int(state >> np.uint64(1)))
        return torch.randperm(self.num_rows, generator=generator)


class SeededLoader(DataLoader):
    """A DataLoader with ``set_epoch``, forwarded to its :class:`SeededSampler` and dataset."""

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch for the row order and, if the dataset has ``set_epoch``, the views."""
        if isinstance(self.sampler, SeededSampler):
            self.sampler.set_epoch(epoch)
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)


def make_loader(
    dataset: torch.utils.data.Dataset,
    batch_size: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    num_workers: int = 0,
    drop_last: bool = False,
    pin_memory: bool = False,
    persistent_workers: bool = False,
) -> SeededLoader:
    """A DataLoader whose batches are a pure function of ``seed`` and the epoch.

    Rows are ordered by a :class:`SeededSampler` (epoch k of two runs with the same seed gets
    the same order, whatever the worker settings), workers are seeded from a generator seeded
    with ``seed`` (see :func:`seed_worker`), and ``loader.set_epoch(epoch)`` selects the epoch
    for both the order and a :class:`MultiViewDataset`'s augmentations; call it before each
    epoch. ``persistent_workers`` is ignored when ``num_workers == 0`` (torch refuses the
    combination).
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers!r}")
    generator = torch.Generator()
    generator.manual_seed(int(seed))
    return SeededLoader(
        dataset,
        batch_size=batch_size,
        sampler=SeededSampler(len(dataset), seed=seed, shuffle=shuffle),
        num_workers=num_workers,
        drop_last=drop_last,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers and num_workers > 0,
        worker_init_fn=seed_worker,
        generator=generator,
    )
