"""The labelled memory queue (hscl_zoo.losses.queue) and the loss reading it as extra candidates."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from hscl_zoo import build_loss
from hscl_zoo.losses.queue import MemoryQueue, queue_masks
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


META = torch.device("meta")


class _Devices(torch.overrides.TorchFunctionMode):
    """Record the device of every tensor that a torch call returns."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.seen.add(t.device.type)
        return out


def _message(call):
    with pytest.raises(ValueError) as info:
        call()
    return str(info.value)


@pytest.mark.parametrize("size", [0, -2, True, 2.0, "4"])
def test_a_size_that_is_not_a_positive_integer_is_refused_with_the_fix(size):
    assert _message(lambda: MemoryQueue(size)) == (
        f"queue_size must be a positive integer number of rows, got {size!r}; "
        "leave it unset (0 in the recipe) for no queue.")


@pytest.mark.parametrize("start_epoch", [0, True, 1.5])
def test_a_start_epoch_that_is_not_an_integer_from_one_is_refused(start_epoch):
    assert _message(lambda: MemoryQueue(4, start_epoch=start_epoch)) == (
        f"queue_start_epoch must be an integer >= 1 (the first epoch), got {start_epoch!r}.")


def test_a_queue_of_one_row_keeps_the_newest():
    queue = MemoryQueue(1)
    pushed(queue, 0, 3)
    pushed(queue, 3, 1)
    rows, labels = queue.rows()
    assert labels.tolist() == [3] and rows.tolist() == [[3.0, 3.0, 3.0]]


def test_the_queue_is_read_from_the_first_epoch_by_default():
    queue = MemoryQueue(4)
    assert queue.start_epoch == 1
    queue.set_epoch(1)
    assert queue.active and repr(queue) == "MemoryQueue(size=4, start_epoch=1, rows=0, active=True)"


def test_the_ring_buffer_is_written_from_its_first_row():
    """The saved state is the buffer itself: a fresh queue is at position 0, and the first push fills
    rows 0.. of the buffer, zeros after them."""
    queue = MemoryQueue(4)
    assert queue.state_dict()["position"].tolist() == [0, 0, 4]
    pushed(queue, 7, 2)
    state = queue.state_dict()
    assert state["position"].tolist() == [2, 2, 4] and state["position"].dtype == torch.int64
    assert state["embeddings"][:, 0].tolist() == [7.0, 8.0, 0.0, 0.0] and state["labels"].tolist() == [7, 8, 0, 0]


def test_an_unfilled_queue_saves_empty_tensors_and_loads_back_unfilled():
    state = MemoryQueue(3).state_dict()
    assert state["embeddings"].numel() == 0 and state["labels"].numel() == 0 and state["labels"].dtype == torch.int64
    assert not bool(state["labelled"])
    queue = MemoryQueue(3)
    pushed(queue, 0, 2)
    queue.load_state_dict(state)
    assert queue.embeddings is None and queue.labels is None and len(queue) == 0
    assert queue.rows()[0].shape == (0, 0) and queue.rows()[1] is None
    queue.push(torch.ones(2, 5), None)
    assert queue.rows()[0].shape == (2, 5)


def test_a_queue_that_met_only_an_empty_push_keeps_its_width_through_a_round_trip():
    first = MemoryQueue(4)
    first.push(torch.zeros(0, 3, dtype=torch.float64), torch.zeros(0, dtype=torch.int64))
    queue = MemoryQueue(4)
    queue.load_state_dict(first.state_dict())
    rows, labels = queue.rows()
    assert rows.shape == (0, 3) and rows.dtype == torch.float64 and labels.shape == (0,)
    with pytest.raises(ValueError, match="one queue serves one projection width"):
        queue.push(torch.zeros(1, 5, dtype=torch.float64), torch.zeros(1, dtype=torch.int64))


def test_an_unlabelled_queue_loads_back_unlabelled():
    first = MemoryQueue(4)
    first.push(torch.arange(6.0).reshape(3, 2), None)
    queue = MemoryQueue(4)
    queue.load_state_dict(first.state_dict())
    rows, labels = queue.rows()
    assert labels is None and queue.labels is None and rows.tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    queue.push(torch.ones(1, 2), None)
    assert len(queue) == 4


def test_load_state_dict_puts_the_rows_on_the_given_device():
    first = MemoryQueue(4)
    pushed(first, 0, 3)
    queue = MemoryQueue(4)
    queue.load_state_dict(first.state_dict(), device=META)
    assert queue.embeddings.device == META and queue.labels.device == META
    queue.load_state_dict(first.state_dict())
    assert queue.embeddings.device.type == "cpu" and queue.labels.tolist() == [0, 1, 2, 0]


def test_labels_are_kept_as_int64_whatever_their_dtype():
    queue = MemoryQueue(3)
    queue.push(torch.zeros(2, 2), torch.tensor([4, 5], dtype=torch.int32))
    queue.push(torch.ones(2, 2), torch.tensor([6, 7], dtype=torch.int16))
    labels = queue.rows()[1]
    assert labels.dtype == torch.int64 and labels.tolist() == [5, 6, 7]


def test_later_pushes_are_cast_to_the_first_push_dtype():
    queue = MemoryQueue(3)
    queue.push(torch.zeros(1, 2, dtype=torch.float32), None)
    queue.push(torch.full((2, 2), 0.1, dtype=torch.float64), None)
    rows = queue.rows()[0]
    assert rows.dtype == torch.float32 and torch.equal(rows[1:], torch.full((2, 2), 0.1, dtype=torch.float32))


