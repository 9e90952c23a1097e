"""The terms the contrastive objective is built from (`hscl_zoo.losses.objective`, and the
diagnostics that take the same pairs apart): the input checks, unit normalisation with an exact
backward, the scaled Gram matrix, the positive and negative pair sets of a batch, and the
log-space weighted mean of the negatives with its debiased form (docs/losses.md).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hscl_zoo.losses.fused import autocast_off
from hscl_zoo.losses.hardening import HardeningFn, log_hardening_weight


class PairSets:
    """Boolean (local anchors x global candidates) masks of the sets in the loss contract."""

    def __init__(self, same_image: Tensor, other_images: Tensor, same_label: Tensor | None, other_labels: Tensor | None):
        self.same_image = same_image
        self.other_images = other_images
        self._same_label = same_label
        self._other_labels = other_labels

    @property
    def same_label(self) -> Tensor:
        if self._same_label is None:
            raise ValueError("label positives need labels: pass labels=... of shape (B,).")
        return self._same_label

    @property
    def other_labels(self) -> Tensor:
        if self._other_labels is None:
            raise ValueError("label-aware negatives need labels: pass labels=... of shape (B,).")
        return self._other_labels

    @property
    def collisions(self) -> Tensor:
        """C_i: same label, another image."""
        return self.same_label & self.other_images


def pair_sets(
    batch: int, views: int, global_batch: int, offset: int, labels_all: Tensor | None, *, device: torch.device
) -> PairSets:
    """Masks over (anchor, candidate) for anchors = this process's B*V embeddings (image-major)
    and candidates = the global batch's embeddings; the anchor itself is in no set."""
    anchor_image = torch.arange(offset, offset + batch, device=device).repeat_interleave(views)
    candidate_image = torch.arange(global_batch, device=device).repeat_interleave(views)
    anchor_index = torch.arange(batch * views, device=device) + offset * views
    candidate_index = torch.arange(global_batch * views, device=device)
    is_self = anchor_index[:, None] == candidate_index[None, :]
    same_image_any = anchor_image[:, None] == candidate_image[None, :]
    same_image = same_image_any & ~is_self
    other_images = ~same_image_any
    if labels_all is None:
        return PairSets(same_image, other_images, None, None)
    label_a = labels_all[offset : offset + batch].repeat_interleave(views)
    label_c = labels_all.repeat_interleave(views)
    same_label_any = label_a[:, None] == label_c[None, :]
    return PairSets(same_image, other_images, same_label_any & ~is_self, ~same_label_any)


def log_weighted_mean_exp(
    g: Tensor, negative: Tensor, has_negative: Tensor, hardening: HardeningFn | None, detach_weights: bool = False
) -> Tensor:
    """log( sum_j w_ij e^{g_ij} / sum_j w_ij ) over each row's negatives.

    Uniform weights when `hardening` is None or a row's hard set is empty. Rows without any
    negative get a finite placeholder (callers must not count them), so that no NaN reaches
    the gradient.
    """
    usable = negative | ~has_negative[:, None]
    if hardening is None:
        return torch.logsumexp(g.masked_fill(~usable, -math.inf), dim=1) - usable.sum(dim=1).to(g.dtype).log()
    log_w = log_hardening_weight(hardening, g.detach() if detach_weights else g).masked_fill(~usable, -math.inf)
    has_hard = torch.isfinite(log_w).any(dim=1, keepdim=True)
    log_w = torch.where(has_hard, log_w, torch.zeros_like(log_w).masked_fill(~usable, -math.inf))
    return torch.logsumexp(log_w + g, dim=1) - torch.logsumexp(log_w, dim=1)


def debiased_log_mean(log_mean: Tensor, g_pos: Tensor, tau_plus: float, temperature: float) -> Tensor:
    """log max((E - tau_plus e^{g_ip}) / (1 - tau_plus), e^{-1/temperature}) for every pair, in log
    space: log E + log(1 - e^u) - log(1 - tau_plus) with u = log(tau_plus e^{g_ip} / E), so the
    floor is exactly -1/temperature at any temperature and nothing overflows or underflows. Pairs
    with u >= 0 (E no larger than tau_plus e^{g_ip}) take the floor, and no gradient, as the
    clamp of the formula gives them."""
    u = g_pos + math.log(tau_plus) - log_mean
    floored = u >= -torch.finfo(u.dtype).tiny  # keeps 1 / (1 - e^u), the derivative, finite
    log_one_minus = torch.log(-torch.expm1(u.masked_fill(floored, -1.0)))
    log_unfloored = (log_mean + log_one_minus - math.log1p(-tau_plus)).masked_fill(floored, -math.inf)
    return log_unfloored.clamp_min(-1.0 / temperature)


