"""Views of images: SimCLR augmentations, the evaluation transform, multi-view datasets, loaders.

Reproducibility contract: the augmentation of row ``i`` in epoch ``e`` is a pure function of
``(seed, e, i)``. :class:`MultiViewDataset` seeds torch's RNG per item from those three numbers
(restoring the caller's RNG state afterwards), so the views do not depend on the number of
DataLoader workers, on which worker gets which item, or on how many processes share the data.
:func:`make_loader` orders rows by ``(seed, epoch)`` too, so two runs with the same seeds see
identical batches, and a run resumed at epoch k sees the batches of an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import datasets
import numpy as np
import PIL.Image
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision.transforms import InterpolationMode, v2

from hscl_zoo.data import require_internal_columns

ImageTransform = Callable[[Any], torch.Tensor]

_INTERPOLATIONS = {
    "nearest": InterpolationMode.NEAREST,
    "bilinear": InterpolationMode.BILINEAR,
    "bicubic": InterpolationMode.BICUBIC,
}
_CROP_MODES = ("center", "squash")


class ToRGB:
    """Make a PIL image (any mode) or a 1-channel image tensor 3-channel RGB."""

    def __call__(self, image: Any) -> Any:
        if isinstance(image, PIL.Image.Image):
            return image if image.mode == "RGB" else image.convert("RGB")
        if isinstance(image, torch.Tensor) and image.ndim == 3 and image.shape[0] == 1:
            return image.expand(3, -1, -1)
        return image

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RandomGaussianBlur:
    """Blur a float image tensor (C, H, W) with probability ``p``, sigma uniform in ``sigma``.

    Same result as torchvision's ``gaussian_blur`` (normalised Gaussian taps, reflect padding),
    computed as two separable passes of shifted sums instead of ``conv2d``: on small images
    ``conv2d`` is slower, and on a loaded machine its intra-op threads made a 16x16 view take
    about 24 ms instead of 0.4 ms. Randomness comes from torch's global RNG.
    """

    def __init__(self, kernel_size: int, sigma: tuple[float, float] = (0.1, 2.0), p: float = 0.5) -> None:
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be a positive odd integer, got {kernel_size!r}")
        if not 0 < sigma[0] <= sigma[1]:
            raise ValueError(f"sigma must be a range (low, high) with 0 < low <= high, got {sigma!r}")
        self.kernel_size = kernel_size
        self.sigma = sigma
        self.p = p

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if torch.rand(1).item() >= self.p:
            return image
        sigma = torch.empty(1).uniform_(self.sigma[0], self.sigma[1]).item()
        return gaussian_blur(image.as_subclass(torch.Tensor), self.kernel_size, sigma)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kernel_size={self.kernel_size}, sigma={self.sigma}, p={self.p})"


def gaussian_blur(image: torch.Tensor, kernel_size: int, sigma: float) -> torch.Tensor:
    """Gaussian blur of a float tensor (..., H, W) with reflect padding (see RandomGaussianBlur)."""
    offsets = torch.arange(kernel_size, dtype=image.dtype) - (kernel_size - 1) / 2
    taps = torch.exp(-0.5 * (offsets / sigma) ** 2)
    weights = (taps / taps.sum()).tolist()
    pad = kernel_size // 2
    height, width = image.shape[-2:]
    flat = image.reshape(-1, height, width).unsqueeze(0)
    padded = F.pad(flat, (pad, pad, pad, pad), mode="reflect").squeeze(0)
    rows = sum(padded[..., :, j : j + width] * w for j, w in enumerate(weights))
    out = sum(rows[..., j : j + height, :] * w for j, w in enumerate(weights))
    return out.reshape(image.shape)


def blur_kernel_size(image_size: int) -> int:
    """SimCLR's Gaussian-blur kernel: about 10% of the image side, odd, at least 3."""
    size = int(0.1 * image_size)
    return max(3, size if size % 2 == 1 else size + 1)


def simclr_transform(
    image_size: int,
    *,
    mean: Sequence[float],
    std: Sequence[float],
    strength: float = 1.0,
    blur: bool = True,
    scale: tuple[float, float] = (0.08, 1.0),
    blur_p: float = 0.5,
) -> ImageTransform:
    """The SimCLR augmentation: one random view of a PIL image as a normalised float tensor.

    In order: random resized crop to ``image_size`` (area fraction in ``scale``, aspect ratio
    3/4..4/3, bilinear), horizontal flip (p=0.5), colour jitter with brightness, contrast and
    saturation ``0.4 * strength`` and hue ``0.1 * strength`` applied with p=0.8, grayscale
    (p=0.2), then, if ``blur``, a Gaussian blur with p=``blur_p``, kernel
    :func:`blur_kernel_size` (10% of the side, as in SimCLR) and sigma uniform in [0.1, 2.0];
    finally scaling to [0, 1] and normalising with ``mean``/``std``.

    Args:
        image_size: output side length in pixels.
        mean: per-channel mean for normalisation (e.g. ``DatasetSpec.mean``).
        std: per-channel standard deviation for normalisation.
        strength: colour-jitter strength s (SimCLR's s; 0 disables jitter).
        blur: include the random Gaussian blur (the paper lists blur among its augmentations).
        scale: area range of the random resized crop.
        blur_p: probability of blurring a view.

    Returns:
        A callable mapping a PIL image (any mode; converted to RGB) to a (3, image_size,
        image_size) float32 tensor. Its randomness comes from torch's global RNG.
    """
    if image_size < 1:
        raise ValueError(f"image_size must be a positive integer, got {image_size!r}")
    if strength < 0:
        raise ValueError(f"strength must be >= 0, got {strength!r}")
    _check_stats(mean, std)
    ops: list[Callable[[Any], Any]] = [
        ToRGB(),
        v2.RandomResizedCrop(image_size, scale=scale, antialias=True),
        v2.RandomHorizontalFlip(),
    ]
    if strength > 0:
        jitter = v2.ColorJitter(0.4 * strength, 0.4 * strength, 0.4 * strength, 0.1 * strength)
        ops.append(v2.RandomApply([jitter], p=0.8))
    ops += [v2.RandomGrayscale(p=0.2), v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]
    if blur:
        ops.append(RandomGaussianBlur(blur_kernel_size(image_size), sigma=(0.1, 2.0), p=blur_p))
    ops.append(v2.Normalize(mean=list(mean), std=list(std)))
    return v2.Compose(ops)


