"""Several torch.distributed ranks in this process, one thread each, on torch's threaded process group.

The collectives (all_gather, all_reduce) are torch's own, run between threads instead of processes.
Tests built on it are fast (no process start, no package import per rank) and visible to mutation
testing, whose mutants live in this process only; the tests that spawn real gloo processes stay as
the check of the real backend. It uses `torch.testing._internal`, the harness torch's own
distributed tests run on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.multi_threaded_pg import (
    ProcessLocalGroup,
    _install_threaded_pg,
    _uninstall_threaded_pg,
)


def run_ranks(world: int, fn: Callable[[int], Any], timeout: float = 120.0) -> list[Any]:
    """Run ``fn(rank)`` on ``world`` threads, each a rank of one threaded process group; return the
    results in rank order, or raise the first rank's exception."""
    results: list[Any] = [None] * world
    errors: list[tuple[int, BaseException]] = []
    store = dist.HashStore()

    def worker(rank: int) -> None:
        dist.init_process_group("threaded", rank=rank, world_size=world, store=store)
        try:
            results[rank] = fn(rank)
        except BaseException as error:  # re-raised in the caller's thread
            errors.append((rank, error))
            ProcessLocalGroup.exception_handle(error)  # ends the other ranks' waits on a collective
        finally:
            dist.destroy_process_group()

    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    ProcessLocalGroup.reset()
    _install_threaded_pg()
    try:
        threads = [threading.Thread(target=worker, args=(rank,), daemon=True) for rank in range(world)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout)
        if any(thread.is_alive() for thread in threads):
            raise TimeoutError(f"a rank did not finish within {timeout} s (a collective called on some ranks only?)")
    finally:
        _uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
    if errors:
        # The first failure; the ranks it stopped inside a collective exit with SystemExit.
        rank, error = next(((r, e) for r, e in errors if not isinstance(e, SystemExit)), errors[0])
        raise RuntimeError(f"rank {rank} failed: {error!r}") from error
    return results
