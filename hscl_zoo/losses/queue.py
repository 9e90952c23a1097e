"""A labelled memory queue: more candidate rows for every anchor than one batch holds.

A hard-negative objective lives on the number of negatives each anchor meets. `MemoryQueue` keeps
the detached, normalised embeddings (and labels) of the last ``size`` rows that earlier steps'
global batches produced, and `ContrastiveLoss` (built with ``build_loss(..., queue_size=K)``)
appends them as extra candidate columns: negatives by the method's own rule (every row for
UCL/H-UCL, other-label rows for SCL/H-SCL), weighted by the same hardening function, and with
``queue_positives=True`` same-label rows also as positives. No gradient flows into the rows; they
are stale by the optimiser steps since they were pushed, which is why ``start_epoch`` can keep the
queue off (neither read nor filled) during the first epochs, when the encoder changes fastest.

The queue is training state: `state_dict` / `load_state_dict` hold it exactly (the ring buffer,
its write position and fill), and `hscl_zoo.training.checkpointing` saves it in every checkpoint
so that a resumed run reaches the weights of an uninterrupted one. Under torch.distributed the
loss pushes the gathered global batch, so every process holds the same queue.
"""

from __future__ import annotations

import torch
from torch import Tensor


class MemoryQueue:
    """A first-in first-out ring buffer of (embedding, label) rows.

    Args:
        size: how many rows it keeps (K >= 1); pushing more drops the oldest.
        start_epoch: the first (1-based) epoch in which the queue is read and filled; before it,
            `active` is False after `set_epoch` and the loss ignores the queue.

    The buffer is allocated on the first `push`, with that call's width, dtype and device; labels
    are kept if the first push has them (a labelled method) and must then come with every push.
    """

    def __init__(self, size: int, *, start_epoch: int = 1) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"queue_size must be a positive integer number of rows, got {size!r}; "
                             "leave it unset (0 in the recipe) for no queue.")
        if isinstance(start_epoch, bool) or not isinstance(start_epoch, int) or start_epoch < 1:
            raise ValueError(f"queue_start_epoch must be an integer >= 1 (the first epoch), got {start_epoch!r}.")
        self.size = size
        self.start_epoch = start_epoch
        self.active = True
        self.embeddings: Tensor | None = None
        self.labels: Tensor | None = None
        self.next = 0
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"MemoryQueue(size={self.size}, start_epoch={self.start_epoch}, rows={self.count}, active={self.active})"

    def set_epoch(self, epoch: int) -> None:
        """Switch the queue on from `start_epoch` (1-based epochs)."""
        self.active = epoch >= self.start_epoch

    def push(self, embeddings: Tensor, labels: Tensor | None) -> None:
        """Append rows (n, d) and their labels (n,) or None, detached; the oldest rows make room."""
        if embeddings.ndim != 2 or (labels is not None and labels.shape != embeddings.shape[:1]):
            raise ValueError(f"queue rows must be (n, d) embeddings with (n,) labels, got {tuple(embeddings.shape)} "
                             f"and {None if labels is None else tuple(labels.shape)}.")
        if self.embeddings is None:
            self.embeddings = embeddings.new_zeros((self.size, embeddings.shape[1]))
            self.labels = None if labels is None else labels.new_zeros(self.size, dtype=torch.int64)
        if embeddings.shape[1] != self.embeddings.shape[1]:
            raise ValueError(f"queue rows have {self.embeddings.shape[1]} dimensions, these have {embeddings.shape[1]}: "
                             "one queue serves one projection width.")
        if (labels is None) != (self.labels is None):
            raise ValueError("a labelled queue needs labels with every push, and an unlabelled one takes none: "
                             "use one queue per method.")
        rows = embeddings.detach()[-self.size :]
        index = (self.next + torch.arange(rows.shape[0], device=self.embeddings.device)) % self.size
        self.embeddings[index] = rows.to(self.embeddings)
        if labels is not None:
            self.labels[index] = labels.detach()[-self.size :].to(self.labels)
        self.next = (self.next + rows.shape[0]) % self.size
        self.count = min(self.count + rows.shape[0], self.size)

    def rows(self) -> tuple[Tensor, Tensor | None]:
        """The stored rows oldest first: embeddings (count, d) and labels (count,) or None.
        Empty (0, 0) before the first push."""
        if self.embeddings is None:
            return torch.zeros(0, 0), None
        order = (torch.arange(self.count, device=self.embeddings.device) + self.next - self.count) % self.size
        return self.embeddings[order], None if self.labels is None else self.labels[order]

    def state_dict(self) -> dict[str, Tensor]:
        """The exact state as tensors (safetensors-ready); an unfilled queue has empty tensors."""
        empty = torch.zeros(0)
        return {
            "embeddings": empty if self.embeddings is None else self.embeddings.detach().cpu().contiguous(),
            "labels": empty.long() if self.labels is None else self.labels.cpu().contiguous(),
            "labelled": torch.tensor(self.labels is not None),
            "position": torch.tensor([self.next, self.count, self.size], dtype=torch.int64),
        }

    def load_state_dict(self, state: dict[str, Tensor], device: torch.device | str | None = None) -> None:
        """Restore what `state_dict` returned (onto ``device``, else the CPU); the size must match."""
        next_row, count, size = (int(v) for v in state["position"])
        if size != self.size:
            raise ValueError(f"the saved queue holds {size} rows and this one {self.size}: resume with the same "
                             "queue_size, or start a new run.")
        self.next, self.count = next_row, count
        if state["embeddings"].numel() == 0 and count == 0:
            self.embeddings = self.labels = None
            return
        self.embeddings = state["embeddings"].to(device).clone()
        self.labels = state["labels"].to(device).clone() if bool(state["labelled"]) else None


def queue_masks(
    anchor_labels: Tensor | None,
    row_labels: Tensor | None,
    *,
    n_anchors: int,
    n_rows: int,
    label_negatives: bool,
    label_positives: bool,
    device: torch.device,
    unlabelled: int = -1,
    unlabelled_negatives: bool = True,
) -> tuple[Tensor, Tensor]:
    """(anchors x queue rows) boolean masks of negative and positive rows: every row is a negative
    without ``label_negatives`` (other images), a different-label row with it; with
    ``label_positives`` a same-label row is a positive, else no row is. Rows and anchors labelled
    ``unlabelled`` follow the batch's rule (docs/losses.md): an unlabelled anchor has every row as
    negative and none as positive, an unlabelled row is never a positive and is a labelled
    anchor's negative unless ``unlabelled_negatives`` is False."""
    if (label_negatives or label_positives) and (anchor_labels is None or row_labels is None):
        raise ValueError("this loss compares labels with the queue's rows but the queue holds none: "
                         "fill it through a loss that gathers labels (pass labels).")
    if anchor_labels is None or row_labels is None:
        shape = (n_anchors, n_rows)
        return torch.ones(shape, dtype=torch.bool, device=device), torch.zeros(shape, dtype=torch.bool, device=device)
    same = anchor_labels[:, None] == row_labels.to(anchor_labels.device)[None, :]
    negative = ~same if label_negatives else torch.ones_like(same)
    positive = same if label_positives else torch.zeros_like(same)
    anchor_unlabelled = (anchor_labels == unlabelled)[:, None]
    row_unlabelled = (row_labels.to(anchor_labels.device) == unlabelled)[None, :]
    if not unlabelled_negatives:
        negative = negative & ~row_unlabelled
    return negative | anchor_unlabelled, positive & ~anchor_unlabelled & ~row_unlabelled


__all__ = ["MemoryQueue", "queue_masks"]
