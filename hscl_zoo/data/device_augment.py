"""SimCLR views made on the accelerator from uint8 batches.

The CPU pipeline (:func:`hscl_zoo.data.transforms.simclr_transform`) augments one PIL image at
a time in DataLoader workers. At H100 speeds that needs far more CPU cores than a machine has, so
this module moves the augmentation onto the device that trains:

* :class:`hscl_zoo.data.raw_images.RawImageDataset` returns ``(uint8 image (3, H, W), label,
  index)`` with no augmentation (workers only decode PNG/JPEG), or serves every row from a uint8
  tensor decoded once (``cache=True``; CIFAR-10 train is 150 MB as uint8).
* :class:`BatchSimCLRAugment` takes the uint8 batch on the device and returns ``V`` normalised
  float views ``(B, V, 3, S, S)`` with per-sample random parameters drawn from the same
  distributions as the CPU pipeline: random resized crop (area fraction in ``scale``, aspect
  ratio in ``ratio``, torchvision's 10-attempt sampler and centre-crop fallback), horizontal flip,
  colour jitter (brightness, contrast, saturation, hue in a per-sample random order) applied with
  ``jitter_p``, grayscale, Gaussian blur with the kernel size of :func:`blur_kernel_size` and sigma
  uniform in ``blur_sigma``, then normalisation.

How it computes: crop + resize + flip of every sample is one pair of batched matrix products
``R_y @ image @ R_x^T``, where ``R_y``/``R_x`` hold each sample's resampling weights (the weights of
torch's antialiased bilinear resize, which equal plain bilinear when enlarging); the three
blend-type jitter operations of one ordering step are one fused blend; the blur is another pair
of batched matrix products with per-sample Gaussian band matrices (reflect padding folded in);
those kernels are in :mod:`hscl_zoo.data.device_ops`. Nothing loops over samples in Python, and
there is no host synchronisation.

Differences from the CPU pipeline, by design: the CPU pipeline crops, jitters and converts to
grayscale on uint8 PIL images (rounding to integers after each step, PIL's filters); here
everything after the uint8 input is float32, so pixel values differ slightly while the random
parameters follow the same distributions. The products run in full float32 even where TF32 is
on for the rest of the process (:func:`~hscl_zoo.data.device_ops.exact_float32_matmul`): in TF32
the resampling weights would lose about three decimal digits.

Reproducibility: the parameters come from a ``torch.Generator`` (CPU by default, so a seed gives
the same views on any device; on the training device with ``generator_device``, the same views
twice on that device, and no host work per batch). :meth:`BatchSimCLRAugment.set_epoch` reseeds it from
``(seed, epoch, rank)``; with a :class:`hscl_zoo.data.loaders.SeededSampler` order that makes each
epoch's views a function of the seeds, the epoch, the per-process batch size and the rank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torchvision.transforms import v2

from hscl_zoo.data.device_ops import (
    AugmentParams,
    color_jitter,
    exact_float32_matmul,
    gaussian_band_matrix,
    luma,
    resample_matrix,
)
from hscl_zoo.data.transforms import RandomGaussianBlur, blur_kernel_size

__all__ = ["AugmentParams", "BatchSimCLRAugment", "spec_from_transform"]


def _jitter_range(value: float, centre: float, bound: float | None = None) -> tuple[float, float]:
    low, high = centre - value, centre + value
    if bound is not None:
        low = max(low, bound)
    return (float(low), float(high))

# ----------------------------------------------------------------------------- the module


class BatchSimCLRAugment(nn.Module):
    """The SimCLR augmentation of :func:`hscl_zoo.data.transforms.simclr_transform`, batched on a device.

    Call it on a uint8 batch ``(B, 3, H, W)`` (or float in [0, 1]) already on the device; it
    returns ``(B, views, 3, image_size, image_size)`` float32, normalised with ``mean``/``std``.
    A ``(B, V, 3, H, W)`` input gives one view per given image (the label-positive pairing of
    :class:`RawImageDataset`, where the views come from different images).

    The arguments mirror :func:`~hscl_zoo.data.transforms.simclr_transform` (``strength``, ``blur``,
    ``scale``, ``blur_p``); the remaining probabilities and ranges default to the CPU pipeline's
    values and exist so that tests and ablations can switch single steps off.
    :meth:`from_transform` reads every range and probability from a ``simclr_transform`` object.

    Args:
        image_size: side S of the output views.
        mean: per-channel normalisation mean.
        std: per-channel normalisation standard deviation.
        views: views per image for a (B, 3, H, W) input.
        strength: colour-jitter strength s (brightness, contrast, saturation 0.4 s; hue 0.1 s).
        blur: include the random Gaussian blur.
        scale: crop area fraction range.
        ratio: crop aspect-ratio range (width / height).
        blur_p: probability of the blur.
        flip_p: probability of the horizontal flip.
        jitter_p: probability of the colour jitter.
        grayscale_p: probability of the grayscale step.
        blur_sigma: blur sigma range.
        blur_kernel: kernel size (default ``blur_kernel_size(S)``).
        seed: seed of the module's generator (see :meth:`set_epoch`).
        generator_device: where the generator draws the parameters: the CPU (a seed gives the
            same views on any device; each batch's parameters are copied to the device), or
            the training device (no host work and no copy per batch; the views then depend on
            the device's generator, the same twice on one device).
    """

    def __init__(
        self,
        image_size: int,
        *,
        mean: Sequence[float],
        std: Sequence[float],
        views: int = 2,
        strength: float = 1.0,
        blur: bool = True,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        blur_p: float = 0.5,
        flip_p: float = 0.5,
        jitter_p: float = 0.8,
        grayscale_p: float = 0.2,
        blur_sigma: tuple[float, float] = (0.1, 2.0),
        blur_kernel: int | None = None,
        seed: int = 0,
        generator_device: torch.device | str = "cpu",
        _jitter_ranges: dict[str, tuple[float, float]] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(image_size, int) or image_size < 1:
            raise ValueError(f"image_size must be a positive integer, got {image_size!r}")
        if not isinstance(views, int) or views < 1:
            raise ValueError(f"views must be a positive integer, got {views!r}")
        if strength < 0:
            raise ValueError(f"strength must be >= 0, got {strength!r}")
        if not 0 < scale[0] <= scale[1]:
            raise ValueError(f"scale must be a range (low, high) with 0 < low <= high, got {scale!r}")
        if not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"ratio must be a range (low, high) with 0 < low <= high, got {ratio!r}")
        if not 0 < blur_sigma[0] <= blur_sigma[1]:
            raise ValueError(f"blur_sigma must be a range with 0 < low <= high, got {blur_sigma!r}")
        for name, p in (("blur_p", blur_p), ("flip_p", flip_p), ("jitter_p", jitter_p), ("grayscale_p", grayscale_p)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
        if len(mean) != 3 or len(std) != 3 or any(float(s) <= 0 for s in std):
            raise ValueError(f"mean and std need 3 values (RGB) and std > 0, got mean={mean!r}, std={std!r}")
        kernel = blur_kernel_size(image_size) if blur_kernel is None else int(blur_kernel)
        if kernel < 1 or kernel % 2 == 0:
            raise ValueError(f"blur_kernel must be a positive odd integer, got {blur_kernel!r}")
        if blur and kernel // 2 >= image_size:
            raise ValueError(f"blur kernel {kernel} needs image_size > {kernel // 2} for reflect padding")
        self.image_size = image_size
        self.views = views
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.flip_p = float(flip_p)
        if _jitter_ranges is None:
            _jitter_ranges = {}
            if strength > 0:
                _jitter_ranges = {
                    "brightness": _jitter_range(0.4 * strength, 1.0, 0.0),
                    "contrast": _jitter_range(0.4 * strength, 1.0, 0.0),
                    "saturation": _jitter_range(0.4 * strength, 1.0, 0.0),
                    "hue": _jitter_range(0.1 * strength, 0.0),
                }
        self.jitter_ranges = dict(_jitter_ranges)
        self.jitter_p = float(jitter_p) if self.jitter_ranges else 0.0
        self.grayscale_p = float(grayscale_p)
        self.blur_p = float(blur_p) if blur else 0.0
        self.blur_sigma = (float(blur_sigma[0]), float(blur_sigma[1]))
        self.blur_kernel = kernel
        self.seed = int(seed)
        self.register_buffer("mean", torch.tensor([float(m) for m in mean]).view(3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor([float(s) for s in std]).view(3, 1, 1), persistent=False)
        self.generator = torch.Generator(device=torch.device(generator_device)).manual_seed(self.seed)
        self._compiled = None

    # ---- construction from the CPU pipeline ----

    @classmethod
    def from_transform(cls, transform: Any, *, views: int = 2, seed: int = 0,
                       generator_device: torch.device | str = "cpu") -> BatchSimCLRAugment:
        """The batched equivalent of a :func:`~hscl_zoo.data.transforms.simclr_transform` object."""
        spec = spec_from_transform(transform)
        jitter = {k: spec[k] for k in ("brightness", "contrast", "saturation", "hue") if spec.get(k) is not None}
        return cls(
            spec["image_size"], mean=spec["mean"], std=spec["std"], views=views, scale=spec["scale"],
            ratio=spec["ratio"], flip_p=spec["flip_p"], jitter_p=spec["jitter_p"] if jitter else 0.0,
            grayscale_p=spec["grayscale_p"], blur=spec["blur_p"] > 0, blur_p=spec["blur_p"],
            blur_sigma=spec["blur_sigma"] or (0.1, 2.0), blur_kernel=spec["blur_kernel"], seed=seed,
            generator_device=generator_device, _jitter_ranges=jitter,
        )

    def spec(self) -> dict[str, Any]:
        """Ranges and probabilities in the form :func:`spec_from_transform` returns."""
        return {
            "image_size": self.image_size,
            "scale": self.scale,
            "ratio": self.ratio,
            "flip_p": self.flip_p,
            "jitter_p": self.jitter_p,
            **{k: self.jitter_ranges.get(k) for k in ("brightness", "contrast", "saturation", "hue")},
            "grayscale_p": self.grayscale_p,
            "blur_p": self.blur_p,
            "blur_kernel": self.blur_kernel if self.blur_p > 0 else None,
            "blur_sigma": self.blur_sigma if self.blur_p > 0 else None,
            "mean": tuple(self.mean.flatten().tolist()),
            "std": tuple(self.std.flatten().tolist()),
        }

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.spec().items() if k not in ("mean", "std")) + f", views={self.views}"

    # ---- randomness ----

    def set_epoch(self, epoch: int, rank: int = 0) -> None:
        """Reseed the generator from ``(seed, epoch, rank)``: each epoch (and process) its own stream."""
        state = np.random.SeedSequence([self.seed, int(epoch), int(rank)]).generate_state(1, dtype=np.uint64)[0]
        self.generator.manual_seed(int(state >> np.uint64(1)))

    def sample_params(self, n: int, height: int, width: int, generator: torch.Generator | None = None) -> AugmentParams:
        """Draw the parameters of ``n`` views of ``height`` x ``width`` images (on the generator's device)."""
        gen = self.generator if generator is None else generator
        dev = gen.device

        def uniform(*shape: int, low: float = 0.0, high: float = 1.0) -> Tensor:
            return torch.rand(*shape, generator=gen, device=dev) * (high - low) + low

        # random resized crop: torchvision's sampler, its 10 attempts drawn at once
        attempts = 10
        area = float(height * width)
        target = area * uniform(n, attempts, low=self.scale[0], high=self.scale[1])
        log_ratio = uniform(n, attempts, low=math.log(self.ratio[0]), high=math.log(self.ratio[1]))
        aspect = torch.exp(log_ratio)
        w_try = torch.round(torch.sqrt(target * aspect)).to(torch.int64)
        h_try = torch.round(torch.sqrt(target / aspect)).to(torch.int64)
        fits = (w_try > 0) & (w_try <= width) & (h_try > 0) & (h_try <= height)
        first = torch.argmax(fits.to(torch.int8), dim=1, keepdim=True)
        found = fits.any(dim=1)
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            fb_w, fb_h = width, int(round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            fb_w, fb_h = int(round(height * self.ratio[1])), height
        else:
            fb_w, fb_h = width, height
        crop_w = torch.where(found, w_try.gather(1, first).squeeze(1), fb_w)
        crop_h = torch.where(found, h_try.gather(1, first).squeeze(1), fb_h)
        u_top, u_left = uniform(n), uniform(n)
        top = torch.minimum((u_top * (height - crop_h + 1)).floor().to(torch.int64), height - crop_h)
        left = torch.minimum((u_left * (width - crop_w + 1)).floor().to(torch.int64), width - crop_w)
        top = torch.where(found, top, (height - crop_h) // 2)
        left = torch.where(found, left, (width - crop_w) // 2)

        flip = uniform(n) < self.flip_p
        jitter = uniform(n) < self.jitter_p
        factors = {}
        for key, neutral in (("brightness", 1.0), ("contrast", 1.0), ("saturation", 1.0), ("hue", 0.0)):
            bounds = self.jitter_ranges.get(key)
            draw = uniform(n)
            factors[key] = draw * (bounds[1] - bounds[0]) + bounds[0] if bounds else torch.full_like(draw, neutral)
        order = torch.argsort(uniform(n, 4), dim=1)  # a uniformly random permutation per sample
        grayscale = uniform(n) < self.grayscale_p
        blur = uniform(n) < self.blur_p
        sigma = uniform(n, low=self.blur_sigma[0], high=self.blur_sigma[1])
        return AugmentParams(
            top=top, left=left, height=crop_h, width=crop_w, flip=flip, jitter=jitter, order=order,
            grayscale=grayscale, blur=blur, sigma=sigma, **factors,
        )

    # ---- the computation ----

    def forward(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Views ``(B, V, 3, S, S)`` of a uint8 (or [0, 1] float) batch ``(B, 3, H, W)`` or ``(B, V, 3, H, W)``."""
        batch, views = self._check(images)
        params = self.sample_params(batch * views, images.shape[-2], images.shape[-1], generator)
        return self.apply(images, params)

    def apply(self, images: Tensor, params: AugmentParams) -> Tensor:
        """The views of ``images`` for given parameters (row ``b * V + v`` is view ``v`` of image ``b``),
        computed with exact float32 matrix products even where TF32 is on (`exact_float32_matmul`)."""
        with exact_float32_matmul():
            return (self._compiled or self._views)(images, params)

    def compile_kernels(self, mode: str = "default") -> BatchSimCLRAugment:
        """Compile the views' computation from the parameters (`torch.compile`, static shapes: the
        recipe's batches all have one size), fusing its many small kernels; the parameters are still
        drawn eagerly, from the generator. Returns self."""
        self._compiled = torch.compile(self._views, mode=mode, dynamic=False)
        return self

    def _views(self, images: Tensor, params: AugmentParams) -> Tensor:
        batch, views = self._check(images)
        if len(params) != batch * views:
            raise ValueError(f"params has {len(params)} rows; {batch} images x {views} views need {batch * views}")
        params = params.to(images.device)
        height, width = images.shape[-2:]
        S = self.image_size
        x = images.to(torch.float32)
        if not images.is_floating_point():
            x = x * (1.0 / 255.0)
        x = x.unsqueeze(1) if images.ndim == 4 else x  # (B, 1 or V, 3, H, W)
        rows = resample_matrix(params.top, params.height, S, height)  # (n, S, H)
        cols = resample_matrix(params.left, params.width, S, width)  # (n, S, W)
        cols = torch.where(params.flip[:, None, None], cols.flip(1), cols)
        rows = rows.view(batch, views, 1, S, height)
        cols = cols.view(batch, views, 1, S, width)
        out = (rows @ x @ cols.transpose(-1, -2)).reshape(batch * views, 3, S, S)
        if self.jitter_p > 0:
            out = color_jitter(out, params, hue=self.jitter_ranges.get("hue") is not None)
        gray = luma(out).expand_as(out)
        out = torch.where(params.grayscale[:, None, None, None], gray, out)
        if self.blur_p > 0:
            band = gaussian_band_matrix(params.sigma, params.blur, self.blur_kernel, S)  # (n, S, S)
            band = band[:, None]
            out = band @ out @ band.transpose(-1, -2)
        out = (out - self.mean) / self.std
        return out.view(batch, views, 3, S, S)

    def _check(self, images: Tensor) -> tuple[int, int]:
        if not isinstance(images, Tensor) or images.ndim not in (4, 5) or images.shape[-3] != 3:
            shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
            raise ValueError(f"images must be a (B, 3, H, W) or (B, V, 3, H, W) tensor, got {shape}")
        if not (images.dtype == torch.uint8 or images.is_floating_point()):
            raise ValueError(f"images must be uint8 (0..255) or floating point in [0, 1], got {images.dtype}")
        return int(images.shape[0]), (self.views if images.ndim == 4 else int(images.shape[1]))

# ----------------------------------------------------------------------------- the CPU pipeline's settings


def spec_from_transform(transform: Any) -> dict[str, Any]:
    """Ranges and probabilities of a :func:`~hscl_zoo.data.transforms.simclr_transform` pipeline.

    Keys: ``image_size``, ``scale``, ``ratio``, ``flip_p``, ``jitter_p``, ``brightness``,
    ``contrast``, ``saturation``, ``hue`` (ranges, None when absent), ``grayscale_p``, ``blur_p``,
    ``blur_kernel``, ``blur_sigma`` (None without blur), ``mean``, ``std``.
    """
    ops = getattr(transform, "transforms", None)
    if ops is None:
        raise ValueError(f"expected a torchvision Compose from simclr_transform, got {type(transform).__name__}")
    spec: dict[str, Any] = {
        "flip_p": 0.0, "jitter_p": 0.0, "brightness": None, "contrast": None, "saturation": None, "hue": None,
        "grayscale_p": 0.0, "blur_p": 0.0, "blur_kernel": None, "blur_sigma": None,
    }
    for op in ops:
        if isinstance(op, v2.RandomResizedCrop):
            size = op.size if isinstance(op.size, Sequence) else (op.size, op.size)
            if size[0] != size[1]:
                raise ValueError(f"square crops only, got size {op.size!r}")
            spec.update(image_size=int(size[0]), scale=tuple(map(float, op.scale)), ratio=tuple(map(float, op.ratio)))
        elif isinstance(op, v2.RandomHorizontalFlip):
            spec["flip_p"] = float(op.p)
        elif isinstance(op, v2.RandomApply) and any(isinstance(t, v2.ColorJitter) for t in op.transforms):
            jitter = next(t for t in op.transforms if isinstance(t, v2.ColorJitter))
            spec["jitter_p"] = float(op.p)
            for key in ("brightness", "contrast", "saturation", "hue"):
                value = getattr(jitter, key)
                spec[key] = None if value is None else (float(value[0]), float(value[1]))
        elif isinstance(op, v2.RandomGrayscale):
            spec["grayscale_p"] = float(op.p)
        elif isinstance(op, RandomGaussianBlur):
            spec.update(blur_p=float(op.p), blur_kernel=int(op.kernel_size), blur_sigma=tuple(map(float, op.sigma)))
        elif isinstance(op, v2.Normalize):
            spec.update(mean=tuple(map(float, op.mean)), std=tuple(map(float, op.std)))
    missing = [k for k in ("image_size", "mean") if k not in spec]
    if missing:
        raise ValueError(f"transform lacks {missing}: expected simclr_transform's RandomResizedCrop and Normalize")
    return spec
