"""The epochs of a pretraining run: `train_step` is one optimisation step, `train_epoch` one pass
over an epoch's batches (the steps, the loss, the diagnostics, a stop on a signal), `train_epochs`
the run's remaining epochs around it (resume from a checkpoint, the kNN monitor, metrics.jsonl,
checkpoints, and the stop's checkpoint). Each takes the run's state (`hscl_zoo.training.state`).
"""

from __future__ import annotations

import json
import math
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from hscl_zoo.data.overlap import OverlappedViews
from hscl_zoo.data.resident import ResidentBatches
from hscl_zoo.data.streaming import StreamLoader
from hscl_zoo.training.checkpointing import latest_checkpoint, load_checkpoint, save_checkpoint
from hscl_zoo.training.monitoring import collapse_warning, diagnostics_meter, reduce_diagnostics, rewrite_metrics_upto
from hscl_zoo.training.state import EpochStart, RunState
from hscl_zoo.training.steps import gradient_cache_step

__all__ = ["LOSS_REFRESH_SECONDS", "LossReadout", "NonFiniteLoss", "begin_epoch", "due", "epoch_line", "train_epoch",
           "train_epochs", "train_step"]

LOSS_REFRESH_SECONDS = 0.5
"""On CUDA, the least time between two progress-bar loss readouts; on the CPU the bar shows every
step's loss, which costs nothing to read."""


class NonFiniteLoss(ValueError):
    """The training loss became NaN or inf (the loss itself does not stop a step for it: see
    `ContrastiveLoss.check_finite`)."""


class LossReadout:
    """A step's loss for the progress bar without waiting for the device: on CUDA the value is
    copied to pinned host memory behind the step, and shown once the copy has landed (a step or
    more later); on other devices it is read at once."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._host = torch.empty((), pin_memory=True) if self.cuda else None
        self._ready: torch.cuda.Event | None = None
        self._shown_at = -LOSS_REFRESH_SECONDS

    def update(self, loss: torch.Tensor) -> float | None:
        """Queue this step's loss; return a loss to show now (None: nothing new to show)."""
        if not self.cuda:
            return loss.item()
        if self._ready is not None:
            if not self._ready.query():
                return None
            self._ready = None
            return float(self._host)
        if time.perf_counter() - self._shown_at >= LOSS_REFRESH_SECONDS:
            self._host.copy_(loss.detach(), non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()
            self._shown_at = time.perf_counter()
        return None


def check_finite_loss(loss: float, epoch: int, steps: int) -> None:
    """Raise NonFiniteLoss, naming where, when a training loss (an epoch's mean, or the sum of the
    steps before a stop) is NaN or inf."""
    if not math.isfinite(loss):
        raise NonFiniteLoss(f"the training loss became {loss} in epoch {epoch} (within its first {steps} steps): the "
                            "features contain NaN or inf. Lower lr, train in float32 (--mixed_precision no), or resume "
                            "from the last checkpoint, which holds the weights before this epoch.")


def epoch_line(record: dict[str, Any], epochs: int, *, verbose: bool = False) -> str:
    """The console's line for a finished epoch: its loss, views/s and kNN top-1 when monitored
    (``verbose``: every metric, as ``metrics.jsonl`` holds them)."""
    if verbose:
        return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items())
    parts = [f"epoch {record['epoch']}/{epochs}", f"loss {record['train_loss']:.4f}",
             f"{record['views_per_second']:,.0f} views/s"]
    if "knn_top1" in record:
        parts.append(f"kNN top-1 {record['knn_top1']:.2f} %")
    return "  ".join(parts)


