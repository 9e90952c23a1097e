"""Per-image transforms: the SimCLR augmentation that makes training views, and the evaluation
transform, the single definition of a model's deterministic preprocessing.

Both map a PIL image to a normalised float tensor; their randomness (SimCLR only) comes from
torch's global RNG, which :class:`hscl_zoo.data.views.MultiViewDataset` seeds per item. This
module needs torch and torchvision only, so a model can carry its transform without the data
loading machinery.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import PIL.Image
import torch
import torch.nn.functional as F
from torchvision.transforms import InterpolationMode, v2

ImageTransform = Callable[[Any], torch.Tensor]

INTERPOLATIONS: dict[str, InterpolationMode] = {
    "nearest": InterpolationMode.NEAREST,
    "bilinear": InterpolationMode.BILINEAR,
    "bicubic": InterpolationMode.BICUBIC,
}
DEFAULT_INTERPOLATION = "bilinear"
"""The interpolation of a config that names none."""
CROP_MODES: tuple[str, ...] = ("center", "squash")
"""How the evaluation transform fits an image to the input size (see `eval_transform`)."""


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
        interpolation: ``"bilinear"`` (the default, `DEFAULT_INTERPOLATION`), ``"bicubic"`` or ``"nearest"``.
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
    interpolation_name = cfg.get("interpolation") or DEFAULT_INTERPOLATION
    if interpolation_name not in INTERPOLATIONS:
        raise ValueError(
            f"interpolation {interpolation_name!r} is not supported; use one of "
            f"{sorted(INTERPOLATIONS)}"
        )
    crop_pct = float(cfg.get("crop_pct") or 1.0)
    if not 0 < crop_pct <= 1:
        raise ValueError(f"crop_pct must be in (0, 1], got {crop_pct!r}")
    crop_mode = cfg.get("crop_mode") or "center"
    if crop_mode not in CROP_MODES:
        raise ValueError(f"crop_mode {crop_mode!r} is not supported; use one of {CROP_MODES}")
    _check_stats(cfg["mean"], cfg["std"])
    interpolation = INTERPOLATIONS[interpolation_name]
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
