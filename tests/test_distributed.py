"""Two real gloo processes against one process on the concatenated batch."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hscl_zoo import LOSS_NAMES, build_loss
from hscl_zoo.losses.distributed import gather_with_grad

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


EQUAL = 4  # images per process for the known-sizes path


def _sizes_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Every loss twice on equal per-process batches, sizes gathered and sizes known, with
    torch.distributed.all_gather wrapped to count its calls; then gather_with_grad with given
    unequal sizes and with wrong ones."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    real_all_gather, calls = dist.all_gather, []

    def counting_all_gather(*args, **kwargs):
        calls.append(1)
        return real_all_gather(*args, **kwargs)

    dist.all_gather = counting_all_gather
    try:
        f, labels = full_batch(seed=1)
        mine = slice(rank * EQUAL, (rank + 1) * EQUAL)
        results = {}
        for name in LOSS_NAMES:
            for equal in (False, True):
                loss_fn = build_loss(name)
                loss_fn.equal_batches = equal
                local = f[mine].clone().requires_grad_()
                calls.clear()
                loss = loss_fn(local, labels[mine])
                loss.backward()
                results[name, equal] = (loss.detach(), local.grad, len(calls))
        f, labels = full_batch()
        start = sum(SIZES[:rank])
        local = f[start : start + SIZES[rank]].clone().requires_grad_()
        given = gather_with_grad(local, labels[start : start + SIZES[rank]], sizes=SIZES)
        gathered = gather_with_grad(local, labels[start : start + SIZES[rank]])
        given[0].pow(2).sum().backward()
        results["unequal"] = (given[0].detach(), given[1][0], given[2], gathered[0].detach(), gathered[1][0],
                              gathered[2], local.grad)
        refused = []
        for wrong in ([SIZES[rank]], [SIZES[rank] + 1] * world):
            try:
                gather_with_grad(local, sizes=wrong)
            except ValueError as error:
                refused.append(str(error))
        results["refused"] = refused
        torch.save(results, os.path.join(out_dir, f"sizes{rank}.pt"))
    finally:
        dist.all_gather = real_all_gather
        dist.destroy_process_group()


def test_known_sizes_skip_their_all_gather_and_change_nothing(tmp_path):
    world = 2
    mp.spawn(_sizes_worker, args=(world, _free_port(), str(tmp_path)), nprocs=world, join=True)
    ranks = [torch.load(tmp_path / f"sizes{r}.pt") for r in range(world)]
    for results in ranks:
        for name in LOSS_NAMES:
            (loss, grad, calls), (loss_eq, grad_eq, calls_eq) = results[name, False], results[name, True]
            assert torch.equal(loss, loss_eq) and torch.equal(grad, grad_eq), name
            # features, labels when the loss uses them, and the sizes only when they are not given
            assert calls == calls_eq + 1 and calls_eq == (2 if build_loss(name).needs_labels else 1), name
        given, given_labels, offset, gathered, gathered_labels, gathered_offset, grad = results["unequal"]
        assert torch.equal(given, gathered) and torch.equal(given_labels, gathered_labels) and offset == gathered_offset
        assert given.shape[0] == sum(SIZES)
        assert len(results["refused"]) == 2 and all("sizes=" in message for message in results["refused"])
    # the gathered tensor is the concatenated batch; each process gets the gradient of its rows,
    # summed over the processes (here d/dx of sum over processes of |x|^2 = world * 2x)
    f, labels = full_batch()
    torch.testing.assert_close(ranks[0]["unequal"][0], f)
    assert torch.equal(ranks[1]["unequal"][1], labels)
    torch.testing.assert_close(torch.cat([r["unequal"][6] for r in ranks]), 2 * world * f)
    # the equal-batch losses are still those of the 8-image global batch
    f1, labels1 = full_batch(seed=1)
    for name in LOSS_NAMES:
        expected = build_loss(name)(f1[: world * EQUAL], labels1[: world * EQUAL])
        mean_loss = sum(r[name, True][0] for r in ranks) / world
        assert mean_loss.item() == pytest.approx(expected.item(), abs=1e-10), name
