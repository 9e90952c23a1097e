"""Batched image kernels of the device augmentation (:mod:`hscl_zoo.data.device_augment`).

Every function works on a whole batch with per-sample parameters, on any device, without a
Python loop over samples: resampling and blur as per-sample matrices applied by batched matrix
products, colour jitter as fused blends and one HSV rotation.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields

import torch
from torch import Tensor

__all__ = ["AugmentParams", "resample_matrix", "gaussian_band_matrix", "luma", "color_jitter", "rotate_hue",
           "exact_float32_matmul"]

_LUMA = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


@contextmanager
def exact_float32_matmul() -> Iterator[None]:
    """Run float32 matrix products in full float32 inside, whatever the process-wide setting.

    TF32 (``torch.backends.cuda.matmul.allow_tf32 = True``, ``set_float32_matmul_precision("high")``;
    Accelerate turns it on when its dynamo backend is set) keeps 10 mantissa bits, so the
    resampling and blur products would lose about three decimal digits. The setting is restored
    on exit."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


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
    (the padding of :func:`hscl_zoo.data.transforms.gaussian_blur`); rows of inactive samples are the
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
