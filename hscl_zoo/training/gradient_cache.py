"""Exact large-batch gradients in the memory of a small batch: the gradient cache.

A contrastive loss couples every embedding of its batch, so gradient accumulation (several small
batches, one optimiser step) is not a large batch: each anchor only meets the negatives of its
own micro-batch. The gradient cache (the idea of Gao et al., "Scaling Deep Contrastive Learning
Batch Size under Memory Limited Setup", 2021) reaches the large batch's gradient in two passes
over chunks of images:

1. every chunk is encoded without an autograd graph, recording the random state before it; the
   loss is computed once on all embeddings and back-propagated to them only (a B*V x d tensor);
2. every chunk is encoded again, with a graph and the same random state (dropout, stochastic
   depth draw the same masks), and its slice of the embedding gradient is back-propagated through
   it, accumulating into the parameters' ``.grad``.

By the chain rule the accumulated gradient is that of ``loss_fn(encode(all images), labels)``;
only one chunk's activations are alive at a time. The price is one extra forward pass.

BatchNorm. A layer that normalises with batch statistics sees one chunk at a time, in both
passes alike, so the gradient is exact for a model that normalises each chunk separately (a
"ghost batch" of ``chunk_size`` images with their views), not for one that normalises the whole batch at once;
the loss still compares every embedding with every other. The choices (`prepare_batchnorm`):

* ``"per-chunk"`` (the default; the model is left as it is): statistics of each chunk on each
  process, the way DDP without SyncBatchNorm already normalises per process.
* ``"sync"``: BatchNorm layers become ``torch.nn.SyncBatchNorm`` (before wrapping in DDP):
  statistics of chunk k taken over all processes (``chunk_size`` x world images). Every process
  must then run the same number of chunks (checked), and SyncBatchNorm itself runs only on GPUs
  (or other accelerators) under torch.distributed; in one process it is plain BatchNorm.

A model without batch statistics (GroupNorm, LayerNorm, or BatchNorm in eval mode) gets the large
batch's gradient exactly. Running statistics are updated once per chunk, in the second pass: every
buffer of the module is restored after the first.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Literal

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from hscl_zoo.losses.distributed import _gather_sizes, is_distributed

BatchNormMode = Literal["per-chunk", "sync"]
BATCHNORM_MODES: tuple[str, ...] = ("per-chunk", "sync")
"""What `prepare_batchnorm` accepts: BatchNorm statistics of each chunk on its own process, or over
all processes (SyncBatchNorm)."""

_RngState = tuple[Tensor, list[Tensor] | None]


def prepare_batchnorm(model: nn.Module, mode: BatchNormMode) -> nn.Module:
    """Return ``model`` ready for the gradient cache under BatchNorm ``mode`` (see the module doc).

    ``"per-chunk"`` returns the model unchanged; ``"sync"`` returns it with every BatchNorm layer
    converted to ``torch.nn.SyncBatchNorm`` (call it before DDP wrapping and before building the
    optimiser, as the layers are new modules holding the same parameters).
    """
    if mode == "per-chunk":
        return model
    if mode == "sync":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    raise ValueError(f"BatchNorm mode must be one of {BATCHNORM_MODES}, got {mode!r}.")


def gradient_cache_backward(
    encode: Callable[[Tensor], Tensor],
    loss_fn: Callable[[Tensor, Tensor | None], Tensor],
    views: Tensor,
    labels: Tensor | None,
    *,
    chunk_size: int,
    module: nn.Module | None = None,
    backward: Callable[[Tensor], None] | None = None,
) -> Tensor:
    """Accumulate into ``.grad`` the gradient of ``loss_fn(encode(all views), labels)``, chunk by chunk.

    Args:
        encode: maps images (n, C, H, W) to embeddings (n, d); usually the model (or its
            DDP / torch.compile wrapper) in training mode.
        loss_fn: called once as ``loss_fn(features, labels)`` with features (B, V, d), e.g. a
            `hscl_zoo.ContrastiveLoss`; under torch.distributed it gathers the global batch
            itself, as without the cache.
        views: (B, V, C, H, W), B images with V views each, cut into consecutive chunks of
            ``chunk_size`` images; a chunk's views are encoded together as
            ``views[start:stop].flatten(0, 1)`` (image-major, as the loss reads them).
        labels: (B,) or None, passed to the loss.
        chunk_size: images encoded at once, with all their views (1 <= chunk_size <= B): counted
            like ``batch_size``, so a pass holds ``chunk_size * V`` embeddings; peak activation
            memory is that of one chunk.
        module: the ``nn.Module`` that ``encode`` runs, when ``encode`` is a plain function.
            Its buffers are restored after the first pass (BatchNorm running statistics change
            once), and if it is DDP (or a torch.compile of DDP) only the last chunk's backward
            all-reduces gradients.
        backward: how the loss is back-propagated to the embeddings; None is ``loss.backward()``.
            Pass ``accelerator.backward`` so that its fp16 loss scaling (and division by the
            accumulation steps) reaches the embedding gradient and hence the parameters'.

    Returns the loss, detached: the value ``loss_fn`` returns on the whole batch. Random ops
    inside ``encode`` replay the same state of torch's CPU and CUDA generators in both passes,
    and the generators end where encoding the chunks once and then the loss leave them. Zero the gradients
    before the call, as before ``loss.backward()``.
    """
    if module is None:
        if not isinstance(encode, nn.Module):
            raise ValueError(
                "encode is not an nn.Module: pass module=<the model encode runs> so that its buffers "
                "(BatchNorm running statistics) are updated once and DDP reduces gradients once."
            )
        module = encode
    if not isinstance(views, Tensor) or views.ndim != 5:
        shape = tuple(views.shape) if isinstance(views, Tensor) else type(views).__name__
        raise ValueError(
            f"views must be a (B, V, C, H, W) tensor (B images, V views each), got {shape}; "
            "for a flat (B*V, C, H, W) batch pass x.view(B, V, *x.shape[1:])."
        )
    B, V = views.shape[:2]
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive integer (images encoded at once), got {chunk_size!r}.")
    if chunk_size > B:
        raise ValueError(
            f"chunk_size={chunk_size} exceeds the {B} images of this batch (of {V} views each): "
            f"pass chunk_size <= {B} (a divisor of it keeps chunks equal), or call the loss directly, "
            "as a batch that fits in one chunk needs no cache."
        )
    images = views.flatten(0, 1)
    bounds = [(start * V, min(start + chunk_size, B) * V) for start in range(0, B, chunk_size)]
    _check_lockstep(module, len(bounds), views.device)

    saved_buffers = [(buffer, buffer.detach().clone()) for buffer in module.buffers()]
    states, outputs = [], []
    with torch.no_grad():
        for start, stop in bounds:
            states.append(_rng_state())
            outputs.append(_checked_embeddings(encode(images[start:stop]), stop - start))
        for buffer, value in saved_buffers:
            buffer.copy_(value)
    del saved_buffers

    embeddings = torch.cat(outputs).requires_grad_(True)
    del outputs
    loss = loss_fn(embeddings.view(B, V, -1), labels)
    (backward or Tensor.backward)(loss)
    grad = embeddings.grad
    del embeddings
    end_state = _rng_state()

    ddp = _find_ddp(module)
    for index, ((start, stop), state) in enumerate(zip(bounds, states)):
        _set_rng_state(state)
        last = index == len(bounds) - 1
        with nullcontext() if ddp is None or last else ddp.no_sync():
            torch.autograd.backward(encode(images[start:stop]), grad[start:stop])
    _set_rng_state(end_state)
    return loss.detach()


def _checked_embeddings(out: Tensor, n: int) -> Tensor:
    if not isinstance(out, Tensor) or out.ndim != 2 or out.shape[0] != n:
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"encode must return (n, d) embeddings for n = {n} images, got {shape}.")
    return out.detach()


def _rng_state() -> _RngState:
    """The CPU generator's state, and every CUDA generator's once CUDA is in use (a CUDA tensor or
    op initialises it; before that no CUDA op can draw)."""
    return torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None


def _set_rng_state(state: _RngState) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def _find_ddp(module: nn.Module) -> DistributedDataParallel | None:
    """The DDP wrapper of ``module``, looking through torch.compile's ``_orig_mod``."""
    while module is not None:
        if isinstance(module, DistributedDataParallel):
            return module
        module = getattr(module, "_orig_mod", None)
    return None


