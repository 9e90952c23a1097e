"""Two real gloo processes against one process on the concatenated batch."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hscl_zoo import LOSS_NAMES, build_loss

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
