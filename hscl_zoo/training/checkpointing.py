"""Per-epoch training checkpoints that an interrupted write can never corrupt.

`Accelerator.save_state` writes into `checkpoints/.partial-epoch_NNNN`; only when every process
has finished is the folder renamed to `checkpoints/epoch_NNNN` (an atomic rename on one file
system) and a `state.json` marker written inside it last. A folder without that marker is not a
checkpoint, so a crash mid-write leaves the previous checkpoint as the latest one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from accelerate import Accelerator

CHECKPOINT_DIR = "checkpoints"
MARKER = "state.json"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be resumed from; the message says which one and what to do."""


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("epoch_") and (p / MARKER).is_file()]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = checkpoint_dirs(run_dir)
    return found[-1] if found else None


def save_checkpoint(accelerator: Accelerator, run_dir: str | Path, epoch: int, state: dict[str, Any], *, keep: int = 2) -> Path:
    """Save model, optimizer and RNG states after `epoch`, then drop all but the newest `keep`."""
    root = Path(run_dir) / CHECKPOINT_DIR
    final = root / f"epoch_{epoch:04d}"
    partial = root / f".partial-epoch_{epoch:04d}"
    if accelerator.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(partial))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        tmp = final / (MARKER + ".tmp")
        tmp.write_text(json.dumps({"epoch": epoch, **state}, indent=2, sort_keys=True))
        os.replace(tmp, final / MARKER)
        for old in checkpoint_dirs(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator: Accelerator, checkpoint: Path) -> dict[str, Any]:
    """Restore a checkpoint written by `save_checkpoint`; return its state.json."""
    try:
        state = json.loads((checkpoint / MARKER).read_text())
        accelerator.load_state(str(checkpoint))
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