def _check_lockstep(module: nn.Module, n_chunks: int, device: torch.device) -> list[int] | None:
    """Under torch.distributed, a forward pass that communicates (SyncBatchNorm in training, DDP
    broadcasting buffers) must run as often on every process: gather every rank's chunk count and
    refuse unequal ones. Returns the counts per rank, or None where no check is needed."""
    if not is_distributed():
        return None
    why = _lockstep_reason(module)
    if why is None:
        return None
    per_rank = _gather_sizes(n_chunks, device)
    _refuse_unequal_chunks(per_rank, why)
    return per_rank


def _lockstep_reason(module: nn.Module) -> str | None:
    """What in ``module``'s forward pass communicates across processes, or None when nothing does."""
    if any(isinstance(m, nn.SyncBatchNorm) and m.training for m in module.modules()):
        return "SyncBatchNorm"
    ddp = _find_ddp(module)
    if ddp is not None and ddp.broadcast_buffers and any(True for _ in ddp.buffers()):
        return "DDP broadcasting buffers"
    return None


def _refuse_unequal_chunks(per_rank: list[int], why: str) -> None:
    if len(set(per_rank)) > 1:
        raise ValueError(
            f"with {why} every process must encode the same number of chunks, got {per_rank} per rank: "
            "give every process the same number of images (drop_last=True) or a chunk_size that "
            "yields as many chunks on each (or DDP(broadcast_buffers=False) where that is meant)."
        )
