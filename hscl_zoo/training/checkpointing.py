"""Per-epoch training checkpoints that an interrupted write can never corrupt.

`Accelerator.save_state` writes into `checkpoints/.partial-epoch_NNNN`; only when every process
has finished is the folder renamed to `checkpoints/epoch_NNNN` (an atomic rename on one file
system) and a `state.json` marker written inside it last. A folder without that marker is not a
checkpoint, so a crash mid-write leaves the previous checkpoint as the latest one.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, Protocol

from accelerate import Accelerator
from accelerate.utils.other import load as accelerate_load
import torch
from safetensors.torch import load_file, save_file

from hscl_zoo.losses.queue import MemoryQueue

CHECKPOINT_DIR = "checkpoints"
MARKER = "state.json"
QUEUE_FILE = "queue.safetensors"
GENERATOR_FILE = "augment_generator_{}.safetensors"
STREAM_FILE = "stream_position_{}.json"
"""Each process's place in a streamed training split (`hscl_zoo.data.streaming.StreamLoader`)."""


class StreamPosition(Protocol):
    """What a checkpoint keeps of a stream: its position, as JSON."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
NAME = re.compile(r"epoch_(\d+)(?:_step_(\d+))?")
RNG_KEYS = ("random_state", "numpy_random_seed", "torch_manual_seed")
MB = 2**20


class CheckpointError(RuntimeError):
    """A checkpoint cannot be resumed from; the message says which one and what to do."""


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and NAME.fullmatch(p.name) and (p / MARKER).is_file()]
    return sorted(found, key=position)


def position(checkpoint: Path) -> tuple[int, int]:
    """(epochs done, steps of the next epoch done) of a checkpoint, from its name."""
    epoch, step = NAME.fullmatch(checkpoint.name).groups()
    return int(epoch), int(step or 0)


def checkpoint_name(epoch: int, step: int = 0) -> str:
    return f"epoch_{epoch:04d}" + (f"_step_{step:06d}" if step else "")


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


class NoSpaceError(CheckpointError):
    """A checkpoint did not fit on its file system."""


def _no_space(root: Path, needed: int) -> NoSpaceError:
    free = shutil.disk_usage(root).free
    return NoSpaceError(f"no space left on device at {root}: {needed / MB:.0f} MB needed, {free / MB:.0f} MB free. "
                        "The earlier checkpoints are kept; free some space and continue with --resume.")


def _out_of_space(error: BaseException | None, root: Path) -> bool:
    """Whether `error` (or what caused it) is a full disk. torch's zip writer reports one as a
    RuntimeError ("unexpected pos ...", "file write failed"), so a failure that left less than
    a megabyte free counts too."""
    if shutil.disk_usage(root).free < MB:
        return True
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(sign in str(error) for sign in ("No space left on device", "file write failed", "unexpected pos")):
            return True
        error = error.__cause__ or error.__context__
    return False


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = checkpoint_dirs(run_dir)
    return found[-1] if found else None


def save_checkpoint(
    accelerator: Accelerator,
    run_dir: str | Path,
    epoch: int,
    state: dict[str, Any],
    *,
    step: int = 0,
    keep: int = 2,
    queue: MemoryQueue | None = None,
    generator: torch.Generator | None = None,
    stream: StreamPosition | None = None,
) -> Path:
    """Save model, optimizer and RNG states (and the loss's `queue`, and this process's batched
    augmentation `generator` and stream position, if any) after `epoch` epochs and `step` steps of the next, then drop all but the newest `keep`. Raises NoSpaceError, with
    nothing of this checkpoint left behind, when it does not fit."""
    root = Path(run_dir) / CHECKPOINT_DIR
    name = checkpoint_name(epoch, step)
    final = root / name
    partial = root / f".partial-{name}"
    failed = torch.zeros(1, device=accelerator.device)
    if accelerator.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        previous = latest_checkpoint(run_dir)
        needed = folder_bytes(previous) if previous is not None else 0
        if needed > shutil.disk_usage(root).free:
            failed += 1
    if accelerator.reduce(failed, reduction="sum").item():
        if accelerator.is_main_process:
            partial.rmdir()
            raise _no_space(root, needed)
        raise NoSpaceError(f"no space left on device at {root} (the main process reports how much).")
    try:
        accelerator.save_state(str(partial))
        if queue is not None and accelerator.is_main_process:
            save_file(queue.state_dict(), str(partial / QUEUE_FILE))
        if generator is not None:
            save_file({"state": generator.get_state()}, str(partial / GENERATOR_FILE.format(accelerator.process_index)))
        if stream is not None:
            (partial / STREAM_FILE.format(accelerator.process_index)).write_text(json.dumps(stream.state_dict()))
    except Exception as error:
        if not _out_of_space(error, root):
            raise
        failed += 1
    written = folder_bytes(partial) if accelerator.is_main_process and partial.is_dir() else 0
    if accelerator.reduce(failed, reduction="sum").item():
        if accelerator.is_main_process:
            shutil.rmtree(partial, ignore_errors=True)
            raise _no_space(root, max(written, needed) + MB) from None
        raise NoSpaceError(f"no space left on device at {root} (the main process reports how much).")
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        tmp = final / (MARKER + ".tmp")
        tmp.write_text(json.dumps({"epoch": epoch, "step": step, **state}, indent=2, sort_keys=True))
        os.replace(tmp, final / MARKER)
        for old in checkpoint_dirs(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def check_rng_file(accelerator: Accelerator, checkpoint: Path) -> None:
    """Warn when this process's RNG file does not load: Accelerate then skips restoring the RNG
    states with only a log line at INFO level, and the resumed run draws other random numbers
    than the uninterrupted one would have."""
    path = checkpoint / f"random_states_{accelerator.process_index}.pkl"
    try:
        states = accelerate_load(path)
        missing = [k for k in RNG_KEYS if k not in states]
        problem = f"it lacks {', '.join(missing)}" if missing else None
    except Exception as error:  # noqa: BLE001 - any failure means Accelerate will skip it
        problem = f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"
    if problem:
        warnings.warn(f"{path} cannot be read ({problem}): resuming without restoring the random number "
                      "generators, so the rest of the run will not repeat the uninterrupted one.", stacklevel=2)


def load_checkpoint(accelerator: Accelerator, checkpoint: Path, *, queue: MemoryQueue | None = None,
                    generator: torch.Generator | None = None, stream: StreamPosition | None = None) -> dict[str, Any]:
    """Restore a checkpoint written by `save_checkpoint` (into `queue` too, which must then have
    been saved with it, and into `generator` and `stream` when it was saved with them); return its
    state.json."""
    try:
        state = json.loads((checkpoint / MARKER).read_text())
        check_rng_file(accelerator, checkpoint)
        accelerator.load_state(str(checkpoint))
        if queue is not None:
            queue.load_state_dict(load_file(str(checkpoint / QUEUE_FILE)), device=accelerator.device)
        saved_generator = checkpoint / GENERATOR_FILE.format(accelerator.process_index)
        if generator is not None and saved_generator.is_file():
            generator.set_state(load_file(str(saved_generator))["state"])
        saved_stream = checkpoint / STREAM_FILE.format(accelerator.process_index)
        if stream is not None:
            stream.load_state_dict(json.loads(saved_stream.read_text()))
    except Exception as error:  # noqa: BLE001 - any failure here means the files are unusable
        others = [p.name for p in checkpoint_dirs(checkpoint.parent.parent) if p != checkpoint]
        fallback = (
            f" An older checkpoint exists ({', '.join(others)}): move {checkpoint.name} out of {checkpoint.parent} and resume again."
            if others
            else " Start again with --overwrite (this deletes the run) or choose another output_dir."
        )
        raise CheckpointError(
            f"cannot resume from {checkpoint}: {type(error).__name__}: {error}. The checkpoint was left as it is.{fallback}"
        ) from error
    return state
