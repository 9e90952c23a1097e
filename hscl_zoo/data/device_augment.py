"""SimCLR views made on the accelerator from uint8 batches, and a dataset that only decodes.

The CPU pipeline (:func:`hscl_zoo.augment.simclr_transform`) augments one PIL image at a time in
DataLoader workers. At H100 speeds that needs far more CPU cores than a machine has, so this
module moves the augmentation onto the device that trains:

* :class:`RawImageDataset` returns ``(uint8 image (3, H, W), label, index)`` with no augmentation
  (workers only decode PNG/JPEG), or serves every row from a uint8 tensor decoded once
  (``cache=True``; CIFAR-10 train is 150 MB as uint8).
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
of batched matrix products with per-sample Gaussian band matrices (reflect padding folded in).
Nothing loops over samples in Python, and there is no host synchronisation.

Differences from the CPU pipeline, by design: the CPU pipeline crops, jitters and converts to
grayscale on uint8 PIL images (rounding to integers after each step, PIL's filters); here
everything after the uint8 input is float32, so pixel values differ slightly while the random
parameters follow the same distributions. Keep float32 matmuls exact: with
``torch.backends.cuda.matmul.allow_tf32 = True`` (or ``set_float32_matmul_precision("high")``)
the resampling products run in TF32 and lose about three decimal digits.

Reproducibility: the parameters come from a ``torch.Generator`` (CPU by default, so a seed gives
the same views on any device). :meth:`BatchSimCLRAugment.set_epoch` reseeds it from
``(seed, epoch, rank)``; with a :class:`hscl_zoo.augment.SeededSampler` order that makes each
epoch's views a function of the seeds, the epoch, the per-process batch size and the rank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import datasets
import numpy as np
import PIL.Image
import torch
from torch import Tensor, nn
from torchvision.transforms import v2

from hscl_zoo.augment import MultiViewDataset, RandomGaussianBlur, blur_kernel_size
from hscl_zoo.data import require_internal_columns

__all__ = [
    "AugmentParams",
    "BatchSimCLRAugment",
    "RawImageDataset",
    "decode_image",
    "spec_from_transform",
]

_LUMA = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


# ----------------------------------------------------------------------------- parameters


@dataclass
class AugmentParams:
    """Per-sample random parameters of ``n`` views (every field has ``n`` rows).

    Crop box ``top``, ``left``, ``height``, ``width`` (int64 pixels of the input); ``flip``,
    ``jitter``, ``grayscale``, ``blur`` (bool: whether that step applies); jitter factors
    ``brightness``, ``contrast``, ``saturation`` (multiplicative) and ``hue`` (shift in turns);
    ``order`` (n, 4) int64: the jitter operations in application order (0 brightness, 1 contrast,
    2 saturation, 3 hue); ``sigma``: blur standard deviation in pixels.
    """

    top: Tensor
    left: Tensor
    height: Tensor
    width: Tensor
    flip: Tensor
    jitter: Tensor
    brightness: Tensor
    contrast: Tensor
    saturation: Tensor
    hue: Tensor
    order: Tensor
    grayscale: Tensor
    blur: Tensor
    sigma: Tensor

    def __len__(self) -> int:
        return int(self.top.shape[0])

    def to(self, device: torch.device | str) -> AugmentParams:
        """Move to ``device`` as one packed copy (pinned and non-blocking from CPU to CUDA)."""
        device = torch.device(device)
        if self.top.device == device:
            return self
        packed = self.pack()
        if packed.device.type == "cpu" and device.type == "cuda":
            packed = packed.pin_memory().to(device, non_blocking=True)
        else:
            packed = packed.to(device)
        return AugmentParams.unpack(packed)

    def pack(self) -> Tensor:
        """All fields as one (n, 17) float64 tensor (exact for pixel counts, flags and float32 values)."""
        columns = [
            self.top, self.left, self.height, self.width, self.flip, self.jitter, self.brightness,
            self.contrast, self.saturation, self.hue, *self.order.unbind(1), self.grayscale, self.blur,
            self.sigma,
        ]
        return torch.stack([c.to(torch.float64) for c in columns], dim=1)

    @classmethod
    def unpack(cls, packed: Tensor) -> AugmentParams:
        """Inverse of :meth:`pack`."""
        c = packed.unbind(1)
        as_long, as_bool, as_float = (lambda t: t.to(torch.int64)), (lambda t: t != 0), (lambda t: t.to(torch.float32))
        return cls(
            top=as_long(c[0]), left=as_long(c[1]), height=as_long(c[2]), width=as_long(c[3]),
            flip=as_bool(c[4]), jitter=as_bool(c[5]), brightness=as_float(c[6]), contrast=as_float(c[7]),
            saturation=as_float(c[8]), hue=as_float(c[9]), order=torch.stack(c[10:14], dim=1).to(torch.int64),
            grayscale=as_bool(c[14]), blur=as_bool(c[15]), sigma=as_float(c[16]),
        )

    def index(self, rows: Tensor | slice) -> AugmentParams:
        """The parameters of a subset of rows."""
        return AugmentParams(**{f.name: getattr(self, f.name)[rows] for f in fields(self)})


def _jitter_range(value: float, centre: float, bound: float | None = None) -> tuple[float, float]:
    low, high = centre - value, centre + value
    if bound is not None:
        low = max(low, bound)
    return (float(low), float(high))


# ----------------------------------------------------------------------------- the module


class BatchSimCLRAugment(nn.Module):
    """The SimCLR augmentation of :func:`hscl_zoo.augment.simclr_transform`, batched on a device.

    Call it on a uint8 batch ``(B, 3, H, W)`` (or float in [0, 1]) already on the device; it
    returns ``(B, views, 3, image_size, image_size)`` float32, normalised with ``mean``/``std``.
    A ``(B, V, 3, H, W)`` input gives one view per given image (the label-positive pairing of
    :class:`RawImageDataset`, where the views come from different images).

    The arguments mirror :func:`~hscl_zoo.augment.simclr_transform` (``strength``, ``blur``,
    ``scale``, ``blur_p``); the remaining probabilities and ranges default to the CPU pipeline's
    values and exist so that tests and ablations can switch single steps off.
    :meth:`from_transform` reads every range and probability from a ``simclr_transform`` object.

    Args:
        image_size: side S of the output views.
        mean, std: per-channel normalisation.
        views: views per image for a (B, 3, H, W) input.
        strength: colour-jitter strength s (brightness, contrast, saturation 0.4 s; hue 0.1 s).
        blur: include the random Gaussian blur.
        scale: crop area fraction range; ratio: crop aspect-ratio range (width / height).
        blur_p, flip_p, jitter_p, grayscale_p: probabilities of the steps.
        blur_sigma: blur sigma range; blur_kernel: kernel size (default ``blur_kernel_size(S)``).
        seed: seed of the module's generator (see :meth:`set_epoch`).
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
        self.generator = torch.Generator().manual_seed(self.seed)

    # ---- construction from the CPU pipeline ----

    @classmethod
    def from_transform(cls, transform: Any, *, views: int = 2, seed: int = 0) -> BatchSimCLRAugment:
        """The batched equivalent of a :func:`~hscl_zoo.augment.simclr_transform` object."""
        spec = spec_from_transform(transform)
        jitter = {k: spec[k] for k in ("brightness", "contrast", "saturation", "hue") if spec.get(k) is not None}
        return cls(
            spec["image_size"], mean=spec["mean"], std=spec["std"], views=views, scale=spec["scale"],
            ratio=spec["ratio"], flip_p=spec["flip_p"], jitter_p=spec["jitter_p"] if jitter else 0.0,
            grayscale_p=spec["grayscale_p"], blur=spec["blur_p"] > 0, blur_p=spec["blur_p"],
            blur_sigma=spec["blur_sigma"] or (0.1, 2.0), blur_kernel=spec["blur_kernel"], seed=seed,
            _jitter_ranges=jitter,
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
        """The views of ``images`` for given parameters (row ``b * V + v`` is view ``v`` of image ``b``)."""
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


# ----------------------------------------------------------------------------- batched kernels


def resample_matrix(start: Tensor, length: Tensor, out_size: int, in_size: int) -> Tensor:
    """Per-sample (n, out_size, in_size) weights resizing the window [start, start+length) to out_size.

    The weights are those of ``F.interpolate(mode="bilinear", antialias=True,
    align_corners=False)`` applied to the window alone (a triangle filter widened by the
    shrink factor when shrinking; plain bilinear with edge clamping when enlarging), so
    ``M @ column`` equals torchvision's ``resized_crop`` along that axis.
    """
    n = start.shape[0]
    device = start.device
    span = length.to(torch.float32)[:, None, None]  # (n, 1, 1)
    factor = span / out_size  # input pixels per output pixel
    support = factor.clamp_min(1.0)
    centre = factor * (torch.arange(out_size, device=device, dtype=torch.float32)[None, :, None] + 0.5)
    first = torch.trunc(centre - support + 0.5).clamp_min(0.0)
    last = torch.minimum(torch.trunc(centre + support + 0.5), span)
    taps = int(math.floor(2 * max(in_size / out_size, 1.0))) + 2
    pos = first + torch.arange(taps, device=device, dtype=torch.float32)  # (n, S, taps), window coordinates
    weight = (1.0 - ((pos - centre + 0.5) / support).abs()).clamp_min(0.0)
    weight = torch.where(pos < last, weight, 0.0)
    weight = weight / weight.sum(dim=-1, keepdim=True)
    column = (pos.to(torch.int64) + start[:, None, None]).clamp(0, in_size - 1)
    out = torch.zeros(n, out_size, in_size, device=device, dtype=torch.float32)
    return out.scatter_add_(2, column, weight)


def gaussian_band_matrix(sigma: Tensor, active: Tensor, kernel_size: int, size: int) -> Tensor:
    """Per-sample (n, size, size) matrices of a 1-D Gaussian blur with reflect padding.

    Row i holds the normalised taps exp(-o^2 / (2 sigma^2)), o = -r..r, at columns reflect(i + o)
    (the padding of :func:`hscl_zoo.augment.gaussian_blur`); rows of inactive samples are the
    identity, so ``K @ image @ K^T`` blurs exactly the active samples.
    """
    n = sigma.shape[0]
    device = sigma.device
    radius = kernel_size // 2
    offsets = torch.arange(-radius, radius + 1, device=device, dtype=torch.float32)
    taps = torch.exp(-0.5 * (offsets[None, :] / sigma[:, None]) ** 2)
    taps = taps / taps.sum(dim=1, keepdim=True)
    identity = (offsets == 0).to(torch.float32).expand(n, -1)
    taps = torch.where(active[:, None], taps, identity)  # (n, k)
    pos = torch.arange(size, device=device)[:, None] + offsets.to(torch.int64)[None, :]  # (size, k)
    pos = torch.where(pos < 0, -pos, pos)
    pos = torch.where(pos > size - 1, 2 * (size - 1) - pos, pos)
    out = torch.zeros(n, size, size, device=device, dtype=torch.float32)
    return out.scatter_add_(2, pos.expand(n, -1, -1), taps[:, None, :].expand(-1, size, -1).contiguous())


def luma(x: Tensor) -> Tensor:
    """Grayscale (..., 1, H, W) of RGB (..., 3, H, W) with torchvision's weights."""
    r, g, b = x.unbind(dim=-3)
    return (r * _LUMA[0] + g * _LUMA[1] + b * _LUMA[2]).unsqueeze(-3)


def color_jitter(x: Tensor, params: AugmentParams, *, hue: bool = True) -> Tensor:
    """torchvision's ColorJitter on (n, 3, H, W) floats in [0, 1], per-sample factors and order.

    Brightness, contrast and saturation are blends ``f * x + (1 - f) * target`` (target 0, the
    mean luma, the luma) clamped to [0, 1]; one fused blend pass applies, per sample, whichever
    of them that sample's order puts at the current step (``f = 1`` leaves a sample unchanged
    exactly). Hue is an HSV rotation, the expensive operation, so it runs once: the blends a
    sample's order puts before its hue step run in passes 0..2, then every jittered sample's hue
    is rotated, then the blends after it run in passes 1..3. With ``hue=False`` (no hue range)
    four blend passes follow the order and hue entries are skipped. Samples whose ``jitter``
    flag is off pass through unchanged.
    """
    bc = lambda t: t[:, None, None, None]  # noqa: E731  (n,) -> broadcastable over (n, C, H, W)
    factors = torch.stack([params.brightness, params.contrast, params.saturation], dim=1)  # (n, 3)
    order = params.order
    hue_step = (order == 3).to(torch.int8).argmax(dim=1) if hue else torch.full_like(order[:, 0], 4)

    def blend_pass(x: Tensor, step: int, active: Tensor) -> Tensor:
        op = order[:, step]
        use = params.jitter & active & (op < 3)
        factor = bc(torch.where(use, factors.gather(1, op.clamp_max(2)[:, None]).squeeze(1), 1.0))
        gray = luma(x)
        mean = gray.mean(dim=(-2, -1), keepdim=True)
        target = torch.where(bc(op == 0), 0.0, torch.where(bc(op == 1), mean, gray))
        return torch.lerp(target, x, factor).clamp_(0.0, 1.0)

    for step in range(3 if hue else 4):
        x = blend_pass(x, step, step < hue_step)
    if hue:
        x = torch.where(bc(params.jitter), rotate_hue(x, params.hue), x)
        for step in range(1, 4):
            x = blend_pass(x, step, step > hue_step)
    return x


def rotate_hue(x: Tensor, shift: Tensor) -> Tensor:
    """Add ``shift`` (n,) turns to the HSV hue of (n, 3, H, W) RGB floats in [0, 1].

    Value (the largest channel) and chroma (largest minus smallest) stay; the hue, in sixths of
    a turn, is 0 + (g - b) / chroma, 2 + (b - r) / chroma or 4 + (r - g) / chroma as red, green or
    blue is largest (ties go to red, then green, as in torchvision and PIL). Channel k of the
    result is value - chroma * clamp(min(t, 4 - t), 0, 1) with t = (k_offset + 6 hue) mod 6 and
    offsets 5, 3, 1 for red, green, blue.
    """
    r, g, b = x.unbind(dim=-3)
    low, high = torch.aminmax(x, dim=-3)
    chroma = high - low
    red_max = high == r
    green_max = (high == g) & ~red_max
    numerator = torch.where(red_max, g - b, torch.where(green_max, b - r, r - g))
    sector = torch.where(red_max, 0.0, torch.where(green_max, 2.0, 4.0))
    # a grey pixel (chroma 0) has numerator 0, and its channels all equal value whatever the hue
    sixths = sector + numerator / chroma.clamp_min(1e-12) + 6.0 * shift[:, None, None]
    out = []
    for offset in (5.0, 3.0, 1.0):
        t = torch.remainder(sixths + offset, 6.0)
        ramp = torch.minimum(t, 4.0 - t).clamp_(0.0, 1.0)
        out.append(high - chroma * ramp)
    return torch.stack(out, dim=-3)


# ----------------------------------------------------------------------------- the CPU pipeline's settings


def spec_from_transform(transform: Any) -> dict[str, Any]:
    """Ranges and probabilities of a :func:`~hscl_zoo.augment.simclr_transform` pipeline.

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


# ----------------------------------------------------------------------------- raw uint8 data


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
    partners drawn as :class:`hscl_zoo.augment.MultiViewDataset` draws them (a function of
    ``(seed, epoch, i)``; call :meth:`set_epoch`), and the augmenter makes one view of each.

    ``cache=True`` decodes every row once, at construction, into one uint8 tensor in shared
    memory (``images``: (N, 3, H, W); CIFAR-10 train is 150 MB), so workers, or the main process
    with ``num_workers=0``, only index it; :meth:`__getitems__` fetches a whole batch with one
    gather. Batching needs every image to have the same size (true of the zoo's datasets).
    """

    def __init__(
        self,
        dataset: datasets.Dataset,
        *,
        cache: bool = False,
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
        self.images: Tensor | None = self._decode_all() if cache else None

    def _decode_all(self) -> Tensor:
        first = decode_image(self.dataset[0]["image"])
        out = torch.empty((len(self.dataset), *first.shape), dtype=torch.uint8)
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
        return out.share_memory_()

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