@pytest.mark.parametrize("embeddings, labels, shapes", [
    (torch.zeros(3), None, "(3,) and None"),
    (torch.zeros(2, 3), torch.tensor([0]), "(2, 3) and (1,)"),
    (torch.zeros(2, 3, 1), torch.tensor([0, 1]), "(2, 3, 1) and (2,)"),
])
def test_a_push_of_the_wrong_shape_is_refused_naming_both_shapes(embeddings, labels, shapes):
    assert _message(lambda: MemoryQueue(4).push(embeddings, labels)) == (
        f"queue rows must be (n, d) embeddings with (n,) labels, got {shapes}.")


def test_inconsistent_pushes_are_refused_with_the_fix():
    labelled, unlabelled = MemoryQueue(4), MemoryQueue(4)
    labelled.push(torch.randn(2, 3), torch.tensor([0, 1]))
    unlabelled.push(torch.randn(2, 3), None)
    assert _message(lambda: labelled.push(torch.randn(2, 5), torch.tensor([0, 1]))) == (
        "queue rows have 3 dimensions, these have 5: one queue serves one projection width.")
    mixing = ("a labelled queue needs labels with every push, and an unlabelled one takes none: "
              "use one queue per method.")
    assert _message(lambda: labelled.push(torch.randn(2, 3), None)) == mixing
    assert _message(lambda: unlabelled.push(torch.randn(2, 3), torch.tensor([0, 1]))) == mixing


def test_a_queue_on_a_device_does_its_work_there():
    """Pushing and reading a queue whose rows live on a device make no CPU tensors (no host round trip)."""
    queue = MemoryQueue(4)
    embeddings, labels = torch.zeros(3, 2, device=META), torch.zeros(3, dtype=torch.int64, device=META)
    with _Devices() as mode:
        queue.push(embeddings, labels)
        queue.push(embeddings[:2], labels[:2])
        rows, row_labels = queue.rows()
    assert mode.seen == {"meta"}
    assert rows.shape == (4, 2) and rows.device == META and row_labels.device == META


def _masks_by_rule(anchor_labels, row_labels, label_negatives, label_positives, unlabelled_negatives):
    """docs/losses.md's rule, pair by pair."""
    negative = torch.zeros(len(anchor_labels), len(row_labels), dtype=torch.bool)
    positive = torch.zeros_like(negative)
    for i, a in enumerate(anchor_labels.tolist()):
        for j, r in enumerate(row_labels.tolist()):
            if a == -1:
                negative[i, j] = True
                continue
            if r == -1:
                negative[i, j] = unlabelled_negatives
                continue
            negative[i, j] = a != r if label_negatives else True
            positive[i, j] = label_positives and a == r
    return negative, positive


@pytest.mark.parametrize("unlabelled_negatives", [True, False])
@pytest.mark.parametrize("label_positives", [True, False])
@pytest.mark.parametrize("label_negatives", [True, False])
def test_queue_masks_follow_the_batch_rule_pair_by_pair(label_negatives, label_positives, unlabelled_negatives):
    anchors = torch.tensor([0, 1, -1, 2, 0])
    rows = torch.tensor([0, -1, 2, 3, 1, 0])
    negative, positive = queue_masks(anchors, rows, n_anchors=5, n_rows=6, label_negatives=label_negatives,
                                     label_positives=label_positives, device=torch.device("cpu"),
                                     unlabelled_negatives=unlabelled_negatives)
    expected = _masks_by_rule(anchors, rows, label_negatives, label_positives, unlabelled_negatives)
    assert torch.equal(negative, expected[0]) and torch.equal(positive, expected[1])


def test_unlabelled_rows_are_negatives_by_default():
    negative, positive = queue_masks(torch.tensor([0, 1]), torch.tensor([-1, 1]), n_anchors=2, n_rows=2,
                                     label_negatives=True, label_positives=True, device=torch.device("cpu"))
    assert negative.tolist() == [[True, True], [True, False]] and positive.tolist() == [[False, False], [False, True]]


def test_queue_masks_without_labels_make_every_row_a_negative_on_the_given_device():
    for anchors, rows in [(None, None), (torch.tensor([0, 1]), None), (None, torch.tensor([0, 1, 2]))]:
        negative, positive = queue_masks(anchors, rows, n_anchors=2, n_rows=3, label_negatives=False,
                                         label_positives=False, device=META)
        assert negative.shape == positive.shape == (2, 3) and negative.device == positive.device == META
        assert negative.dtype == positive.dtype == torch.bool
    negative, positive = queue_masks(None, None, n_anchors=2, n_rows=3, label_negatives=False, label_positives=False,
                                     device=torch.device("cpu"))
    assert negative.all() and not positive.any()


def test_queue_masks_move_the_row_labels_to_the_anchors_device():
    anchors = torch.tensor([0, 1], device=META)
    negative, positive = queue_masks(anchors, torch.tensor([0, -1, 1]), n_anchors=2, n_rows=3, label_negatives=True,
                                     label_positives=True, device=META)
    assert negative.device == positive.device == META and negative.shape == (2, 3)


@pytest.mark.parametrize("anchors, rows", [
    (None, None), (torch.tensor([0, 1]), None), (None, torch.tensor([0, 1, 2]))])
@pytest.mark.parametrize("label_negatives, label_positives", [(True, False), (False, True), (True, True)])
def test_queue_masks_that_compare_labels_need_both_labels(anchors, rows, label_negatives, label_positives):
    assert _message(lambda: queue_masks(anchors, rows, n_anchors=2, n_rows=3, label_negatives=label_negatives,
                                        label_positives=label_positives, device=torch.device("cpu"))) == (
        "this loss compares labels with the queue's rows but the queue holds none: "
        "fill it through a loss that gathers labels (pass labels).")