def train_epochs(run: RunState) -> int | None:
    """The epochs still to train (after the latest checkpoint with ``run.resume``, from within an
    epoch when a signal stopped it there), each logged to metrics.jsonl and checkpointed when due.
    Returns the signal that stopped training (after a checkpoint and the resume instructions),
    or None when every epoch ran.

    A signal stops the run after the step it arrived in, unless that step is its epoch's last
    (or the signal came between steps): then the epoch ends as usual, with its record, and is
    checkpointed whether due or not. So a checkpoint within an epoch always has a step left to
    resume with; it also carries the epoch's pooled diagnostics sums, which the resumed pass
    continues from, so the epoch's record covers all its steps."""
    cfg, accelerator, parts, run_dir = run.cfg, run.accelerator, run.parts, run.run_dir
    start_epoch, start = 1, EpochStart()
    metrics_path = run_dir / "metrics.jsonl"
    generator = parts.augment.generator if parts.augment is not None else None
    stream = parts.loader if isinstance(parts.loader, StreamLoader) else None
    if run.resume and (checkpoint := latest_checkpoint(run_dir)) is not None:
        state = load_checkpoint(accelerator, checkpoint, queue=parts.loss_fn.queue, generator=generator, stream=stream)
        start_epoch = state["epoch"] + 1
        start = EpochStart(state.get("step", 0), state.get("loss_sum", 0.0), state.get("diagnostics"))
        if accelerator.is_main_process:
            rewrite_metrics_upto(metrics_path, state["epoch"])
            within = f", step {start.step} of epoch {start_epoch}" if start.step else ""
            print(f"resuming {run_dir} after epoch {state['epoch']}{within} ({checkpoint.name})", flush=True)
    elif accelerator.is_main_process and metrics_path.exists():
        metrics_path.unlink()

    last_record = time.perf_counter()
    for epoch in range(start_epoch, cfg.epochs + 1):
        epoch_start = start if epoch == start_epoch else EpochStart()
        batches = begin_epoch(run, epoch, epoch_start.step)
        record = train_epoch(run, epoch, batches, epoch_start)
        if "stopped_by" in record:
            kept = {key: record[key] for key in ("loss_sum", "diagnostics") if key in record}
            save_checkpoint(accelerator, run_dir, epoch - 1, {"config": cfg.to_dict(), **kept}, step=record["step"],
                            keep=cfg.keep_checkpoints, queue=parts.loss_fn.queue, generator=generator, stream=stream)
            announce_stop(accelerator, record["stopped_by"], f"in epoch {epoch} after step {record['step']}", run_dir)
            return record["stopped_by"]
        if stream is not None and cfg.skip_unreadable:
            record["unreadable_skipped"] = stream.epoch_unreadable
        if accelerator.is_main_process:
            if run.data.class_names and due(epoch, cfg.monitor_every, cfg.epochs):
                monitor_started = time.perf_counter()
                record["knn_top1"] = run.monitor(parts.encoder)
                record["knn_train_images"] = len(run.monitor.splits[0])
                record["monitor_seconds"] = time.perf_counter() - monitor_started
            record["wall_seconds"] = time.perf_counter() - last_record
            with metrics_path.open("a") as f:
                f.write(json.dumps(record) + "\n")
            accelerator.print(epoch_line(record, cfg.epochs, verbose=cfg.verbose))
            if (warning := collapse_warning(record, cfg)) is not None:
                print(warning, flush=True)
        if cfg.log_with:
            accelerator.log({k: v for k, v in record.items() if k != "epoch"}, step=epoch)
        stopped_by = run.stop.requested(accelerator)
        if stopped_by is not None or due(epoch, cfg.checkpoint_every, cfg.epochs):
            save_checkpoint(accelerator, run_dir, epoch, {"config": cfg.to_dict()}, keep=cfg.keep_checkpoints,
                            queue=parts.loss_fn.queue, stream=stream)
        if stopped_by is not None:
            announce_stop(accelerator, stopped_by, f"after epoch {epoch}", run_dir)
            return stopped_by
        last_record = time.perf_counter()
    return None


def begin_epoch(run: RunState, epoch: int, skip: int = 0) -> Iterable:
    """Select `epoch` everywhere it matters (the batches' order, the training set's pairings, the
    augmenter's stream unless resuming within the epoch, where the checkpoint restored it, the
    loss's schedule), put the model in training mode, and return the epoch's batches from step `skip`."""
    parts = run.parts
    parts.loader.set_epoch(epoch)
    parts.train_set.set_epoch(epoch)
    if parts.augment is not None and not skip:
        parts.augment.set_epoch(epoch, rank=run.accelerator.process_index)
    parts.loss_fn.set_epoch(epoch)
    parts.model.train()
    if not skip:
        return parts.loader
    if isinstance(parts.loader, StreamLoader):
        return parts.loader  # the checkpoint restored its position within the epoch
    if isinstance(parts.loader, ResidentBatches):
        return parts.loader.skip_first_batches(skip)
    batches = run.accelerator.skip_first_batches(parts.loader, skip)
    batches.set_epoch(epoch)  # a fresh loader starts its own epoch count at 0: set it, or it would shuffle as epoch 0
    return batches


def announce_stop(accelerator: Accelerator, signum: int, where: str, run_dir: Path) -> None:
    """Tell (main process) where a signal stopped the run and how to continue it."""
    if accelerator.is_main_process:
        print(f"{signal.Signals(signum).name}: stopped {where}; checkpoint written to {run_dir / 'checkpoints'}. "
              f"Continue with the same launch command and --output_dir {run_dir} --resume", flush=True)


def due(epoch: int, every: int, last: int) -> bool:
    """Whether a per-epoch task (kNN monitor, checkpoint) set to run `every` epochs runs after
    `epoch`: on multiples of `every`, and always after the last epoch."""
    return epoch % every == 0 or epoch == last


