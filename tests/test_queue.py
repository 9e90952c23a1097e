"""The labelled memory queue (hscl_zoo.losses.queue) and the loss reading it as extra candidates."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from hscl_zoo import build_loss
from hscl_zoo.losses.queue import MemoryQueue
from hscl_zoo.losses.reference import reference_loss
from test_distributed import SIZES, _free_port, full_batch
from test_losses import CASES, LABELS, features


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


def filled(loss, K: int = 7, d: int = 4, seed: int = 11) -> tuple[torch.Tensor, torch.Tensor]:
    """Push K random unit rows with labels 0..4 (some shared with the batch, label 5 not) into the
    loss's queue, as earlier steps would have; return them."""
    gen = torch.Generator().manual_seed(seed)
    rows = F.normalize(torch.randn(K, d, generator=gen, dtype=torch.float64), dim=-1)
    row_labels = torch.tensor([0, 1, 2, 5, 3, 0, 1])[:K]
    loss.queue.push(rows, row_labels)
    return rows, row_labels


@pytest.mark.parametrize("positives, queue_positives", [("views", False), ("labels", False), ("labels", True)])
@pytest.mark.parametrize("case", list(CASES))
def test_queue_rows_are_extra_candidates_of_the_loop_reference(case, positives, queue_positives):
    """Value and gradient against the float64 loop with the queue rows appended as candidates; the
    default M counts the rows; queue rows in use take the general path. (queue_positives with view
    positives is refused: test_queue_positives_need_label_positives.)"""
    kwargs, method, eta, tau_plus = CASES[case]
    loss = build_loss(method, positives=positives, queue_size=16, queue_positives=queue_positives, **kwargs).eval()
    queue = filled(loss)
    f = features(seed=5).requires_grad_()
    ours = loss(f, LABELS)
    assert loss.last_path == "general" and len(loss.queue) == 7, "eval mode reads the queue and does not fill it"
    f_ref = f.detach().clone().requires_grad_()
    ref = reference_loss(f_ref, LABELS, method=method, positives=positives, eta=eta, tau_plus=tau_plus, queue=queue,
                         queue_positives=queue_positives)
    assert abs(ours.item() - ref.item()) < 1e-9
    without = reference_loss(f_ref, LABELS, method=method, positives=positives, eta=eta, tau_plus=tau_plus)
    assert abs(ours.item() - without.item()) > 1e-4, "the queue must change the loss for this check to mean anything"
    ours.backward()
    ref.backward()
    torch.testing.assert_close(f.grad, f_ref.grad, atol=1e-10, rtol=1e-8)


def test_explicit_M_with_a_queue_matches_the_reference():
    loss = build_loss("hscl-beta", beta=1.0, M=5.0, queue_size=8).eval()
    queue = filled(loss)
    f = features(seed=2)
    ref = reference_loss(f, LABELS, method="hscl-beta", positives="labels", eta=lambda t: torch.exp(t), M=5.0,
                         queue=queue)
    assert abs(loss(f, LABELS).item() - ref.item()) < 1e-9


def test_training_call_pushes_the_gathered_batch_after_reading_the_queue():
    """The first call meets an empty queue (the fused path), then the batch's normalised rows are
    in it, image-major with their labels; the second call reads them (the general path)."""
    loss = build_loss("hscl-beta", queue_size=30)
    f = features(seed=1)
    first = loss(f, LABELS)
    assert loss.last_path == "fused"
    assert first.item() == pytest.approx(build_loss("hscl-beta")(f, LABELS).item(), abs=1e-12)
    rows, row_labels = loss.queue.rows()
    torch.testing.assert_close(rows, F.normalize(f, dim=-1).flatten(0, 1))
    assert row_labels.tolist() == LABELS.repeat_interleave(2).tolist() and not rows.requires_grad
    second = loss(f, LABELS)
    assert loss.last_path == "general" and len(loss.queue) == 30
    ref = reference_loss(f, LABELS, method="hscl-beta", positives="labels", eta=lambda t: torch.exp(t),
                         queue=(rows, row_labels))
    assert second.item() == pytest.approx(ref.item(), abs=1e-9)


