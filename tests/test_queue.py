"""The labelled memory queue (hscl_zoo.losses.queue) and the loss reading it as extra candidates."""

import pytest
import torch

from hscl_zoo.losses.queue import MemoryQueue


def pushed(queue: MemoryQueue, start: int, n: int, d: int = 3) -> None:
    """Push rows whose every entry (and label) is their running number, so order is readable."""
    ids = torch.arange(start, start + n)
    queue.push(ids[:, None].float().expand(n, d), ids)


def test_fifo_keeps_the_newest_rows_oldest_first():
    queue = MemoryQueue(5)
    assert len(queue) == 0 and queue.rows()[0].shape == (0, 0)
    pushed(queue, 0, 3)
    rows, labels = queue.rows()
    assert labels.tolist() == [0, 1, 2] and rows[:, 0].tolist() == [0.0, 1.0, 2.0] and len(queue) == 3
    pushed(queue, 3, 4)
    assert queue.rows()[1].tolist() == [2, 3, 4, 5, 6] and len(queue) == 5
    pushed(queue, 7, 12)
    rows, labels = queue.rows()
    assert labels.tolist() == [14, 15, 16, 17, 18] and rows[:, 2].tolist() == [14.0, 15.0, 16.0, 17.0, 18.0]


def test_rows_are_detached_copies():
    queue = MemoryQueue(4)
    rows = torch.randn(2, 3, requires_grad=True)
    queue.push(rows, None)
    stored, labels = queue.rows()
    assert labels is None and not stored.requires_grad
    with torch.no_grad():
        rows.add_(1.0)
    assert not torch.equal(queue.rows()[0], rows.detach())


def test_state_round_trip_continues_identically():
    a, b = MemoryQueue(6, start_epoch=2), MemoryQueue(6, start_epoch=2)
    pushed(a, 0, 8)
    b.load_state_dict(a.state_dict())
    for queue in (a, b):
        pushed(queue, 8, 3)
        queue.set_epoch(1)
    assert torch.equal(a.rows()[0], b.rows()[0]) and torch.equal(a.rows()[1], b.rows()[1])
    assert not a.active and not b.active
    empty = MemoryQueue(6)
    empty.load_state_dict(MemoryQueue(6).state_dict())
    assert len(empty) == 0


@pytest.mark.parametrize("call, message", [
    (lambda: MemoryQueue(0), "queue_size must be a positive integer"),
    (lambda: MemoryQueue(4, start_epoch=0), "queue_start_epoch must be an integer >= 1"),
    (lambda: MemoryQueue(4).load_state_dict(MemoryQueue(5).state_dict()), "same queue_size"),
])
def test_bad_queue_settings(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_inconsistent_pushes_are_refused():
    queue = MemoryQueue(4)
    queue.push(torch.randn(2, 3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="3 dimensions"):
        queue.push(torch.randn(2, 5), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="needs labels with every push"):
        queue.push(torch.randn(2, 3), None)
    with pytest.raises(ValueError, match=r"\(n, d\) embeddings with \(n,\) labels"):
        queue.push(torch.randn(2, 3), torch.tensor([0]))
