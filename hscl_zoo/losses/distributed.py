"""Gathering the global batch for contrastive losses under torch.distributed.

`accelerator.gather` and `dist.all_gather` return tensors without a gradient path, which is right
for metrics and wrong inside a loss: negatives taken from other processes must still send their
gradient back to the process that produced them. `gather_with_grad` does that, on any backend
(gloo included) and for per-process batches of different sizes.
"""

from __future__ import annotations

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
    padded = tensor.new_zeros((longest, *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([part[:n] for part, n in zip(parts, sizes)])


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


def gather_with_grad(tensor: Tensor, *companions: Tensor | None) -> tuple[Tensor, tuple[Tensor | None, ...], int]:
    """Concatenate `tensor` (first dim = local batch) from every process, in rank order.

    `companions` (e.g. labels) share the first dimension and are gathered without gradient;
    None stays None. Returns the global tensor, the global companions and this process's offset
    into them. Gradients reaching the global tensor are summed over processes and each process
    receives those of its own rows. Outside torch.distributed everything is returned as is.
    """
    if not is_distributed():
        return tensor, companions, 0
    sizes = _gather_sizes(tensor.shape[0], tensor.device)
    offset = sum(sizes[: dist.get_rank()])
    gathered = _GatherWithGrad.apply(tensor, sizes) if tensor.requires_grad else _all_gather_padded(tensor, sizes)
    others = tuple(None if c is None else _all_gather_padded(c, sizes) for c in companions)
    return gathered, others, offset


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1