def eval_transform(pretrained_cfg: Mapping[str, Any] | Any) -> ImageTransform:
    """Deterministic preprocessing from a model's preprocessing config (timm-style keys).

    This is the single definition of evaluation preprocessing: models expose it as
    ``model.transform`` and feature extraction for kNN and the linear probe uses it.

    Keys (a mapping, or a dataclass such as timm's ``PretrainedCfg``):
        mean, std: per-channel normalisation (required).
        input_size: ``(3, H, W)`` (required).
        interpolation: ``"bilinear"`` (default), ``"bicubic"`` or ``"nearest"``.
        crop_pct: fraction of the resized image kept by the centre crop; default 1.0.
        crop_mode: ``"center"`` (default): resize the shorter side to ``floor(H / crop_pct)``,
            then centre-crop ``(H, W)``; ``"squash"``: resize to ``floor((H, W) / crop_pct)``
            ignoring aspect ratio, then centre-crop.

    With crop_pct 1.0 and images already at ``(H, W)`` the geometry is the identity, so
    32x32 CIFAR images are only converted and normalised.
    """
    cfg = _as_mapping(pretrained_cfg)
    missing = [k for k in ("mean", "std", "input_size") if k not in cfg or cfg[k] is None]
    if missing:
        raise ValueError(
            f"pretrained_cfg lacks {missing}; it needs mean, std and input_size (3, H, W), "
            f"got keys {sorted(cfg)}"
        )
    input_size = tuple(int(v) for v in cfg["input_size"])
    if len(input_size) != 3 or input_size[0] != 3 or min(input_size) < 1:
        raise ValueError(f"input_size must be (3, H, W), got {cfg['input_size']!r}")
    height, width = input_size[1:]
    interpolation_name = cfg.get("interpolation") or "bilinear"
    if interpolation_name not in _INTERPOLATIONS:
        raise ValueError(
            f"interpolation {interpolation_name!r} is not supported; use one of "
            f"{sorted(_INTERPOLATIONS)}"
        )
    crop_pct = float(cfg.get("crop_pct") or 1.0)
    if not 0 < crop_pct <= 1:
        raise ValueError(f"crop_pct must be in (0, 1], got {crop_pct!r}")
    crop_mode = cfg.get("crop_mode") or "center"
    if crop_mode not in _CROP_MODES:
        raise ValueError(f"crop_mode {crop_mode!r} is not supported; use one of {_CROP_MODES}")
    _check_stats(cfg["mean"], cfg["std"])
    interpolation = _INTERPOLATIONS[interpolation_name]
    if crop_mode == "squash":
        resize_to: int | tuple[int, int] = (
            math.floor(height / crop_pct),
            math.floor(width / crop_pct),
        )
    else:
        resize_to = math.floor(min(height, width) / crop_pct)
    return v2.Compose(
        [
            ToRGB(),
            v2.Resize(resize_to, interpolation=interpolation, antialias=True),
            v2.CenterCrop((height, width)),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean=[float(m) for m in cfg["mean"]], std=[float(s) for s in cfg["std"]]),
        ]
    )


class MultiViewDataset(torch.utils.data.Dataset):
    """A ``datasets.Dataset`` (columns ``image``, ``label``) as V augmented views per image.

    Item ``i`` is ``(views, label, index)``: ``views`` a float tensor (V, 3, H, W), ``label`` the
    int class of row ``i``, ``index`` = ``i`` (the image id the loss uses for same-image
    positives). With ``label_positive=True`` (the paper's label-positive pairing) view 0 comes
    from row ``i`` and views 1..V-1 each from a row drawn uniformly among the *other* rows of
    the same class (row ``i`` itself only when its class has one row).

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
        if not self.label_positive:
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
        if not self.shuffle:
            return iter(range(self.num_rows))
        state = np.random.SeedSequence([self.seed, epoch]).generate_state(1, dtype=np.uint64)[0]
        generator = torch.Generator().manual_seed(int(state >> np.uint64(1)))
        return iter(torch.randperm(self.num_rows, generator=generator).tolist())


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


def _as_mapping(cfg: Mapping[str, Any] | Any) -> Mapping[str, Any]:
    if isinstance(cfg, Mapping):
        return cfg
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.asdict(cfg)
    if hasattr(cfg, "to_dict"):
        return cfg.to_dict()
    raise ValueError(
        f"pretrained_cfg must be a mapping (or a dataclass) with mean, std and input_size, "
        f"got {type(cfg).__name__}"
    )


def _check_stats(mean: Sequence[float], std: Sequence[float]) -> None:
    if len(mean) != 3 or len(std) != 3:
        raise ValueError(f"mean and std need 3 values (RGB), got mean={mean!r}, std={std!r}")
    if any(float(s) <= 0 for s in std):
        raise ValueError(f"std values must be positive, got {std!r}")
