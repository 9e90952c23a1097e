"""Training images as uint8 tensors, for augmentation on the device: workers only decode.

:class:`RawImageDataset` returns ``(uint8 image (3, H, W), label, index)`` with no augmentation,
or serves every row from a uint8 tensor decoded once (``cache=True``; CIFAR-10 train is 150 MB
as uint8); :class:`hscl_zoo.data.device_augment.BatchSimCLRAugment` then makes the views.
"""

from __future__ import annotations

import math
import multiprocessing
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import PIL.Image
import torch
from torch import Tensor

from hscl_zoo.data.datasets import require_internal_columns
from hscl_zoo.data.views import MultiViewDataset

__all__ = ["RawImageDataset", "decode_image", "cache_placement", "workers_need_shared_memory", "shared_memory_free",
           "batches_in_flight_warning"]

SHM = Path("/dev/shm")
SHM_HEADROOM = 0.8


def workers_need_shared_memory(num_workers: int) -> bool:
    """Whether DataLoader workers can reach a tensor only through shared memory: with workers
    started by ``fork`` (Linux's default) they inherit the parent's memory, copy-on-write, and
    read the cache without a copy; ``spawn`` / ``forkserver`` workers receive it pickled, which
    torch does through shared memory."""
    return num_workers > 0 and multiprocessing.get_start_method() != "fork"


def shared_memory_free(path: Path = SHM) -> int | None:
    """Free bytes of the shared-memory filesystem (None where there is none)."""
    return shutil.disk_usage(path).free if path.is_dir() else None


def cache_placement(nbytes: int, *, share: bool, shm_free: int | None) -> str:
    """Where a cache of `nbytes` goes: "private" memory (no sharing needed), "shared" memory
    (fits in 80% of `shm_free`), or "none" (sharing is needed and does not fit: decode per row).

    Containers often mount a 64 MiB /dev/shm; a 1.2 GB Tiny ImageNet cache there would die with
    SIGBUS on first touch rather than fail cleanly, hence the check before allocating."""
    if not share:
        return "private"
    if shm_free is not None and nbytes <= SHM_HEADROOM * shm_free:
        return "shared"
    return "none"


def batches_in_flight_warning(batch_bytes: int, *, num_workers: int, prefetch_factor: int = 2,
                              shm_free: int | None) -> str | None:
    """A warning when the batches DataLoader workers hold ready (``num_workers x prefetch_factor``
    of ``batch_bytes`` each, handed to the main process through /dev/shm) would not fit in 80 % of
    the free shared memory, where a worker dies with a bus error mid-epoch; None otherwise."""
    if num_workers == 0 or shm_free is None:
        return None
    in_flight = num_workers * prefetch_factor * batch_bytes
    if in_flight <= SHM_HEADROOM * shm_free:
        return None
    mib = 2**20
    return (f"warning: {num_workers} DataLoader workers x {prefetch_factor} batches x {batch_bytes / mib:.1f} MiB = "
            f"{in_flight / mib:.0f} MiB of batches pass through /dev/shm, which has {shm_free / mib:.0f} MiB free: a "
            "worker may die with a bus error. Give the container more shared memory (docker run --shm-size 4g), use "
            "fewer num_workers, or gpu_augment (the workers then pass uint8 images, 4x smaller than float views).")


def decode_image(image: Any) -> Tensor:
    """A decoded image (PIL, HWC uint8 array, or CHW uint8 tensor) as a (3, H, W) uint8 tensor."""
    if isinstance(image, PIL.Image.Image):
        array = np.array(image.convert("RGB") if image.mode != "RGB" else image, dtype=np.uint8)
        return torch.from_numpy(array).permute(2, 0, 1).contiguous()
    if isinstance(image, np.ndarray):
        array = image if image.ndim == 3 else image[..., None]
        if array.shape[-1] == 1:
            array = np.repeat(array, 3, axis=-1)
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.uint8)).permute(2, 0, 1).contiguous()
    if isinstance(image, Tensor) and image.dtype == torch.uint8 and image.ndim == 3:
        return image.expand(3, -1, -1).contiguous() if image.shape[0] == 1 else image
    raise TypeError(f"cannot decode {type(image).__name__} into a uint8 image tensor; pass a PIL image or a uint8 array")


