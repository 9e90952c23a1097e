"""The loss contract's fast path: uniform, exponential-tilt and threshold weights, one autograd node.

The general computation in `hscl_zoo.losses` builds boolean N x N masks and runs two logsumexps
through autograd: about forty passes over N x N memory. Here the sets are (images x images)
float masks broadcast over views (rows and columns are laid out view-major, so the broadcasts
vectorise), the exponentials are taken once with a fixed shift (cosines are bounded, so no row
maximum is needed) and are all that is kept for the backward pass, which recomputes the weights
and each pair's sigmoid from them and writes the gradient out by hand into as few buffers as it
can. On a CPU a pass over N x N memory costs a sixth to a third of the similarity matmul at
d = 128, so the number of passes decides the speed: eight forward and six backward for H-SCL(beta)
with beta = 1, against about six in a bare matmul + logsumexp.

It serves every case whose weights are uniform, exp(beta * g) or a threshold, without the
debiasing of H-UCL, at temperatures where the fixed shift cannot underflow; `fused_applicable`
says when, and the general path covers the rest.
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


def image_sets(
    batch: int,
    global_batch: int,
    offset: int,
    labels_all: Tensor | None,
    *,
    label_positives: bool,
    label_negatives: bool,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[Tensor, Tensor]:
    """(b, B) float masks of the positive images (the anchor's own included) and the negative
    images of b local anchors (global images offset..offset+b-1) among B global images."""
    positive, negative = torch.empty(2, batch, global_batch, dtype=dtype, device=device)
    if label_positives or label_negatives:
        keys = _mask_keys(labels_all, dtype)
        anchor_keys, candidate_keys = keys[offset : offset + batch, None], keys[None, :]
    anchor_images = torch.arange(offset, offset + batch, device=device)[:, None]
    images = torch.arange(global_batch, device=device)[None, :]
    if label_positives:
        torch.eq(anchor_keys, candidate_keys, out=positive)
    else:
        torch.eq(anchor_images, images, out=positive)
    if label_negatives:
        torch.ne(anchor_keys, candidate_keys, out=negative)
    else:
        torch.ne(anchor_images, images, out=negative)
    return positive, negative


def _mask_keys(labels: Tensor, dtype: torch.dtype) -> Tensor:
    """Labels to compare into a `dtype` mask: on a CPU, as `dtype` itself when every label is
    exactly representable there, which lets the comparison write the mask without a cast pass."""
    exact = 2.0 / torch.finfo(dtype).eps  # 2**24 for float32: every integer up to it is exact
    if labels.device.type == "cpu" and int(labels.abs().max()) <= exact:
        return labels.to(dtype)
    return labels


class _FusedInfoNCE(torch.autograd.Function):
    """Sum over counted (anchor, positive) pairs of psi.

    Anchors z (V*b, d) and candidates z_all (V*B, d) are view-major; `positive` (b, B) already
    excludes anchors without negatives, `negative` (b, B) is the negative-image mask.

    Two N x N buffers live from forward to backward: the exponentials e and a scratch buffer.
    The backward pass writes the gradient into the scratch buffer and may overwrite e; if it
    runs a second time on the same graph (retain_graph=True) it recomputes e from z and z_all.
    """

    @staticmethod
    def forward(ctx, z, z_all, positive, negative, self_index, views, M, temperature, hardening, slope):  # type: ignore[override]
        inv_t = 1.0 / temperature
        V = views
        b, B = positive.shape
        tiny = torch.finfo(z.dtype).tiny
        neg = negative[None, :, None, :]
        pos = positive[None, :, None, :]
        x = _shifted_logits(z, z_all, inv_t).view(V, b, V, B)
        level = None
        if isinstance(hardening, ExponentialTilt) and hardening.beta not in (0.0, 1.0):
            scratch = torch.mul(x, hardening.beta).exp_().mul_(neg)
            e = x.exp_()
        else:
            e = x.exp_()
            if isinstance(hardening, Threshold):
                level, scratch = _threshold_weights(e, neg, math.exp((hardening.current_level - 1.0) * inv_t))
            else:
                scratch = e * neg
        uniform = hardening is None or (isinstance(hardening, ExponentialTilt) and hardening.beta == 0.0)
        if uniform:
            sum_w = (negative.sum(dim=1) * V)[None, :, None, None]
        else:
            sum_w = scratch.sum(dim=(2, 3), keepdim=True)
            scratch.mul_(e)
        sum_we = scratch.sum(dim=(2, 3), keepdim=True).clamp_min_(tiny)
        sum_w = sum_w.clamp_min(tiny)
        a = sum_we.div(sum_w).mul_(M)  # M x (weighted mean of e over negatives), per anchor
        terms = torch.div(a, e, out=scratch).add_(1.0).log_().mul_(pos)  # psi = log(1 + a / e_ip)
        total = terms.sum() - terms[_diagonal(V, b, self_index)].sum()
        ctx.save_for_backward(z, z_all, a, sum_w, sum_we, positive, negative, self_index)
        ctx.e, ctx.scratch, ctx.e_intact = e, scratch, True
        ctx.meta = (V, inv_t, slope, hardening, level)
        return total

    @staticmethod
    def backward(ctx, grad_total):  # type: ignore[override]
        z, z_all, a, sum_w, sum_we, positive, negative, self_index = ctx.saved_tensors
        V, inv_t, slope, hardening, level = ctx.meta
        b, B = positive.shape
        e = ctx.e if ctx.e_intact else _shifted_logits(z, z_all, inv_t).view(V, b, V, B).exp_()
        ctx.e_intact = False
        neg = negative[None, :, None, :]
        grad = torch.add(e, a, out=ctx.scratch).reciprocal_().mul_(a.neg() * positive[None, :, None, :])
        grad[_diagonal(V, b, self_index)] = 0  # grad now holds minus each counted pair's sigmoid
        s = grad.sum(dim=(2, 3), keepdim=True).neg_()
        upper = ((1.0 + slope) * s / sum_we) * neg
        lower = (slope * s / sum_w) * neg
        beta = hardening.beta if isinstance(hardening, ExponentialTilt) else 0.0
        if isinstance(hardening, Threshold):
            grad.addcmul_(e.masked_fill_(e < level, 0.0), upper)
        elif beta == 0.0:
            grad.addcmul_(e, upper)
        elif beta == 1.0:
            if slope:
                grad.addcmul_(e, lower, value=-1.0)
            grad.addcmul_(e.square_(), upper)
        elif slope:
            factor = torch.mul(e, upper).sub_(lower)
            grad.addcmul_(factor, e.log_().mul_(beta).exp_())
        else:
            grad.addcmul_(e.log_().mul_(1.0 + beta).exp_(), upper)
        grad = grad.view(z.shape[0], z_all.shape[0])
        scale = grad_total * inv_t
        grad_z = (grad @ z_all).mul_(scale) if ctx.needs_input_grad[0] else None
        grad_z_all = (z.T @ grad).T.mul_(scale) if ctx.needs_input_grad[1] else None
        return grad_z, grad_z_all, None, None, None, None, None, None, None, None


def _shifted_logits(z: Tensor, z_all: Tensor, inv_t: float) -> Tensor:
    """(z z_all^T - 1) / T as one matmul: the shift rides along as an extra coordinate."""
    left = torch.cat([z * inv_t, z.new_full((z.shape[0], 1), -inv_t)], dim=1)
    right = torch.cat([z_all, z_all.new_ones(z_all.shape[0], 1)], dim=1)
    return left @ right.T


def _diagonal(V: int, b: int, self_index: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Index of each anchor's own entry (view v of image i against itself) in the (V, b, V, B) layout."""
    views = torch.arange(V, device=self_index.device)[:, None]
    anchors = torch.arange(b, device=self_index.device)[None, :]
    return views, anchors, views, self_index[None, :]


def _threshold_weights(e: Tensor, neg: Tensor, level: float) -> tuple[Tensor, Tensor]:
    """Hard-negative indicator 1(e >= level) on negatives, with uniform weights for an anchor
    whose hard set is empty; returns the per-anchor level actually used (0 for those anchors,
    which every e > 0 passes) and the weights."""
    weights = torch.ge(e, level, out=torch.empty_like(e)).mul_(neg)
    empty = weights.sum(dim=(2, 3), keepdim=True) == 0
    weights.add_(empty.to(e.dtype) * neg)
    return torch.where(empty, 0.0, level).to(e.dtype), weights


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
    (b, B) float masks of positive images (the anchor's own included, anchors without negatives
    already zeroed) and of negative images."""
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