def normalized(features: Tensor, *, loss_name: str, check_finite: bool = True) -> Tensor:
    """Features L2-normalised along the last dimension, in float64 if given float64, else float32.

    With `check_finite`, refuses NaN and inf (and values so large that their norm overflows) with
    a ValueError. The check reads the B*V norms the normalisation computes anyway, so it costs one
    reduction over B*V numbers; on a GPU it also costs one host synchronisation per call (the CPU
    waits for the encoder's forward before queueing the loss). Without it, non-finite features give
    a non-finite loss, for the caller to check.
    """
    return _UnitNormalize.apply(features.to(torch.float64 if features.dtype == torch.float64 else torch.float32),
                                loss_name if check_finite else None)


class _UnitNormalize(torch.autograd.Function):
    """z = f / max(|f|, eps) with the backward written out: (g - z <g, z>) / |f| where unclamped;
    under create_graph=True that formula is recomputed from f, so it is differentiable again."""

    eps = 1e-12

    @staticmethod
    @autocast_off
    def forward(ctx, f: Tensor, loss_name: str | None) -> Tensor:  # type: ignore[override]
        norms = torch.linalg.vector_norm(f, dim=-1, keepdim=True)
        if loss_name is not None and not bool(torch.isfinite(norms).all()):
            raise ValueError(
                f"{loss_name}: features contain NaN or inf (or values whose norm overflows); check the encoder's "
                "output (learning rate, mixed precision)."
            )
        z = f / norms.clamp_min(_UnitNormalize.eps)
        ctx.save_for_backward(f, z, norms)
        return z

    @staticmethod
    @autocast_off
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        f, z, norms = ctx.saved_tensors
        if torch.is_grad_enabled():
            norms = torch.linalg.vector_norm(f, dim=-1, keepdim=True)
            z = f / norms.clamp_min(_UnitNormalize.eps)
        along = (grad * z).sum(dim=-1, keepdim=True) * (norms >= _UnitNormalize.eps)
        return (grad - z * along) / norms.clamp_min(_UnitNormalize.eps), None


class _ScaledGram(torch.autograd.Function):
    """g = (a @ b.T) * scale, the general path's similarity matmul, with its backward pinned to
    float32 under autocast and written with out-of-place operations, so it is differentiable again."""

    @staticmethod
    @autocast_off
    def forward(ctx, a: Tensor, b: Tensor, scale: float) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(a, b)
        ctx.scale = scale
        return (a @ b.T).mul_(scale)

    @staticmethod
    @autocast_off
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        a, b = ctx.saved_tensors
        grad_a = (grad @ b) * ctx.scale if ctx.needs_input_grad[0] else None
        grad_b = (grad.T @ a) * ctx.scale if ctx.needs_input_grad[1] else None
        return grad_a, grad_b, None


def validate_inputs(features: Tensor, labels: Tensor | None, *, needs_labels: bool, loss_name: str) -> Tensor | None:
    """Check the call contract's shapes and types and return labels as int64 (or None); raise
    ValueError saying what to pass. `normalized` checks the values."""
    if not isinstance(features, Tensor):
        raise ValueError(f"{loss_name}: features must be a torch.Tensor of shape (B, V, d), got {type(features).__name__}.")
    if features.ndim != 3:
        hint = " Stack the views: torch.stack([view1, view2], dim=1)." if features.ndim == 2 else ""
        raise ValueError(f"{loss_name}: features must have shape (B, V, d), got {tuple(features.shape)}.{hint}")
    B, V, d = features.shape
    if V < 2:
        raise ValueError(f"{loss_name}: needs V >= 2 views per image (features of shape (B, V, d)), got V = {V}.")
    if B < 1 or d < 1:
        raise ValueError(f"{loss_name}: features of shape {tuple(features.shape)} are empty; pass at least one image.")
    if not features.is_floating_point():
        raise ValueError(f"{loss_name}: features must be floating point, got {features.dtype}.")
    if labels is None:
        if needs_labels:
            raise ValueError(f"{loss_name}: needs labels: call loss_fn(features, labels) with labels of shape ({B},), int64.")
        return None
    if not isinstance(labels, Tensor):
        raise ValueError(f"{loss_name}: labels must be a torch.Tensor of shape ({B},), int64, got {type(labels).__name__}.")
    if labels.shape != (B,):
        raise ValueError(f"{loss_name}: labels must have shape ({B},) to match features {tuple(features.shape)}, got {tuple(labels.shape)}.")
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise ValueError(f"{loss_name}: labels must be integer class ids (int64), got {labels.dtype}; use labels.long().")
    return labels.to(device=features.device, dtype=torch.int64)