class RawImageDataset(torch.utils.data.Dataset):
    """Rows of a ``datasets.Dataset`` (columns ``image``, ``label``) as uint8 tensors, no augmentation.

    Item ``i`` is ``(image, label, i)`` with ``image`` a (3, H, W) uint8 tensor: DataLoader
    workers only decode, and :class:`BatchSimCLRAugment` makes the views on the device. With
    ``label_positive=True`` the item holds ``views`` images (views, 3, H, W): row ``i`` and
    partners drawn as :class:`hscl_zoo.data.views.MultiViewDataset` draws them (a function of
    ``(seed, epoch, i)``; call :meth:`set_epoch`), and the augmenter makes one view of each.

    ``cache=True`` decodes every row once, at construction, into one uint8 tensor
    (``images``: (N, 3, H, W); CIFAR-10 train is 150 MB), so workers, or the main process with
    ``num_workers=0``, only index it; :meth:`__getitems__` fetches a whole batch with one
    gather. Batching needs every image to have the same size (true of the zoo's datasets).
    ``share=True`` (pass :func:`workers_need_shared_memory`) puts it in shared memory when
    /dev/shm has room, and otherwise warns and leaves the rows to be decoded on demand
    (``cached`` is then False); see :func:`cache_placement`.
    """

    def __init__(
        self,
        dataset: datasets.Dataset,
        *,
        cache: bool = False,
        share: bool = False,
        label_positive: bool = False,
        views: int = 2,
        seed: int = 0,
    ) -> None:
        require_internal_columns(dataset, "RawImageDataset")
        self.dataset = dataset
        self.labels = np.asarray(dataset.select_columns(["label"])["label"], dtype=np.int64)
        self.label_positive = label_positive
        self._planner = (
            MultiViewDataset(dataset, _no_transform, views=views, label_positive=True, seed=seed)
            if label_positive else None
        )
        self.images: Tensor | None = self._decode_all(share) if cache else None

    def _decode_all(self, share: bool) -> Tensor | None:
        first = decode_image(self.dataset[0]["image"])
        shape = (len(self.dataset), *first.shape)
        nbytes = math.prod(shape)
        free = shared_memory_free()
        placement = cache_placement(nbytes, share=share, shm_free=free)
        if placement == "none":
            warnings.warn(
                f"RawImageDataset: the uint8 cache ({nbytes / 2**20:.0f} MiB) must be in shared memory for workers "
                f"started by {multiprocessing.get_start_method()!r}, and {SHM} has "
                f"{'no' if free is None else f'{free / 2**20:.0f} MiB'} free: the images are decoded per row "
                "instead. Give the container more shared memory (docker run --shm-size 4g), or use num_workers 0, "
                "or fork-started workers.",
                stacklevel=3,
            )
            return None
        out = torch.empty(shape, dtype=torch.uint8)
        if placement == "shared":
            out.share_memory_()
        row = 0
        for chunk in self.dataset.select_columns(["image"]).iter(batch_size=1024):
            for image in chunk["image"]:
                decoded = decode_image(image)
                if decoded.shape != first.shape:
                    raise ValueError(
                        f"cache=True needs images of one size; row {row} is {tuple(decoded.shape)}, row 0 {tuple(first.shape)}"
                    )
                out[row] = decoded
                row += 1
        return out

    @property
    def cached(self) -> bool:
        return self.images is not None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the label-positive partner draws (no effect otherwise)."""
        if self._planner is not None:
            self._planner.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.labels)

    def _image(self, row: int) -> Tensor:
        return self.images[row] if self.images is not None else decode_image(self.dataset[row]["image"])

    def __getitem__(self, index: int) -> tuple[Tensor, int, int]:
        index = int(index)
        if not 0 <= index < len(self.labels):
            raise IndexError(f"index {index} out of range for {len(self.labels)} rows")
        if self._planner is None:
            image = self._image(index)
        else:
            image = torch.stack([self._image(src) for src in self._planner.view_sources(index)])
        return image, int(self.labels[index]), index

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Tensor, int, int]]:
        """A batch of items; with the cache and no pairing, one gather instead of one lookup per row."""
        if self.images is None or self._planner is not None:
            return [self[i] for i in indices]
        rows = torch.as_tensor(list(indices), dtype=torch.int64)
        if len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= len(self.labels)):
            raise IndexError(f"indices out of range for {len(self.labels)} rows")
        batch = self.images.index_select(0, rows)
        return [(image, int(self.labels[i]), int(i)) for image, i in zip(batch.unbind(0), rows.tolist())]


def _no_transform(image: Any) -> Any:
    return image
