"""Stopping a run on a signal without losing the epoch in progress.

A cluster preempts a job with SIGTERM (SLURM: also SIGUSR1 ahead of time with
``--signal=USR1@90``), a user with Ctrl-C (SIGINT). `StopOnSignal` turns the first of these into
a request the loop reads after each step: it finishes that step, writes a checkpoint recording
the step within the epoch (at an epoch's last step it ends the epoch first and checkpoints it
whole), prints how to resume, and exits 0 (SIGTERM, SIGUSR1: the job did what
was asked) or 130 (SIGINT, as a shell reports Ctrl-C). A second signal ends the process at once.
With several processes the request is agreed on with one all-reduce per step, so every process
stops after the same step (a signal may reach only some of them).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

import torch
from accelerate import Accelerator

__all__ = ["STOP_SIGNALS", "StopOnSignal", "exit_status"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def exit_status(signum: int) -> int:
    """The status a run stopped by `signum` exits with: 130 for Ctrl-C, 0 for a scheduler's request."""
    return 128 + signal.SIGINT if signum == signal.SIGINT else 0


class StopOnSignal:
    """Catch `STOP_SIGNALS` while active (a context manager); `requested(accelerator)` says, the
    same on every process, whether any process got one. `on_force_exit` runs before a second
    signal ends the process (releases the run's lock)."""

    def __init__(self, on_force_exit: Callable[[], None] | None = None) -> None:
        self.signum: int | None = None
        self.on_force_exit = on_force_exit
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            print(f"\n{signal.Signals(signum).name} again: stopping now, without a checkpoint.", file=sys.stderr,
                  flush=True)
            if self.on_force_exit is not None:
                self.on_force_exit()
            os._exit(128 + signum)
        self.signum = signum
        print(f"\n{signal.Signals(signum).name}: finishing this step, then writing a checkpoint "
              "(send it again to stop at once).", file=sys.stderr, flush=True)

    def __enter__(self) -> StopOnSignal:
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def requested(self, accelerator: Accelerator) -> int | None:
        """The signal to stop for (the largest number any process got), or None."""
        if accelerator.num_processes == 1:
            return self.signum
        flag = torch.tensor([self.signum or 0], device=accelerator.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return int(flag.item()) or None
