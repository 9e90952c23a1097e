"""The loss contract's fast path: uniform, exponential-tilt and threshold weights, one autograd node.

The general computation in `hscl_zoo.losses.objective` builds boolean N x N masks and runs two logsumexps
through autograd: about forty passes over N x N memory. Here the sets are (images x images)
float masks broadcast over views: rows are anchors image-major (image, view), columns are
candidates view-major (view, image), so in the (b, V, V, B) layout a mask broadcasts along the
two view axes and its rows stay contiguous. The exponentials e = exp(g) are taken once (cosines
are bounded, so no row maximum is needed); with a = M x (the weighted mean of e over each
anchor's negatives) they are all the backward pass needs: it gets each pair's sigmoid as
a / (a + e_ip), stable at any size, and the weights from e, in place, and writes the gradient out
by hand; the forward's second buffer, -psi on the positive pairs, becomes the gradient's. psi
is log(1 + a / e_ip), formed with log1p wherever M and T let a / e_ip fall below 1/16, so that a
tiny psi (a trained-looking batch at a low temperature) keeps its relative precision instead of
1 + psi rounding to 1. log1p costs a CPU about three times log's pass, so where
a / e_ip >= M e^{-2/T} >= 1/16 (the paper's T = 0.5 at any usual batch) log(1 + y), exact to
~1e-6 there, is kept. On a CPU one pass over N x N memory costs a
sixth to a quarter of the similarity matmul at d = 128, and fresh N x N memory costs more than
reused, so the passes and the buffers are what is counted: for H-SCL(beta) with beta = 1, ten
passes forward and seven backward over two N x N buffers.

It serves every case whose weights are uniform, exp(beta * g) or a threshold, without the
debiasing of H-UCL, at temperatures where every exponential it forms stays a normal floating-point
number (neither overflows nor sinks into the subnormals, where relative precision is lost);
`fused_applicable` says when, and the general path covers the rest. A second derivative
(backward with create_graph=True) is taken through the general path, recomputed from the saved
inputs, which is differentiable twice.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch
from torch import Tensor

from hscl_zoo.losses.hardening import ExponentialTilt, Threshold

# log1p replaces log(1 + y) where y = a / e_ip may fall below this (then log(1 + y) loses ~eps / y).
_LOG1P_BELOW = 1.0 / 16
# Bound that |log x| of every intermediate must stay strictly below, a margin inside the normal range (float32: e^-87.3 .. e^88.7).
_EXP_LIMIT = {torch.float32: 80.0, torch.float64: 700.0}


def fused_applicable(hardening, tau_plus: float, temperature: float, M: float, dtype: torch.dtype, candidates: int) -> bool:
    """Whether the fused path keeps full relative precision: it covers this weighting, and with
    g in [-1/T, 1/T] every intermediate stays a normal number of `dtype`. The sums of w e over
    `candidates` embeddings reach N e^{(1 + beta)/T} and single terms fall to e^{-(1 + beta)/T};
    the ratio a / e_ip, hence psi and its sigmoid, lies in M e^{+-2/T}; the per-anchor gradient
    scale (sum of sigmoids) / (sum of w e) falls to (M / N) e^{-(1 + beta)/T}. Below these
    bounds a value would overflow or lose digits in the subnormals, so the general path, which
    works in log space, takes over."""
    if tau_plus > 0 or not (hardening is None or isinstance(hardening, (ExponentialTilt, Threshold))):
        return False
    beta = hardening.beta if isinstance(hardening, ExponentialTilt) else 0.0
    limit = _EXP_LIMIT.get(dtype, 0.0)
    span = (1 + beta) / temperature
    log_n, log_m = math.log(max(candidates, 1)), math.log(M)
    return max(span + log_n, 2 / temperature + abs(log_m), span + abs(log_n - log_m)) < limit


def autocast_off(method: Callable) -> Callable:
    """Run a custom autograd Function's forward or backward with autocast off on the device of its
    first tensor argument: the device-generic equivalent of torch.amp.custom_fwd /
    custom_bwd with float32 pinned, for Functions whose callers hand them float32 (or float64).
    Without it a backward called inside an autocast region would run its matmuls in bf16/fp16."""

    @functools.wraps(method)
    def run(ctx, *args):
        device_type = next(a.device.type for a in args if isinstance(a, Tensor))
        with torch.autocast(device_type=device_type, enabled=False):
            return method(ctx, *args)

    return run


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
        anchor_labels, labels = keys[offset : offset + batch, None], keys[None, :]
    if not (label_positives and label_negatives):
        anchor_images = torch.arange(offset, offset + batch, device=device)[:, None]
        images = torch.arange(global_batch, device=device)[None, :]
    if label_positives:
        torch.eq(anchor_labels, labels, out=positive)
    else:
        torch.eq(anchor_images, images, out=positive)
    if label_negatives:
        torch.ne(anchor_labels, labels, out=negative)
    else:
        torch.ne(anchor_images, images, out=negative)
    return positive, negative


def _mask_keys(labels: Tensor, dtype: torch.dtype) -> Tensor:
    """Labels to compare into a `dtype` mask: on a CPU, as `dtype` itself when every label is
    exactly representable there, which lets the comparison write the mask without a cast pass."""
    exact = 2.0 / torch.finfo(dtype).eps  # 2**24 for float32: every integer up to it is exact
    if labels.device.type == "cpu" and max(-int(labels.min()), int(labels.max())) <= exact:
        return labels.to(dtype)
    return labels


class _FusedInfoNCE(torch.autograd.Function):
    """Sum over counted (anchor, positive) pairs of psi.

    Anchors z (b*V, d) are image-major, candidates z_all (V*B, d) view-major; `minus_counted`
    (b, B) is -1 on the positive images of anchors that have a negative, `negative` (b, B) is the
    negative-image mask and `own` the flat index of each anchor's entry against itself.
    `general(z, z_all)` computes the same sum, differentiably, from (b, V, d) anchors and
    (B, V, d) candidates; it serves a backward that must itself be differentiable.

    Both N x N buffers are overwritten by the backward pass; if it runs a second time on the same
    graph (retain_graph=True) it recomputes them from z and z_all.
    """

    @staticmethod
    @autocast_off
    def forward(ctx, z, z_all, minus_counted, negative, own, views, M, temperature, hardening, slope, general):  # type: ignore[override]
        inv_t = 1.0 / temperature
        state = _pair_terms(z, z_all, minus_counted, negative, own, views, M, inv_t, hardening)
        total = state[1].sum().neg()
        ctx.save_for_backward(z, z_all, minus_counted, negative, own)
        ctx.state = state
        ctx.meta = (views, M, inv_t, slope, hardening, general)
        return total

    @staticmethod
    @autocast_off
    def backward(ctx, grad_total):  # type: ignore[override]
        z, z_all, minus_counted, negative, own = ctx.saved_tensors
        V, M, inv_t, slope, hardening, general = ctx.meta
        if torch.is_grad_enabled():
            return (*_differentiable_grads(ctx, general, grad_total), *[None] * 9)
        state = ctx.state if ctx.state is not None else _pair_terms(z, z_all, minus_counted, negative, own, V, M, inv_t, hardening)
        ctx.state = None  # the buffers are overwritten below; released with them, as saved tensors are after backward
        e, grad, sum_w, sum_we, level, a = state
        neg = negative[:, None, None, :]
        # -sigmoid(log M + log E - g_ip) = -a / (a + e_ip) on counted pairs, 0 elsewhere
        torch.div(minus_counted[:, None, None, :] * a, torch.add(e, a, out=grad), out=grad)
        grad.view(-1).index_fill_(0, own, 0.0)
        s = grad.sum(dim=(2, 3), keepdim=True).neg_()
        # d/dg of log(sum w e) - log(sum w) is upper * w e - lower * w on each negative of weight w.
        upper = (1.0 + slope) * s / sum_we
        lower = slope * s / sum_w
        beta = hardening.beta if isinstance(hardening, ExponentialTilt) else 0.0
        if isinstance(hardening, Threshold):
            grad.addcmul_(e.masked_fill_(e < level, 0.0).mul_(neg), upper)
        elif beta == 0.0:
            grad.addcmul_(e.mul_(neg), upper)
        elif beta == 1.0:
            # w e = e^2 on negatives: with f = sqrt(upper) e, upper e^2 - lower e = f^2 - (lower / sqrt(upper)) f.
            root = upper.sqrt()
            f = e.mul_(neg).mul_(root)
            grad.addcmul_(f, f)
            if slope:
                grad.addcmul_(f, torch.where(root > 0, lower / root, 0.0), value=-1.0)
        elif slope:
            factor = torch.mul(e, upper).sub_(lower)
            grad.addcmul_(factor, e.log_().mul_(beta).exp_().mul_(neg))
        else:
            grad.addcmul_(e.log_().mul_(1.0 + beta).exp_().mul_(neg), upper)
        grad = grad.view(z.shape[0], z_all.shape[0])
        scale = grad_total * inv_t
        grad_z = (grad @ z_all).mul_(scale) if ctx.needs_input_grad[0] else None
        grad_z_all = (z.T @ grad).T.mul_(scale) if ctx.needs_input_grad[1] else None
        return grad_z, grad_z_all, None, None, None, None, None, None, None, None, None


def _differentiable_grads(ctx, general: Callable[[Tensor, Tensor], Tensor], grad_total: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """The gradients for z and z_all as differentiable functions of them (backward with
    create_graph=True): `general` recomputes the sum from the saved inputs and autograd, twice
    differentiable, takes it from there."""
    z, z_all = ctx.saved_tensors[:2]
    V = ctx.meta[0]
    total = general(z.view(z.shape[0] // V, V, -1), z_all.view(V, z_all.shape[0] // V, -1).transpose(0, 1))
    wanted = [t for t, needed in zip((z, z_all), ctx.needs_input_grad[:2]) if needed]
    grads = iter(torch.autograd.grad(total, wanted, grad_total, create_graph=True, allow_unused=True))
    return tuple(next(grads) if needed else None for needed in ctx.needs_input_grad[:2])  # type: ignore[return-value]


def _pair_terms(z: Tensor, z_all: Tensor, minus_counted: Tensor, negative: Tensor, own: Tensor, V: int, M: float, inv_t: float, hardening):
    """The forward computation in the (b, V, V, B) layout: e, -psi on counted positive pairs
    (0 elsewhere, the anchor's own entry included), the sum of weights and of weights x e per
    anchor, the per-anchor threshold level (None unless thresholded) and a = M x the weighted
    mean of e per anchor."""
    b, B = negative.shape
    tiny = torch.finfo(z.dtype).tiny
    neg = negative[:, None, None, :]
    g = ((z * inv_t) @ z_all.T).view(b, V, V, B)
    level = None
    uniform = hardening is None or (isinstance(hardening, ExponentialTilt) and hardening.beta == 0.0)
    if isinstance(hardening, ExponentialTilt) and not uniform and hardening.beta != 1.0:
        scratch = torch.mul(g, hardening.beta).exp_().mul_(neg)
        e = g.exp_()
        sum_w = scratch.sum(dim=(2, 3), keepdim=True)
    else:
        e = g.exp_()
        if isinstance(hardening, Threshold):
            level, scratch, sum_w = _threshold_weights(e, neg, V, math.exp(hardening.current_level * inv_t))
        else:
            scratch = e * neg
            sum_w = (negative.sum(dim=1) * V)[:, None, None, None] if uniform else scratch.sum(dim=(2, 3), keepdim=True)
    if not uniform:
        scratch.mul_(e)
    sum_we = scratch.sum(dim=(2, 3), keepdim=True).clamp_min_(tiny)
    sum_w = sum_w.clamp_min(tiny)
    a = sum_we.div(sum_w).mul_(M)
    y = torch.div(a, e, out=scratch)
    psi = y.log1p_() if math.log(M) - 2 * inv_t < math.log(_LOG1P_BELOW) else y.add_(1.0).log_()
    neg_psi = psi.mul_(minus_counted[:, None, None, :])
    neg_psi.view(-1).index_fill_(0, own, 0.0)
    return e, neg_psi, sum_w, sum_we, level, a


def _own_entries(b: int, V: int, B: int, offset: int, device: torch.device) -> Tensor:
    """Flat indices of each anchor against itself, (i, v, v, offset + i), in the (b, V, V, B) layout."""
    anchors = torch.arange(b, device=device)[:, None]
    views = torch.arange(V, device=device)[None, :]
    return (((anchors * V + views) * V + views) * B + offset + anchors).reshape(-1)


def _threshold_weights(e: Tensor, neg: Tensor, V: int, level: float) -> tuple[Tensor, Tensor, Tensor]:
    """Hard-negative indicator 1(e >= level) on negatives (level = e^{l/T} for the cosine level
    l), with uniform weights for an anchor whose hard set is empty; returns the per-anchor level
    actually used (0 for those anchors, which every e > 0 passes), the weights and their sum."""
    weights = torch.ge(e, level, out=torch.empty_like(e)).mul_(neg)
    sum_w = weights.sum(dim=(2, 3), keepdim=True)
    empty = sum_w == 0
    weights.add_(empty.to(e.dtype) * neg)
    sum_w = torch.where(empty, neg.sum(dim=3, keepdim=True) * V, sum_w)
    return torch.full_like(empty, level, dtype=e.dtype).masked_fill_(empty, 0.0), weights, sum_w  # level exact in e's dtype


def fused_psi_sum(
    z: Tensor,
    z_all: Tensor,
    labels_all: Tensor | None,
    offset: int,
    *,
    label_positives: bool,
    label_negatives: bool,
    M: float,
    temperature: float,
    hardening,
    detach_weights: bool,
    general: Callable[[Tensor, Tensor], Tensor],
) -> tuple[Tensor, Tensor]:
    """Sum of psi over the counted (anchor, positive) pairs and their number, for anchors z
    (b, V, d), global images offset..offset+b-1, against candidates z_all (B, V, d); positives
    and negatives are images sharing or not sharing the anchor's label or image, as asked. An
    anchor without negatives counts no pair. `general(z, z_all)` is the same sum computed by
    differentiable operations, used for a second derivative."""
    b, V, d = z.shape
    B = z_all.shape[0]
    positive, negative = image_sets(b, B, offset, labels_all, label_positives=label_positives,
                                    label_negatives=label_negatives, dtype=z.dtype, device=z.device)
    has_negative = negative.sum(dim=1) > 0
    count = (V * (V * positive.sum(dim=1).long() - 1) * has_negative).sum()
    minus_counted = positive.mul_(has_negative.to(z.dtype).neg_()[:, None])
    own = _own_entries(b, V, B, offset, z.device)
    slope = hardening.beta if isinstance(hardening, ExponentialTilt) and not detach_weights else 0.0
    total = _FusedInfoNCE.apply(
        z.reshape(b * V, d),
        z_all.transpose(0, 1).reshape(V * B, d),
        minus_counted,
        negative,
        own,
        V,
        float(M),
        temperature,
        hardening,
        float(slope),
        general,
    )
    return total, count
