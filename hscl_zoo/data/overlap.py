"""Device views made one batch ahead, so that the augmentation of batch k+1 runs while step k does.

Serially, a step waits for its batch's views: :class:`~hscl_zoo.data.device_augment.BatchSimCLRAugment`
draws the parameters on the CPU, copies them to the device (a copy from pageable memory waits for
the stream) and runs its kernels, and only then can the step's kernels start; on an H100 the
augmentation of a ResNet-18 batch takes about two thirds of the step's time, spent one after the
other. :class:`OverlappedViews` makes batch k+1's views on a side CUDA stream before it hands out
batch k: the device runs them beside step k, the host's waits for the parameter copies fall on
the side stream only, and step k+1 waits for its views through an event.

The views are the serial loop's, bit for bit: the same augmenter draws from the same generator in
the same order (one batch earlier in time), and the kernels are the same. What the one batch
ahead changes is the generator's state while step k runs: it has drawn batch k+1 already.
:meth:`OverlappedViews.rewind` puts it back to where the serial loop would have it (before batch
k+1), which a checkpoint taken within the epoch needs, so that a resumed run draws batch k+1 again.
On the CPU nothing runs beside anything; the same order is kept, so the loop is the same there.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import Tensor

from hscl_zoo.data.device_augment import BatchSimCLRAugment

__all__ = ["OverlappedViews"]


class OverlappedViews:
    """Iterate ``(views, labels, index)`` over the ``(images, labels, index)`` batches of
    ``batches`` (already on ``device``), each batch's views made by ``augment`` one batch ahead,
    on a side stream on CUDA. One pass per ``iter``; ``len`` is the batches'."""

    def __init__(self, batches: Iterable[tuple[Tensor, Tensor, Any]], augment: BatchSimCLRAugment,
                 device: torch.device | str) -> None:
        self.batches, self.augment, self.device = batches, augment, torch.device(device)
        self._ahead_state: Tensor | None = None

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]

    def rewind(self) -> None:
        """Set the augmenter's generator back to its state before the batch made ahead (if one
        is), as the serial loop leaves it after the batch handed out last."""
        if self._ahead_state is not None:
            self.augment.generator.set_state(self._ahead_state)
            self._ahead_state = None

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor, Any]]:
        side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        source = iter(self.batches)
        ahead = self._make(next(source, None), side)
        while ahead is not None:
            views, labels, index, done = ahead[:4]
            ahead = self._make(next(source, None), side)
            self._ahead_state = None if ahead is None else ahead[4]
            if done is not None:
                current = torch.cuda.current_stream(self.device)
                current.wait_event(done)
                views.record_stream(current)  # made on the side stream, read on this one
            yield views, labels, index
        self._ahead_state = None

    def _make(self, batch: tuple[Tensor, Tensor, Any] | None, side: torch.cuda.Stream | None) -> tuple | None:
        """The views of ``batch`` (None at the end), the event they are ready at (None on the
        CPU) and the generator's state before they were drawn."""
        if batch is None:
            return None
        images, labels, index = batch
        state = self.augment.generator.get_state()
        if side is None:
            return self.augment(images), labels, index, None, state
        side.wait_stream(torch.cuda.current_stream(self.device))  # the batch's copy to the device is queued there
        with torch.cuda.stream(side):
            views = self.augment(images)
            done = torch.cuda.Event()
            done.record(side)
        images.record_stream(side)
        return views, labels, index, done, state
