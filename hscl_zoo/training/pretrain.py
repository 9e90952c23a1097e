"""The pretraining loop: train a contrastive encoder with a registered method, then probe and export it.

`recipes/pretrain.py` runs `main` (as will a command-line entry point); `pretrain(argv)` is the
same without the exit-on-error wrapper:

    accelerate launch recipes/pretrain.py                                  # embedded digits, CPU, minutes
    accelerate launch recipes/pretrain.py --config hscl-beta-cifar100
    accelerate launch recipes/pretrain.py --config scl-cifar10 \
        --data_dir data/cifar10 --epochs 5
    accelerate launch recipes/pretrain.py --output_dir runs/x --resume     # continue an interrupted run

Every key of `hscl_zoo.training.config.PretrainConfig` can be set as `--key value` (after the YAML
file). Per epoch: training loss, throughput and timings, kNN top-1 on the test split (every
`monitor_every` epochs), Assumption-1 fraction and the four Lemma-1 losses go to
`<output_dir>/metrics.jsonl` (and to Accelerate trackers with --log_with), and a checkpoint (every
`checkpoint_every` epochs) to `<output_dir>/checkpoints/`. On CUDA a run that cannot fit the
device is refused before it starts (`hscl_zoo.training.resources`). At the end: a linear probe on
frozen features, then a Hub-ready folder `<output_dir>/hub` (weights, config.json, model card, metrics).

The run's parts follow its course: `hscl_zoo.training.setup` (arguments, run folder, data,
encoder, optimizer, views), `hscl_zoo.training.epochs` (the epochs, resume and stop) and
`hscl_zoo.training.finish` (probe and export). This module ties them together, in one
`hscl_zoo.training.state.RunState` that the epochs take.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

from hscl_zoo.training.checkpointing import CheckpointError
from hscl_zoo.training.epochs import train_epoch, train_epochs
from hscl_zoo.training.finish import export_run, image_caches
from hscl_zoo.training.monitoring import KnnMonitor
from hscl_zoo.training.preemption import StopOnSignal, exit_status
from hscl_zoo.training.run_folder import RunFolderError
from hscl_zoo.training.setup import (
    build_optimizer,
    check_image_size,
    claim_run_folder,
    load_training_data,
    make_accelerator,
    parse_args,
    prepare_training,
    resolve_run,
    training_views,
)
from hscl_zoo.training.state import RunState
from hscl_zoo.training.steps import check_chunk_size

__all__ = ["main", "pretrain", "parse_args", "resolve_run", "build_optimizer", "training_views", "train_epoch",
           "export_run"]

LOST_PROCESS_SIGNS = ("gloo/", "pair closure", "closed by peer", "reset by peer", "Timed out waiting")
"""Parts of the errors gloo raises when another process died or stopped answering: its source
path, or the text of those that lack it (a pair closed by this process's own timeout)."""


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    """Run the recipe (``prog``: the name its --help shows); bad settings, data or checkpoints end
    it with `error: ...` and exit status 1, as does losing another process of the run."""
    try:
        return pretrain(sys.argv[1:] if argv is None else argv, prog)
    except (ValueError, CheckpointError, RunFolderError) as error:
        raise SystemExit(f"error: {error}") from error
    except RuntimeError as error:
        if (message := lost_process_message(error)) is None:
            raise
        raise SystemExit(message) from error
    except KeyboardInterrupt:
        print(interrupted_message(sys.argv[1:] if argv is None else argv, prog), file=sys.stderr)
        raise SystemExit(128 + signal.SIGINT) from None


def interrupted_message(argv: list[str], prog: str | None = None) -> str:
    """What a Ctrl-C outside the training loop leaves: a run in output_dir that --resume continues,
    or (interrupted before the run wrote its config) nothing to resume."""
    run_dir = Path(parse_args(argv, prog)[0].output_dir)
    if (run_dir / "config.json").is_file():
        return f"interrupted outside the training loop; --resume continues {run_dir} from its latest checkpoint, if any."
    return (f"interrupted before the run started: {run_dir} holds no run to resume; run the same command again to "
            "start it.")


PHASES = ("arguments", "data", "setup", "epochs", "finish")
"""The phases of a run's process, in order, that ``phase_seconds.json`` times: the config and
the accelerator; loading the dataset; the encoder, optimizer, views (the image cache is decoded
here), kNN monitor and run folder; the epochs (their monitors and checkpoints included); the final
evaluation and the Hub folder."""


def write_phase_seconds(run_dir: Path, clock: dict[str, float]) -> None:
    """``<run_dir>/phase_seconds.json``: the wall seconds of each of `PHASES` in this process (a
    resumed run's covers its last process only), from the times `clock` noted at their ends."""
    ends = [clock["started"], *(clock[name] for name in PHASES)]
    seconds = {name: round(b - a, 3) for name, a, b in zip(PHASES, ends, ends[1:])}
    (run_dir / "phase_seconds.json").write_text(json.dumps(seconds, indent=2) + "\n")


def lost_process_message(error: RuntimeError) -> str | None:
    """The one-line report of a collective operation that failed because another process of the
    run died, or hung longer than ``dist_timeout`` (NCCL raises a DistBackendError, gloo a plain
    RuntimeError recognised by `LOST_PROCESS_SIGNS`); None for any other error."""
    text = " ".join(str(error).split())
    if not isinstance(error, torch.distributed.DistError) and not any(sign in text for sign in LOST_PROCESS_SIGNS):
        return None
    detail = re.sub(r"^\[[^\]]*\]\s*", "", text).split(". ")[0][:200]
    return (f"error: lost contact with another process of this run ({detail}): a machine or process died, or "
            "stalled longer than dist_timeout seconds (the other machines' logs say which). Relaunch every machine "
            "with --resume to continue from the latest checkpoint.")


def pretrain(argv: list[str], prog: str | None = None) -> dict[str, Any]:
    """Parse `argv` (as `recipes/pretrain.py` does), train, probe and export; returns the linear
    evaluation and ``hub_dir`` on the main process ({} elsewhere). Refusals raise SystemExit."""
    clock = {"started": time.perf_counter()}
    cfg, args, overrides = parse_args(argv, prog)
    cfg = resolve_run(cfg, args, overrides)
    run_dir = Path(cfg.output_dir)
    accelerator = make_accelerator(cfg)
    world = accelerator.num_processes
    plan = cfg.device_plan(accelerator.device.type, world)
    if accelerator.device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: pick the fastest convolution once
    if cfg.batch_size % world:
        raise SystemExit(f"error: batch_size {cfg.batch_size} is global and must divide evenly over {world} processes.")
    if cfg.chunk_size is not None:
        check_chunk_size(cfg.chunk_size, cfg.batch_size, cfg.views, world)

    clock["arguments"] = time.perf_counter()
    data, cfg = load_training_data(cfg, accelerator)
    clock["data"] = time.perf_counter()
    if not cfg.streaming and cfg.batch_size > len(data.train):  # a stream checks its own length
        raise SystemExit(
            f"error: batch_size {cfg.batch_size} is larger than the {len(data.train)} training images of "
            f"{cfg.dataset}{f' (subset {cfg.subset})' if cfg.subset else ''}: no full batch exists. "
            f"Pass --batch_size {len(data.train)} or smaller."
        )
    image_size = cfg.image_size or data.spec.image_size
    check_image_size(image_size, cfg)
    parts = prepare_training(cfg, data, image_size, accelerator, plan)
    monitor = KnnMonitor(data, cfg, accelerator.device) if accelerator.is_main_process and data.class_names else None
    run = RunState(cfg, accelerator, parts, plan, run_dir=run_dir, data=data, monitor=monitor, resume=args.resume)

    lock = claim_run_folder(run_dir, args, cfg) if accelerator.is_main_process else None
    try:
        accelerator.wait_for_everyone()
        if cfg.log_with:
            accelerator.init_trackers("hscl_zoo", config=cfg.to_dict())
        clock["setup"] = time.perf_counter()
        with StopOnSignal(on_force_exit=lock.release if lock else None) as run.stop:
            stopped = train_epochs(run)
        if stopped is not None:
            accelerator.end_training()
            raise SystemExit(exit_status(stopped))
        clock["epochs"] = time.perf_counter()
        result: dict[str, Any] = {}
        if accelerator.is_main_process:
            result = export_run(cfg, parts.encoder, data, run_dir, accelerator.device, num_processes=world,
                                config_path=args.config, images=image_caches(data, parts.train_set, monitor))
            clock["finish"] = time.perf_counter()
            write_phase_seconds(run_dir, clock)
        accelerator.wait_for_everyone()
        accelerator.end_training()
        return result
    finally:
        if lock is not None:
            lock.release()