def test_unlabelled_methods_keep_an_unlabelled_queue():
    loss = build_loss("hucl", beta=1.0, queue_size=8)
    loss(features(seed=4))
    rows, row_labels = loss.queue.rows()
    assert row_labels is None and len(loss.queue) == 8
    f = features(seed=9)
    ref = reference_loss(f, None, method="hucl", positives="views", eta=lambda t: torch.exp(t), queue=(rows, None))
    assert loss(f).item() == pytest.approx(ref.item(), abs=1e-9)


def test_queue_is_off_before_its_start_epoch():
    loss = build_loss("scl", queue_size=8, queue_start_epoch=2)
    f = features(seed=6)
    loss.set_epoch(1)
    assert loss(f, LABELS).item() == pytest.approx(build_loss("scl")(f, LABELS).item(), abs=1e-12)
    assert len(loss.queue) == 0 and loss.last_path == "fused"
    loss.set_epoch(2)
    loss(f, LABELS)
    loss(f, LABELS)
    assert len(loss.queue) == 8 and loss.last_path == "general"


@pytest.mark.parametrize("method, kwargs", [
    ("ucl", {}),
    ("hucl", {}),
    ("scl", {"positives": "views"}),
    ("hscl-beta", {"queue_size": None}),
])
def test_queue_positives_need_label_positives(method, kwargs):
    options = {"queue_size": 8, "queue_positives": True, **kwargs}
    with pytest.raises(ValueError, match="queue_positives=True needs a queue .* and positives='labels'"):
        build_loss(method, **options)


def _queue_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        loss = build_loss("hscl-beta", queue_size=64, queue_positives=True)
        start, stop = sum(SIZES[:rank]), sum(SIZES[: rank + 1])
        for seed in (0, 1):
            f, labels = full_batch(seed)
            local = f[start:stop].clone().requires_grad_()
            value = loss(local, labels[start:stop])
            value.backward()
        torch.save({"rows": loss.queue.rows(), "loss": value.detach(), "grad": local.grad},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_processes_share_the_queue_of_global_batches(tmp_path):
    """Each process's queue holds every process's rows (the gathered batch, in rank order), and
    with those rows the loss and gradients are one process's on the concatenated batch."""
    world = 2
    mp.spawn(_queue_worker, args=(world, _free_port(), str(tmp_path)), nprocs=world, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    single = build_loss("hscl-beta", queue_size=64, queue_positives=True)
    for seed in (0, 1):
        f, labels = full_batch(seed)
        whole = f.clone().requires_grad_()
        expected = single(whole, labels)
    expected.backward()
    for r in ranks:
        for ours, theirs in zip(r["rows"], single.queue.rows()):
            torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=0)
    assert sum(r["loss"] for r in ranks).item() / world == pytest.approx(expected.item(), abs=1e-10)
    grads = torch.cat([r["grad"] for r in ranks]) / world
    torch.testing.assert_close(grads, whole.grad, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("unlabelled_negatives", [True, False])
@pytest.mark.parametrize("method", ["scl", "hscl-beta"])
def test_unlabelled_rows_and_anchors_follow_the_batch_rule(method, unlabelled_negatives):
    """Images labelled -1 in the batch and in the queue: unlabelled anchors take every row as a
    negative and none as a positive, unlabelled rows are never positives and are labelled anchors'
    negatives unless unlabelled_negatives=False; as the loop reference says."""
    loss = build_loss(method, queue_size=16, queue_positives=True, unlabelled_negatives=unlabelled_negatives).eval()
    gen = torch.Generator().manual_seed(3)
    rows = F.normalize(torch.randn(6, 4, generator=gen, dtype=torch.float64), dim=-1)
    row_labels = torch.tensor([0, -1, 1, -1, 2, 0])
    loss.queue.push(rows, row_labels)
    labels = torch.tensor([0, 0, 1, -1, 1, 2, -1, 3, 4, 0])
    f = features(seed=8)
    eta = None if method == "scl" else (lambda t: torch.exp(t))
    ref = reference_loss(f, labels, method=method, positives="labels", eta=eta, queue=(rows, row_labels),
                         queue_positives=True, unlabelled_negatives=unlabelled_negatives)
    assert loss(f, labels).item() == pytest.approx(ref.item(), abs=1e-9)
    assert loss.last_path == "general"
