"""One training step through the gradient cache, as the pretraining loop runs it with `chunk_size`.

The loop's plain step encodes the process's whole share of the batch at once; with `chunk_size`
it goes through `hscl_zoo.training.gradient_cache.gradient_cache_backward` instead, so that the
contrastive batch stays `batch_size` while only `chunk_size` images' activations are alive at a
time. Everything else of the loop (the loss gathering the global batch, mixed precision through
``accelerator.backward``, channels_last, a compiled model, the device augmentation before it) is
the same.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from hscl_zoo.losses.objective import ContrastiveLoss
from hscl_zoo.training.gradient_cache import gradient_cache_backward


def check_chunk_size(chunk_size: int, batch_size: int, views: int, num_processes: int) -> None:
    """Raise ValueError when ``chunk_size`` images (each with its ``views`` views, counted like
    ``batch_size``) exceed one process's share of the batch."""
    local = batch_size // num_processes
    if chunk_size > local:
        raise ValueError(
            f"chunk_size={chunk_size} exceeds the {local} images each of the {num_processes} process(es) encodes per "
            f"step (batch_size {batch_size} / {num_processes} processes, {views} views each): pass chunk_size <= {local} "
            "(a divisor of it keeps chunks equal), or unset it, as a share that fits in one chunk needs no cache."
        )


def gradient_cache_step(
    forward: nn.Module,
    loss_fn: ContrastiveLoss,
    views: Tensor,
    labels: Tensor | None,
    *,
    chunk_size: int,
    backward: Callable[[Tensor], None],
    channels_last: bool = False,
) -> tuple[Tensor, Tensor]:
    """Accumulate the batch's gradient into ``.grad`` chunk by chunk (``chunk_size`` images with
    all their views a pass); return (loss, embeddings).

    ``forward`` is the (prepared, possibly compiled) model, ``views`` one process's (B, V, C, H, W)
    batch and ``backward`` ``accelerator.backward``. The embeddings (B, V, d) are the ones the loss
    saw, detached, for the diagnostics. Zero the gradients before, step the optimiser after.
    """
    seen: list[Tensor] = []

    def loss_on(features: Tensor, batch_labels: Tensor | None) -> Tensor:
        seen.append(features.detach())
        return loss_fn(features, batch_labels)

    def encode(images: Tensor) -> Tensor:
        return forward(images.contiguous(memory_format=torch.channels_last) if channels_last else images)

    loss = gradient_cache_backward(encode, loss_on, views, labels, chunk_size=chunk_size,
                                   module=forward if isinstance(forward, nn.Module) else None, backward=backward)
    return loss, seen[0]


__all__ = ["check_chunk_size", "gradient_cache_step"]
