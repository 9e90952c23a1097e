"""The loss contract's fast path: uniform, exponential-tilt and threshold weights, one autograd node.

The general computation in `hscl_zoo.losses` builds boolean N x N masks and runs two logsumexps
through autograd: about forty passes over N x N memory. Here the sets are (images x images)
masks broadcast over views, rows are laid out view-major so those broadcasts vectorise, the
exponentials are taken once with a fixed shift (cosines are bounded, so no row maximum is
needed) and reused for the weights, the softplus and its derivative, and the gradient is
written out by hand. It serves every case whose weights are uniform, exp(beta * g) or a
threshold, without the debiasing of H-UCL, at temperatures where the fixed shift cannot
underflow; `fused_applicable` says when, and the general path covers the rest.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hscl_zoo.hardening import ExponentialTilt, Threshold

_EXP_LIMIT = {torch.float32: 80.0, torch.float64: 700.0}


def fused_applicable(hardening, tau_plus: float, temperature: float, M: float, dtype: torch.dtype) -> bool:
    """Whether the fixed-shift exponentials stay in range: x = g - 1/T lies in [-2/T, 0]."""
    if tau_plus > 0 or not (hardening is None or isinstance(hardening, (ExponentialTilt, Threshold))):
        return False
    beta = hardening.beta if isinstance(hardening, ExponentialTilt) else 0.0
    limit = _EXP_LIMIT.get(dtype, 0.0)
    return 2 * (1 + beta) / temperature < limit and 2 / temperature + math.log(max(M, 1.0)) < limit


class _FusedInfoNCE(torch.autograd.Function):
    """Sum over (anchor, positive) pairs of psi; anchors z (V*b, d), candidates z_all (V*B, d), view-major."""

    @staticmethod
    def forward(ctx, z, z_all, positive_images, negative_images, self_index, views, M, temperature, hardening, slope):  # type: ignore[override]
        inv_t = 1.0 / temperature
        V = views
        b, B = positive_images.shape
        shift = torch.full((1, 1), -inv_t, dtype=z.dtype, device=z.device)
        x = torch.addmm(shift, z, z_all.T, alpha=inv_t).view(V, b, V, B)
        negative = negative_images.to(z.dtype)[None, :, None, :]
        has_negative = negative_images.any(dim=1)
        e = x.exp_()
        if hardening is None:
            weights = negative.expand_as(x)
        elif isinstance(hardening, ExponentialTilt):
            weights = e * negative if hardening.beta == 1.0 else e.pow(hardening.beta).mul_(negative)
        else:
            hard = (e >= math.exp((hardening.current_level - 1.0) * inv_t)).to(z.dtype).mul_(negative)
            empty = hard.sum(dim=(2, 3), keepdim=True) == 0
            weights = torch.where(empty, negative, hard)
        tiny = torch.finfo(z.dtype).tiny
        weighted = weights * e
        sum_weighted = weighted.sum(dim=(2, 3), keepdim=True).clamp_min(tiny)
        sum_weights = weights.sum(dim=(2, 3), keepdim=True).clamp_min(tiny)
        q = e.reciprocal_().mul_(M * sum_weighted / sum_weights)  # e^{u}, u = log M + log E - g_ip (e is reused)
        positive = (positive_images & has_negative[:, None]).to(z.dtype)[None, :, None, :]
        counted = torch.log1p(q).mul_(positive)
        views_idx = torch.arange(V, device=z.device)[:, None]
        anchors = torch.arange(b, device=z.device)[None, :]
        self_terms = counted[views_idx, anchors, views_idx, self_index[None, :]]
        total = counted.sum() - self_terms.sum()
        ctx.save_for_backward(z, z_all, weighted, weights, sum_weighted, sum_weights, q, positive, self_index)
        ctx.meta = (V, inv_t, slope)
        return total

    @staticmethod
    def backward(ctx, grad_total):  # type: ignore[override]
        z, z_all, weighted, weights, sum_weighted, sum_weights, q, positive, self_index = ctx.saved_tensors
        V, inv_t, slope = ctx.meta
        b = positive.shape[1]
        sig = q + 1
        torch.div(q, sig, out=sig).mul_(positive)  # q / (1 + q), the sigmoid of u
        views_idx = torch.arange(V, device=z.device)[:, None]
        anchors = torch.arange(b, device=z.device)[None, :]
        sig[views_idx, anchors, views_idx, self_index[None, :]] = 0
        s = sig.sum(dim=(2, 3), keepdim=True)
        dx = weighted * ((1 + slope) * s / sum_weighted)
        if slope:
            dx.addcmul_(weights, slope * s / sum_weights, value=-1)
        dx = dx.sub_(sig).view(z.shape[0], z_all.shape[0])
        scale = grad_total * inv_t
        return (dx @ z_all).mul_(scale), (dx.T @ z).mul_(scale), None, None, None, None, None, None, None, None


def fused_psi_sum(
    z: Tensor,
    z_all: Tensor,
    positive_images: Tensor,
    negative_images: Tensor,
    offset: int,
    *,
    M: float,
    temperature: float,
    hardening,
    detach_weights: bool,
) -> Tensor:
    """Sum of psi over pairs for anchors z (b, V, d) against candidates z_all (B, V, d), given
    (b, B) image-level positive and negative masks (positives include the anchor's own image)."""
    b, V, d = z.shape
    slope = hardening.beta if isinstance(hardening, ExponentialTilt) and not detach_weights else 0.0
    self_index = torch.arange(offset, offset + b, device=z.device)
    return _FusedInfoNCE.apply(
        z.transpose(0, 1).reshape(V * b, d),
        z_all.transpose(0, 1).reshape(V * z_all.shape[0], d),
        positive_images,
        negative_images,
        self_index,
        V,
        float(M),
        temperature,
        hardening,
        float(slope),
    )
