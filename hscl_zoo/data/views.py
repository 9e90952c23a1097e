"""Training views: a dataset of V augmented views per image, reproducible under any loader.

Reproducibility contract: the augmentation of row ``i`` in epoch ``e`` is a pure function of
``(seed, e, i)``. :class:`MultiViewDataset` seeds torch's RNG per item from those three numbers
(restoring the caller's RNG state afterwards), so the views do not depend on the number of
DataLoader workers, on which worker gets which item, or on how many processes share the data.
:func:`hscl_zoo.data.loaders.make_loader` orders rows by ``(seed, epoch)`` too, so two runs with
the same seeds see identical batches, and a run resumed at epoch k sees the batches of an
uninterrupted one.
"""

from __future__ import annotations

from typing import Any

import datasets
import numpy as np
import torch

from hscl_zoo.data.datasets import require_internal_columns
from hscl_zoo.data.sources import UNLABELLED
from hscl_zoo.data.transforms import ImageTransform


class MultiViewDataset(torch.utils.data.Dataset):
    """A ``datasets.Dataset`` (columns ``image``, ``label``) as V augmented views per image.

    Item ``i`` is ``(views, label, index)``: ``views`` a float tensor (V, 3, H, W), ``label`` the
    int class of row ``i``, ``index`` = ``i`` (the image id the loss uses for same-image
    positives). With ``label_positive=True`` (the paper's label-positive pairing) view 0 comes
    from row ``i`` and views 1..V-1 each from a row drawn uniformly among the *other* rows of
    the same class (row ``i`` itself only when its class has one row, or when its label is -1:
    an unlabelled image has no class, so all its views come from it).

    All randomness (augmentation and partner draws) is a function of ``(seed, epoch, i)``; call
    :meth:`set_epoch` before iterating each epoch. The epoch lives in shared memory, so it also
    reaches persistent DataLoader workers.
    """

    def __init__(
        self,
        dataset: datasets.Dataset,
        transform: ImageTransform,
        *,
        views: int = 2,
        label_positive: bool = False,
        seed: int = 0,
    ) -> None:
        require_internal_columns(dataset, "MultiViewDataset")
        if not isinstance(views, int) or views < 1:
            raise ValueError(f"views must be a positive integer, got {views!r}")
        if label_positive and views < 2:
            raise ValueError("label_positive=True needs views >= 2 (view 0 is the anchor image)")
        self.dataset = dataset
        self.transform = transform
        self.views = views
        self.label_positive = label_positive
        self.seed = int(seed)
        self.labels = np.asarray(dataset.select_columns(["label"])["label"], dtype=np.int64)
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._pools: dict[int, np.ndarray] = {}
        if label_positive:
            order = np.argsort(self.labels, kind="stable")
            classes, starts = np.unique(self.labels[order], return_index=True)
            for c, chunk in zip(classes, np.split(order, starts[1:])):
                self._pools[int(c)] = chunk

    @property
    def epoch(self) -> int:
        """The epoch whose views :meth:`__getitem__` returns."""
        return int(self._epoch.item())

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (fresh augmentations and partners, reproducible per epoch)."""
        self._epoch.fill_(int(epoch))

    def __len__(self) -> int:
        return len(self.dataset)

    def view_sources(self, index: int) -> list[int]:
        """Row of the dataset each view of item ``index`` is cut from, in the current epoch."""
        return self._plan(index)[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        index = int(index)
        sources, torch_seed = self._plan(index)
        images: dict[int, Any] = {}
        cpu_rng = torch.default_generator
        saved_state = cpu_rng.get_state()
        cpu_rng.manual_seed(torch_seed)
        try:
            out = []
            for src in sources:
                if src not in images:
                    images[src] = self.dataset[src]["image"]
                out.append(self.transform(images[src]))
        finally:
            cpu_rng.set_state(saved_state)
        return torch.stack(out), int(self.labels[index]), index

    def _plan(self, index: int) -> tuple[list[int], int]:
        if not 0 <= index < len(self.labels):
            raise IndexError(f"index {index} out of range for {len(self.labels)} rows")
        sequence = np.random.SeedSequence([self.seed, self.epoch, index])
        torch_seed = int(sequence.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))
        if not self.label_positive or self.labels[index] == UNLABELLED:
            return [index] * self.views, torch_seed
        rng = np.random.default_rng(sequence.spawn(1)[0])
        pool = self._pools[int(self.labels[index])]
        sources = [index]
        for _ in range(self.views - 1):
            if len(pool) == 1:
                sources.append(index)
                continue
            pick = int(pool[rng.integers(len(pool) - 1)])
            sources.append(pick if pick != index else int(pool[-1]))
        return sources, torch_seed
