"""What a run needs from the device before it starts: a memory estimate, and the refusal of runs
that cannot fit.

A ResNet-50 with the small stem at 64 px saves tens of MiB of activations per image for its
backward pass; at 1,024 views a step that is tens of GiB, more than many GPUs hold. Finding out
after the data has loaded and the first step has allocated half the device wastes the launch and
reads as an obscure out-of-memory error, so the loop estimates first (`estimate_training_memory`)
and refuses or warns (`check_memory_fit`), pointing to the settings that shrink the need.

The estimate: the bytes autograd saves for backward, measured by a forward pass of two images
through a copy of the model on the meta device (shapes only, no arithmetic; shared storages
counted once), scaled to the images one
pass holds, halved for bf16/fp16 autocast (convolution and normalisation outputs are saved in
the half type); the parameters, their gradients and the optimiser's state in float32; and the
loss's N x N float32 buffers (its peak is 2.6-3.0 of them in `benchmarks/train_throughput.py
--loss-memory`; counted as 4). The allocator's caching, cuDNN workspaces and, on the CPU, the
buffers multi-threaded kernels keep during backward come on top, hence the warning margin.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["MemoryEstimate", "estimate_training_memory", "saved_activation_bytes", "check_memory_fit"]

GIB = 2**30
OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd": 1}
LOSS_MATRICES = 4
WARN_FRACTION = 0.85


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one training step needs on one process, by part."""

    activations: int
    parameters: int
    loss: int

    @property
    def total(self) -> int:
        return self.activations + self.parameters + self.loss

    def describe(self) -> str:
        return (f"{self.total / GIB:.1f} GiB (activations {self.activations / GIB:.1f}, parameters, gradients and "
                f"optimiser state {self.parameters / GIB:.1f}, loss {self.loss / GIB:.1f})")


def saved_activation_bytes(model: nn.Module, image_size: int) -> float:
    """Bytes autograd saves for backward per input image of side `image_size`, in float32.

    Runs two images (BatchNorm needs more than one) through a copy of `model` in training mode
    on the meta device: nothing is computed and the model itself is untouched. Tensors that
    share a storage (an activation saved by two layers) count once; parameters not at all.
    SyncBatchNorm layers are probed as the BatchNorm they save like (SyncBatchNorm refuses
    meta tensors once a process group exists, as under every multi-GPU launch).
    """
    probe = _local_batchnorm(copy.deepcopy(model)).to("meta", memory_format=torch.contiguous_format).train()
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        seen.setdefault(storage._cdata, storage.nbytes())
        return tensor

    parameters = {p.untyped_storage()._cdata for p in probe.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        probe(torch.zeros(2, 3, image_size, image_size, device="meta"))
    return sum(nbytes for ptr, nbytes in seen.items() if ptr not in parameters) / 2


class _LocalBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm of any input rank (SyncBatchNorm serves 1d, 2d and 3d inputs alike)."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        pass


def _local_batchnorm(module: nn.Module) -> nn.Module:
    """`module` with every SyncBatchNorm replaced, in place, by a local BatchNorm holding its parameters."""
    if isinstance(module, nn.SyncBatchNorm):
        local = _LocalBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                               module.track_running_stats)
        local.load_state_dict(module.state_dict())
        return local
    for name, child in module.named_children():
        setattr(module, name, _local_batchnorm(child))
    return module


def estimate_training_memory(
    model: nn.Module,
    *,
    image_size: int,
    images_per_pass: int,
    local_views: int,
    global_views: int,
    mixed_precision: str,
    optimizer: str,
) -> MemoryEstimate:
    """The memory of one step on one process (see the module doc for what is counted).

    `images_per_pass`: the views one forward pass holds (the per-process batch times the views,
    or a gradient-cache chunk); `local_views` x `global_views`: the loss's similarity matrix.
    """
    per_image = saved_activation_bytes(model, image_size)
    if mixed_precision in ("bf16", "fp16"):
        per_image /= 2
    n_parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return MemoryEstimate(
        activations=int(per_image * images_per_pass),
        parameters=n_parameters * 4 * (2 + OPTIMIZER_STATES.get(optimizer, 2)),
        loss=LOSS_MATRICES * 4 * local_views * global_views,
    )


def check_memory_fit(estimate: MemoryEstimate, available: int, *, setting: str) -> str | None:
    """Raise ValueError when `estimate` exceeds `available` bytes; return a warning when it takes
    more than 85% of them (None otherwise). `setting` names the run in the message."""
    advice = ("Lower the activation memory: set chunk_size (the gradient cache: the same gradient, one chunk of "
              "images in memory at a time), a smaller batch_size, mixed_precision bf16, or more processes.")
    if estimate.total > available:
        raise ValueError(f"{setting} needs about {estimate.describe()} per process, more than the "
                         f"{available / GIB:.1f} GiB free on the device. {advice}")
    if estimate.total > WARN_FRACTION * available:
        return (f"warning: {setting} needs about {estimate.describe()} per process, {estimate.total / available:.0%} "
                f"of the {available / GIB:.1f} GiB free on the device; the allocator's cache and cuDNN workspaces may "
                f"not fit. {advice}")
    return None