def train_step(run: RunState, views: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimisation step on a batch of views (B, V, 3, S, S): the loss and the embeddings
    (B, V, d). Nothing in it reads a device value on the host when the loss's per-call checks are
    off (`ContrastiveLoss.labelled_only`, `check_finite`, as `prepare_training` sets them)."""
    cfg, parts = run.cfg, run.parts
    B, V = views.shape[:2]
    channels_last = parts.fast["channels_last"]
    parts.optimizer.zero_grad(set_to_none=True)
    if cfg.chunk_size is not None:
        loss, z = gradient_cache_step(parts.forward, parts.loss_fn, views, labels, chunk_size=cfg.chunk_size,
                                      backward=run.accelerator.backward, channels_last=channels_last)
    else:
        x = views.flatten(0, 1)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        z = parts.forward(x).view(B, V, -1)
        loss = parts.loss_fn(z, labels)
        run.accelerator.backward(loss)
    parts.optimizer.step()
    return loss, z


def train_epoch(run: RunState, epoch: int, batches: Iterable, start: EpochStart | None = None) -> dict[str, Any]:
    """One pass over `batches` (the run's batches of `epoch`); returns the epoch's record for
    metrics.jsonl (without the kNN monitor).

    With a device augmenter, each batch's views are made one batch ahead, beside the step before
    it (`hscl_zoo.data.overlap.OverlappedViews`); the views are the same as made in turn.
    `epoch_seconds` and `views_per_second` time the steps from the first batch to the device
    having finished the last one; the progress bar shows each step's loss (on CUDA at most every
    `LOSS_REFRESH_SECONDS`, without waiting for the device). The diagnostics are updated at the
    epoch's steps 0, d, 2d, ... (d: the plan's ``diagnostics_every``) and the record says so.

    A pass resumed within the epoch starts at `start` (its step, the summed loss of the steps
    before it and their pooled diagnostics sums, which the main process's meter continues from).
    When the run's `stop` reports a signal after a step other than the epoch's last, the pass ends
    there and the record is instead ``{"stopped_by": signal, "step": steps done in the epoch,
    "loss_sum": their summed loss, "diagnostics": the pooled sums}`` (no sums without diagnostics).
    A loss that became NaN or inf raises `NonFiniteLoss` at the epoch's end (or at the stop)."""
    cfg, accelerator, parts = run.cfg, run.accelerator, run.parts
    start = start or EpochStart()
    diagnostics_every, epoch_steps, stop = run.plan["diagnostics_every"], run.epoch_steps, run.stop
    loss_fn = parts.loss_fn
    meter = diagnostics_meter(cfg, loss_fn)
    if start.diagnostics is not None and accelerator.is_main_process:
        meter.start_from(torch.tensor(start.diagnostics, dtype=torch.float64, device=accelerator.device))
    loss_sum = torch.full((), start.loss_sum, device=accelerator.device)
    readout = LossReadout(accelerator.device)
    steps, seen, started = start.step, 0, time.perf_counter()
    if parts.augment is not None:
        batches = OverlappedViews(batches, parts.augment, accelerator.device)
    bar = tqdm(batches, desc=f"epoch {epoch}/{cfg.epochs}", disable=not accelerator.is_local_main_process, leave=False,
               initial=start.step)
    for step, (views, labels, _) in enumerate(bar, start.step):
        B, V = views.shape[:2]
        loss, z = train_step(run, views, labels)
        loss_sum += loss.detach()
        steps += 1
        seen += B * V * accelerator.num_processes
        if cfg.diagnostics and step % diagnostics_every == 0:
            meter.update(z.detach().float(), labels)
        if not bar.disable and (shown := readout.update(loss)) is not None:
            bar.set_postfix(loss=f"{shown:.4f}")
        if stop is not None and steps != epoch_steps and (signum := stop.requested(accelerator)) is not None:
            bar.close()
            if isinstance(batches, OverlappedViews):
                batches.rewind()  # the checkpoint's generator: before the batch made ahead, which resumes first
            stopped = {"stopped_by": signum, "step": steps, "loss_sum": loss_sum.item()}
            check_finite_loss(stopped["loss_sum"], epoch, steps)
            if cfg.diagnostics:
                stopped["diagnostics"] = accelerator.reduce(meter.state().to(accelerator.device), reduction="sum").tolist()
            return stopped
    if accelerator.device.type == "cuda":
        torch.cuda.synchronize(accelerator.device)
    seconds = time.perf_counter() - started
    train_loss = accelerator.reduce(loss_sum / max(steps, 1), reduction="mean").item()
    check_finite_loss(train_loss, epoch, steps)
    record: dict[str, Any] = {
        "epoch": epoch,
        "train_loss": train_loss,
        "views_per_second": seen / seconds,
        "epoch_seconds": seconds,
    }
    level = getattr(loss_fn.hardening, "current_level", None)
    if level is not None:
        record["threshold"] = level
    if cfg.diagnostics:
        record.update(reduce_diagnostics(accelerator, meter))
        record["diagnostics_every"] = diagnostics_every
    return record
