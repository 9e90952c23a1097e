"""Run the pretraining loop and send this process SIGTERM during its N-th optimizer step, so a test
can interrupt a run at an exact step: a real signal, caught by the loop's own handler, at a
known place (a signal from outside lands wherever the run happens to be).

    python tests/stop_at_step.py N [recipe arguments ...]

The signal is sent once, from a hook torch runs after every optimizer step; the run's steps come
before the linear probe's, so N up to the run's step count lands in training.
"""

from __future__ import annotations

import os
import signal
import sys

from torch.optim.optimizer import register_optimizer_step_post_hook

from hscl_zoo.training import main


def stop_after(step: int) -> None:
    """Send SIGTERM to this process right after the `step`-th optimizer step (counted from 1)."""
    count = 0

    def hook(optimizer, args, kwargs) -> None:
        nonlocal count
        count += 1
        if count == step:
            os.kill(os.getpid(), signal.SIGTERM)

    register_optimizer_step_post_hook(hook)


if __name__ == "__main__":
    stop_after(int(sys.argv[1]))
    main(sys.argv[2:])
