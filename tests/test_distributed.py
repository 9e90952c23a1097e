"""The losses under torch.distributed against one process on the concatenated batch.

Ranks run as threads of this process on torch's threaded process group (tests/threaded_ranks.py):
fast, and seen by mutation testing. One test spawns two real gloo processes, the real backend.
"""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hscl_zoo import LOSS_NAMES, build_loss
from hscl_zoo.losses.distributed import _gather_sizes, _GatherWithGrad, gather_with_grad, is_distributed, world_size

from threaded_ranks import run_ranks

SIZES = (3, 5)  # unequal per-process batches exercise the padded gather


def full_batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    f = torch.randn(sum(SIZES), 2, 6, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 3, (sum(SIZES),), generator=gen)
    return f, labels


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        f, labels = full_batch()
        start = sum(SIZES[:rank])
        results = {}
        for name in LOSS_NAMES:
            local = f[start : start + SIZES[rank]].clone().requires_grad_()
            loss = build_loss(name)(local, labels[start : start + SIZES[rank]])
            loss.backward()
            results[name] = (loss.detach(), local.grad)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes importing the package
@pytest.mark.parametrize("world", [2])
def test_two_processes_equal_one_process_on_concatenated_batch(tmp_path, world):
    mp.spawn(_worker, args=(world, _free_port(), str(tmp_path)), nprocs=world, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    f, labels = full_batch()
    for name in LOSS_NAMES:
        whole = f.clone().requires_grad_()
        expected = build_loss(name)(whole, labels)
        expected.backward()
        mean_loss = sum(r[name][0] for r in ranks) / world
        assert mean_loss.item() == pytest.approx(expected.item(), abs=1e-10), name
        # DDP averages gradients over processes: grad / world is the global batch's gradient.
        grads = torch.cat([r[name][1] for r in ranks]) / world
        torch.testing.assert_close(grads, whole.grad, atol=1e-10, rtol=1e-8, msg=name)


def _local_batch(f, labels, sizes, rank):
    start = sum(sizes[:rank])
    return f[start : start + sizes[rank]].clone().requires_grad_(), labels[start : start + sizes[rank]]


def _assert_ranks_equal_one_process(per_rank, f, labels, name, world):
    whole = f.clone().requires_grad_()
    expected = build_loss(name)(whole, labels)
    expected.backward()
    mean_loss = sum(loss for loss, _ in per_rank) / world
    assert mean_loss.item() == pytest.approx(expected.item(), abs=1e-10), name
    # DDP averages gradients over processes: grad / world is the global batch's gradient.
    torch.testing.assert_close(torch.cat([grad for _, grad in per_rank]) / world, whole.grad, atol=1e-10, rtol=1e-8, msg=name)


@pytest.mark.parametrize("sizes", [(3, 5), (4, 2, 3)], ids=["two-ranks", "three-ranks"])
def test_ranks_equal_one_process_on_concatenated_batch(sizes):
    f, labels = full_batch()
    f, labels = f[: sum(sizes)], labels[: sum(sizes)]

    def rank_losses(rank):
        out = {}
        for name in LOSS_NAMES:
            local, local_labels = _local_batch(f, labels, sizes, rank)
            loss = build_loss(name)(local, local_labels)
            loss.backward()
            out[name] = (loss.detach(), local.grad)
        return out

    ranks = run_ranks(len(sizes), rank_losses)
    for name in LOSS_NAMES:
        _assert_ranks_equal_one_process([r[name] for r in ranks], f, labels, name, len(sizes))


EQUAL = 4  # images per process for the known-sizes path


def test_known_sizes_skip_their_all_gather_and_change_nothing(monkeypatch):
    """Every loss on equal per-process batches, sizes gathered and sizes known (`equal_batches`), with
    torch.distributed.all_gather wrapped to count each rank's calls."""
    world, real_all_gather, calls = 2, dist.all_gather, {}

    def counting_all_gather(*args, **kwargs):
        calls[dist.get_rank()] = calls.get(dist.get_rank(), 0) + 1
        return real_all_gather(*args, **kwargs)

    monkeypatch.setattr(dist, "all_gather", counting_all_gather)
    f, labels = full_batch(seed=1)

    def rank_losses(rank):
        out = {}
        for name in LOSS_NAMES:
            for equal in (False, True):
                loss_fn = build_loss(name)
                loss_fn.equal_batches = equal
                local, local_labels = _local_batch(f, labels, (EQUAL,) * world, rank)
                calls[rank] = 0
                loss = loss_fn(local, local_labels)
                loss.backward()
                out[name, equal] = (loss.detach(), local.grad, calls[rank])
        return out

    ranks = run_ranks(world, rank_losses)
    for name in LOSS_NAMES:
        for results in ranks:
            (loss, grad, n_calls), (loss_eq, grad_eq, n_calls_eq) = results[name, False], results[name, True]
            assert torch.equal(loss, loss_eq) and torch.equal(grad, grad_eq), name
            # features, labels when the loss uses them, and the sizes only when they are not given
            assert n_calls == n_calls_eq + 1 and n_calls_eq == (2 if build_loss(name).needs_labels else 1), name
        # the equal-batch losses are still those of the 8-image global batch
        _assert_ranks_equal_one_process([r[name, True][:2] for r in ranks], f[: world * EQUAL], labels[: world * EQUAL],
                                        name, world)


@pytest.mark.parametrize("known", [False, True], ids=["sizes-gathered", "sizes-given"])
def test_gather_with_grad_concatenates_in_rank_order_and_returns_each_rank_its_rows_gradient(known):
    """Unequal batches, one of them empty and one not contiguous: the global tensor is the concatenation
    in rank order, companions are gathered (None stays None), and each rank's gradient is that of its
    rows, summed over the ranks."""
    sizes = (3, 0, 5)
    x = torch.randn(sum(sizes), 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    labels = torch.arange(sum(sizes)) * 10
    weights = torch.randn(sum(sizes), 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def gather(rank):
        start = sum(sizes[:rank])
        # rank 2 holds its rows as the transpose of a (4, 5) tensor: a view that is not contiguous
        local = (x[start : start + sizes[rank]].t().clone().t() if rank == 2 else x[start : start + sizes[rank]].clone())
        local.requires_grad_()
        gathered, (got_labels, nothing), offset = gather_with_grad(
            local, labels[start : start + sizes[rank]], None, sizes=list(sizes) if known else None)
        (gathered * weights * (rank + 1)).sum().backward()
        return gathered.detach(), got_labels, nothing, offset, local.grad, world_size()

    ranks = run_ranks(len(sizes), gather)
    for rank, (gathered, got_labels, nothing, offset, grad, world) in enumerate(ranks):
        assert torch.equal(gathered, x) and torch.equal(got_labels, labels) and nothing is None
        assert offset == sum(sizes[:rank]) and world == len(sizes)
        rows = slice(offset, offset + sizes[rank])
        torch.testing.assert_close(grad, weights[rows] * sum(r + 1 for r in range(len(sizes))), rtol=1e-12, atol=0)


def test_sizes_are_gathered_on_the_tensors_device_whatever_torchs_default_device():
    """The batch sizes are gathered on the device of the tensor being gathered, not on torch's default
    device: a default set elsewhere (torch.set_default_device("cuda") next to gloo's CPU tensors, or the
    CPU default next to NCCL's GPU tensors) must not move them. Here the default is "meta", whose tensors
    hold no value: the sizes, the concatenation in rank order and each rank's gradient stay right."""
    sizes = (3, 5)
    x = torch.randn(sum(sizes), 2, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    weights = torch.randn(sum(sizes), 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5))

    def gather(rank):
        start = sum(sizes[:rank])
        local = x[start : start + sizes[rank]].clone().requires_grad_()
        with torch.device("meta"):
            gathered_sizes = _gather_sizes(sizes[rank], local.device)
            gathered, _, offset = gather_with_grad(local)
            (gathered * weights).sum().backward()
        return gathered_sizes, gathered.detach(), offset, local.grad

    for rank, (gathered_sizes, gathered, offset, grad) in enumerate(run_ranks(len(sizes), gather)):
        assert gathered_sizes == list(sizes) and offset == sum(sizes[:rank])
        assert gathered.device.type == "cpu" and torch.equal(gathered, x)
        torch.testing.assert_close(grad, 2 * weights[offset : offset + sizes[rank]], rtol=0, atol=0)


def test_gather_backward_sends_back_this_ranks_rows_of_a_non_contiguous_gradient():
    """The backward of the gathering, in a one-process gloo group in this thread (no rank thread that could
    wait for another): the gradient reaching the gathered tensor, here the transpose of a contiguous one,
    is all-reduced and this process gets its rows, the hand value w.t() (a sum over one process)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x = torch.arange(6.0, dtype=torch.float64).view(3, 2).requires_grad_()
        gathered = _GatherWithGrad.apply(x, [3])
        w = torch.tensor([[1.0, -2.0, 3.0], [0.5, 4.0, -1.5]], dtype=torch.float64)
        (gathered.t() * w).sum().backward()
    finally:
        dist.destroy_process_group()
    assert torch.equal(gathered.detach(), torch.arange(6.0, dtype=torch.float64).view(3, 2))
    assert torch.equal(x.grad, w.t())


def test_gather_without_gradient_and_outside_torch_distributed():
    x = torch.arange(12.0).view(6, 2)
    ranks = run_ranks(2, lambda rank: gather_with_grad(x[3 * rank : 3 * rank + 3])[0])
    assert all(torch.equal(gathered, x) and not gathered.requires_grad for gathered in ranks)
    labels = torch.arange(6)
    assert gather_with_grad(x, labels, None) == (x, (labels, None), 0)  # one process: as is
    assert world_size() == 1 and not is_distributed()


def test_wrong_sizes_are_refused_before_any_collective():
    """Each rank checks the sizes it is given against its own batch and the world: a wrong number of
    entries, a wrong own entry, a negative entry."""
    def refusals(rank):
        mine = torch.zeros(3 + rank, 2)
        messages = []
        for wrong in ([3 + rank], [3, 4, 5], [4, 3] if rank == 0 else [3, 5], [3, -1] if rank == 0 else [-1, 4]):
            with pytest.raises(ValueError) as error:
                gather_with_grad(mine, sizes=wrong)
            messages.append(str(error.value))
        return messages

    ranks = run_ranks(2, refusals)
    assert ranks[0][0] == ("gather_with_grad: sizes=[3] must give the batch size of each of the 2 processes in rank "
                           "order; this process (rank 0) has 3. Pass sizes=None to gather them.")
    assert ranks[1][2] == ("gather_with_grad: sizes=[3, 5] must give the batch size of each of the 2 processes in rank "
                           "order; this process (rank 1) has 4. Pass sizes=None to gather them.")
    assert all(len(messages) == 4 for messages in ranks)
    assert "sizes=[3, -1]" in ranks[0][3] and "sizes=[-1, 4]" in ranks[1][3]
    # sizes given as tensors are read as integers
    given = run_ranks(2, lambda rank: gather_with_grad(torch.ones(2 + rank, 1), sizes=torch.tensor([2, 3]))[2])
    assert given == [0, 2]


def test_one_rank_is_not_distributed():
    """A process group of one process gathers nothing: the losses take their one-process path."""
    assert run_ranks(1, lambda rank: (is_distributed(), world_size())) == [(False, 1)]
