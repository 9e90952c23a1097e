"""Gathering the global batch for contrastive losses under torch.distributed.

`accelerator.gather` and `dist.all_gather` return tensors without a gradient path, which is right
for metrics and wrong inside a loss: negatives taken from other processes must still send their
gradient back to the process that produced them. `gather_with_grad` does that, on any backend
(gloo included) and for per-process batches of different sizes. It needs every process's batch
size; when the caller knows them (the training loop's batches are all equal) and passes them, it
skips the all-gather of the sizes, whose read-back is a host synchronisation per call on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _gather_sizes(n: int, device: torch.device) -> list[int]:
    size = torch.tensor([n], device=device, dtype=torch.long)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    return [int(s.item()) for s in sizes]


def _all_gather_padded(tensor: Tensor, sizes: list[int]) -> Tensor:
    longest = max(sizes)
    if tensor.shape[0] == longest:
        padded = tensor.contiguous()
    else:
        padded = tensor.new_zeros((longest, *tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([part[:n] for part, n in zip(parts, sizes)])


def _checked_sizes(sizes: Sequence[int], n: int) -> list[int]:
    """The caller's per-rank sizes, checked against what this process can see (its own size, the world)."""
    sizes = [int(s) for s in sizes]
    world, rank = dist.get_world_size(), dist.get_rank()
    if len(sizes) != world or sizes[rank] != n or min(sizes) < 0:
        raise ValueError(f"gather_with_grad: sizes={sizes} must give the batch size of each of the {world} processes "
                         f"in rank order; this process (rank {rank}) has {n}. Pass sizes=None to gather them.")
    return sizes


class _GatherWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: Tensor, sizes: list[int]) -> Tensor:  # type: ignore[override]
        rank = dist.get_rank()
        ctx.start = sum(sizes[:rank])
        ctx.stop = ctx.start + sizes[rank]
        return _all_gather_padded(tensor, sizes)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        grad = grad.contiguous()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.start : ctx.stop], None


def gather_with_grad(
    tensor: Tensor, *companions: Tensor | None, sizes: Sequence[int] | None = None
) -> tuple[Tensor, tuple[Tensor | None, ...], int]:
    """Concatenate `tensor` (first dim = local batch) from every process, in rank order.

    `companions` (e.g. labels) share the first dimension and are gathered without gradient;
    None stays None. Returns the global tensor, the global companions and this process's offset
    into them. Gradients reaching the global tensor are summed over processes and each process
    receives those of its own rows. Outside torch.distributed everything is returned as is.

    `sizes`: every process's first dimension in rank order, when the caller knows them (e.g.
    `[n] * world_size()` for equal batches); None gathers them, one more all-gather whose result
    the host reads. They must be right on every process: this process checks its own entry and
    their number, not the other processes' batches.
    """
    if not is_distributed():
        return tensor, companions, 0
    if sizes is None:
        sizes = _gather_sizes(tensor.shape[0], tensor.device)
    else:
        sizes = _checked_sizes(sizes, tensor.shape[0])
    offset = sum(sizes[: dist.get_rank()])
    gathered = _GatherWithGrad.apply(tensor, sizes) if tensor.requires_grad else _all_gather_padded(tensor, sizes)
    others = tuple(None if c is None else _all_gather_padded(c, sizes) for c in companions)
    return gathered, others, offset


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1
