"""Frozen features: every image of a table encoded once, in order, with the deterministic
evaluation transform. The probes (:mod:`hscl_zoo.probes`), the audit, retrieval, the embedding
command and the training loop's kNN monitor all read features made here.

Rows are decoded image by image (PIL, on the CPU), unless a training run already holds them
decoded in a uint8 tensor (its image cache): then :func:`encode_uint8` moves batches of that
tensor to the device and applies the encoder's own transform there, and no row is decoded again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contextlib import nullcontext

import datasets
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from hscl_zoo.data.datasets import require_internal_columns

__all__ = ["encode_uint8", "extract_features"]


class _TransformedImages(torch.utils.data.Dataset):
    """Rows of an internal-form table as ``(transform(image), label)`` pairs."""

    def __init__(self, dataset: datasets.Dataset, transform: Callable[[Any], Tensor]) -> None:
        self.dataset = dataset
        self.transform = transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        row = self.dataset[int(index)]
        return self.transform(row["image"]), int(row["label"])


def extract_features(
    encode_fn: Callable[[Tensor], Tensor],
    dataset: datasets.Dataset,
    transform: Callable[[Any], Tensor],
    *,
    batch_size: int = 256,
    device: str | torch.device | None = None,
    num_workers: int = 0,
    progress: bool = True,
    images: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Encode every row of ``dataset`` once, in order, with a frozen encoder.

    Args:
        encode_fn: maps a float batch (B, 3, H, W) to features (B, D), e.g. a model's
            ``forward_features`` plus pooling. If it is an ``nn.Module`` or a bound method of
            one, that module is put in eval mode for the pass and its mode restored afterwards.
        dataset: table with ``image`` and ``label`` columns (see ``hscl_zoo.data.datasets``).
        transform: deterministic preprocessing, normally ``hscl_zoo.data.transforms.eval_transform(cfg)``.
        batch_size: images per forward pass.
        device: where the batches go; by default the device of the module's first parameter,
            else CPU.
        num_workers: DataLoader workers decoding and transforming images.
        progress: show a tqdm bar.
        images: the rows already decoded, a uint8 (N, 3, H, W) tensor in ``dataset``'s order (a
            training run's image cache): no row is decoded, and ``transform`` must take uint8
            batches, as an encoder's own ``transform`` does (see :func:`encode_uint8`).

    Returns:
        ``(features, labels)``: float32 (N, D) and int64 (N,), both on CPU, in dataset order.
    """
    require_internal_columns(dataset, "extract_features")
    if len(dataset) == 0:
        raise ValueError("extract_features got an empty dataset")
    module = _owning_module(encode_fn)
    target = torch.device(device) if device is not None else _module_device(module)
    if images is not None:
        if images.dtype != torch.uint8 or images.ndim != 4 or len(images) != len(dataset):
            raise ValueError(f"images must be the dataset's {len(dataset)} rows as a uint8 (N, 3, H, W) tensor, got "
                             f"{images.dtype} {tuple(images.shape)}; pass the cache of these very rows, or None.")
        labels = torch.as_tensor(dataset.select_columns(["label"])["label"], dtype=torch.int64)
        return encode_uint8(encode_fn, transform, images, batch_size=batch_size, device=target,
                            progress=progress), labels
    loader = torch.utils.data.DataLoader(
        _TransformedImages(dataset, transform),
        batch_size=batch_size,
        shuffle=False,
        num_workers=num_workers,
    )
    was_training = module.training if module is not None else False
    if module is not None:
        module.eval()
    feats: list[Tensor] = []
    labels: list[Tensor] = []
    try:
        with torch.inference_mode():
            for images, batch_labels in tqdm(
                loader, desc="features", disable=not progress, leave=False
            ):
                out = encode_fn(images.to(target, non_blocking=True))
                if not isinstance(out, Tensor) or out.ndim != 2 or out.shape[0] != len(images):
                    shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                    raise ValueError(
                        f"encode_fn must return a (batch, dim) tensor, got {shape}; pool "
                        f"spatial maps first (e.g. timm's forward_head(x, pre_logits=True))"
                    )
                feats.append(out.detach().float().cpu())
                labels.append(batch_labels.to(torch.int64))
    finally:
        if module is not None:
            module.train(was_training)
    return torch.cat(feats), torch.cat(labels)


def encode_uint8(
    encode_fn: Callable[[Tensor], Tensor],
    transform: Callable[[Tensor], Tensor],
    images: Tensor,
    *,
    batch_size: int = 256,
    device: str | torch.device | None = None,
    autocast_dtype: torch.dtype | None = None,
    progress: bool = False,
) -> Tensor:
    """Features (float32, on the CPU, in order) of a uint8 image tensor (N, 3, H, W), a batch at a
    time: each batch travels to ``device`` as uint8 (a quarter of float32's bytes) and
    ``transform`` (an encoder's own: it takes uint8 batches) scales and normalises it there.

    Where the images are at the model's input size the transform only scales and normalises, the
    arithmetic of the PIL path; a resize runs torch's antialiased kernel, which differs slightly
    from PIL's. ``autocast_dtype`` (bf16 for the kNN monitor on CUDA) runs the encoder under
    autocast; None keeps float32. The owning module is in eval mode for the pass."""
    module = _owning_module(encode_fn)
    target = torch.device(device) if device is not None else _module_device(module)
    autocast = torch.autocast(target.type, dtype=autocast_dtype) if autocast_dtype is not None else nullcontext()
    was_training = module.training if module is not None else False
    if module is not None:
        module.eval()
    parts: list[Tensor] = []
    try:
        with torch.inference_mode(), autocast:
            for chunk in tqdm(images.split(batch_size), desc="features", disable=not progress, leave=False):
                parts.append(encode_fn(transform(chunk.to(target, non_blocking=True))).float().cpu())
    finally:
        if module is not None:
            module.train(was_training)
    return torch.cat(parts)


def _owning_module(encode_fn: Callable[[Tensor], Tensor]) -> nn.Module | None:
    if isinstance(encode_fn, nn.Module):
        return encode_fn
    owner = getattr(encode_fn, "__self__", None)
    return owner if isinstance(owner, nn.Module) else None


def _module_device(module: nn.Module | None) -> torch.device:
    if module is not None:
        for tensor in module.parameters():
            return tensor.device
    return torch.device("cpu")
