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
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import DynamoBackend, InitProcessGroupKwargs, set_seed
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from hscl_zoo.config_help import build_train_parser
from hscl_zoo.data.datasets import LoadedData, load_splits
from hscl_zoo.data.sources import source_options
from hscl_zoo.data.device_augment import BatchSimCLRAugment
from hscl_zoo.data.labelling import partly_labelled
from hscl_zoo.data.loaders import SeededLoader, make_loader
from hscl_zoo.data.raw_images import (
    RawImageDataset,
    batches_in_flight_warning,
    shared_memory_free,
    workers_need_shared_memory,
)
from hscl_zoo.data.transforms import simclr_transform
from hscl_zoo.data.views import MultiViewDataset
from hscl_zoo.evaluation import METRICS, evaluate_encoder
from hscl_zoo.losses.methods import build_loss
from hscl_zoo.losses.objective import ContrastiveLoss
from hscl_zoo.models import ContrastiveEncoder, create_model
from hscl_zoo.training.checkpointing import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from hscl_zoo.training.config import MIN_IMAGE_SIZE, PretrainConfig, parse_overrides
from hscl_zoo.training.gradient_cache import prepare_batchnorm
from hscl_zoo.training.monitoring import (
    KnnMonitor,
    collapse_warning,
    diagnostics_meter,
    read_metrics,
    reduce_diagnostics,
    rewrite_metrics_upto,
)
from hscl_zoo.training.preemption import StopOnSignal, exit_status
from hscl_zoo.training.publishing import training_summary, write_hub_folder
from hscl_zoo.training.resources import check_memory_fit, estimate_training_memory
from hscl_zoo.training.run_folder import LOCK_FILE, RunFolderError, RunLock, foreign_entries, remove_run_files
from hscl_zoo.training.steps import check_chunk_size, gradient_cache_step

__all__ = ["main", "pretrain", "parse_args", "resolve_run", "build_optimizer", "training_views", "train_epoch",
           "export_run"]

RESUMABLE_CHANGES = {"num_workers", "log_with", "monitor_every", "checkpoint_every", "memory_check", "dist_timeout"}
LOSS_REFRESH_SECONDS = 0.5
"""On CUDA, the least time between two progress-bar loss readbacks (each a host sync); on the CPU
the bar shows every step's loss, which costs nothing to read."""
LOST_PROCESS_SIGNS = ("gloo/", "pair closure", "closed by peer", "reset by peer", "Timed out waiting")
"""Parts of the errors gloo raises when another process died or stopped answering: its source
path, or the text of those that lack it (a pair closed by this process's own timeout)."""
UNLABELLED_HEAD = "unlabelled"
"""The one class name of the (untrained) head of an encoder trained on unlabelled images."""


def parse_args(argv: list[str], prog: str | None = None) -> tuple[PretrainConfig, argparse.Namespace, dict[str, str]]:
    parser = build_train_parser(prog)
    args, rest = parser.parse_known_args(argv)
    try:
        overrides = parse_overrides(rest)
        cfg = PretrainConfig.from_sources(args.config, overrides)
    except ValueError as error:
        parser.error(str(error))
    if args.resume and args.overwrite:
        parser.error("--resume continues a run and --overwrite deletes it: pass one of them.")
    return cfg, args, overrides


def run_contents(run_dir: Path) -> list[str]:
    if not run_dir.is_dir():
        return []
    return sorted(p.name for p in run_dir.iterdir())


def resolve_run(cfg: PretrainConfig, args: argparse.Namespace, overrides: dict[str, str]) -> PretrainConfig:
    """Decide what happens to output_dir: refuse, resume (with the saved config, in the folder
    given: an output_dir the saved config names is noted, never followed) or overwrite. Reads
    only; `claim_run_folder` repeats the checks under the run's lock before anything is written."""
    run_dir = Path(cfg.output_dir)
    if args.resume:
        saved_path = run_dir / "config.json"
        if not saved_path.is_file():
            raise SystemExit(f"error: --resume: {run_dir} holds no run (no config.json). Drop --resume to start one there.")
        try:
            saved = PretrainConfig.from_dict(json.loads(saved_path.read_text()), source=str(saved_path))
        except (ValueError, UnicodeDecodeError) as error:
            raise SystemExit(f"error: --resume: {saved_path} is not a run's config ({error}).") from None
        if Path(saved.output_dir).resolve() != run_dir.resolve():
            print(f"note: {saved_path} names output_dir {saved.output_dir} (the run was copied or moved); resuming in "
                  f"{run_dir}, the folder given.", flush=True)
        saved = dataclasses.replace(saved, output_dir=str(run_dir))
        explicit = PretrainConfig.from_sources(args.config, overrides).to_dict() if (args.config or overrides) else {}
        given = set(overrides) | (set(explicit) if args.config else set())
        changed = sorted(k for k in given - RESUMABLE_CHANGES - {"output_dir"} if explicit[k] != saved.to_dict()[k])
        if changed:
            raise SystemExit(
                f"error: --resume continues {run_dir} with its saved config; these settings differ from it: "
                f"{', '.join(f'{k} ({saved.to_dict()[k]!r} saved, {explicit[k]!r} given)' for k in changed)}. "
                "Drop them, or start a new run with another --output_dir."
            )
        return PretrainConfig.from_dict({**saved.to_dict(), **{k: explicit[k] for k in given & RESUMABLE_CHANGES}})
    check_fresh_folder(run_dir, overwrite=args.overwrite)
    return cfg


def check_fresh_folder(run_dir: Path, *, overwrite: bool) -> None:
    """Refuse a new run in a folder that holds anything (a run without --overwrite; with it, files
    no run writes)."""
    contents = [name for name in run_contents(run_dir) if name != LOCK_FILE]
    foreign = foreign_entries(run_dir)
    if foreign:
        raise SystemExit(
            f"error: output_dir {run_dir} holds files no run writes ({', '.join(foreign[:5])}"
            f"{' ...' if len(foreign) > 5 else ''}): a run starts in a new or empty folder, and --overwrite deletes "
            "only a run's own files. Choose another --output_dir."
        )
    if contents and not overwrite:
        raise SystemExit(
            f"error: output_dir {run_dir} already holds a run ({', '.join(contents)}). Pass --resume to continue it, "
            "--overwrite to delete it and start again, or choose another --output_dir."
        )


def claim_run_folder(run_dir: Path, args: argparse.Namespace, cfg: PretrainConfig) -> RunLock:
    """Take the run's lock on `run_dir` (main process), check the folder again under it, delete
    the old run with --overwrite and write config.json: the run's first writes."""
    lock = RunLock(run_dir).acquire()
    try:
        if not args.resume:
            check_fresh_folder(run_dir, overwrite=args.overwrite)
            remove_run_files(run_dir)
        (run_dir / "config.json").write_text(cfg.to_json() + "\n")
    except BaseException:
        lock.release()
        raise
    return lock


def check_image_size(image_size: int, cfg: PretrainConfig) -> None:
    """Refuse a run whose images (the dataset's median side, when image_size is unset) are too
    small to augment and encode."""
    if image_size < MIN_IMAGE_SIZE:
        raise ValueError(f"{cfg.dataset}: its images are {image_size} px (their median shorter side), smaller than the "
                         f"{MIN_IMAGE_SIZE} px a run trains at; set --image_size 32 (or more) to resize them, or use "
                         "larger images.")


def build_optimizer(cfg: PretrainConfig, params, *, fused: bool) -> torch.optim.Optimizer:
    fused_arg = {"fused": True} if fused else {}
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **fused_arg)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **fused_arg)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay, **fused_arg)


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
        print("interrupted outside the training loop; --resume continues from the latest checkpoint, if any.",
              file=sys.stderr)
        raise SystemExit(128 + signal.SIGINT) from None


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
    cfg, args, overrides = parse_args(argv, prog)
    cfg = resolve_run(cfg, args, overrides)
    run_dir = Path(cfg.output_dir)
    accelerator = Accelerator(
        mixed_precision=cfg.mixed_precision,
        log_with=cfg.log_with,
        project_dir=str(run_dir),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=cfg.seed, non_blocking=True),
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.dist_timeout))],
    )
    world = accelerator.num_processes
    plan = cfg.device_plan(accelerator.device.type, world)
    if accelerator.device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: pick the fastest convolution once
    if cfg.batch_size % world:
        raise SystemExit(f"error: batch_size {cfg.batch_size} is global and must divide evenly over {world} processes.")
    if cfg.chunk_size is not None:
        check_chunk_size(cfg.chunk_size, cfg.batch_size, cfg.views, world)

    data, cfg = load_training_data(cfg, accelerator)
    if cfg.batch_size > len(data.train):
        raise SystemExit(
            f"error: batch_size {cfg.batch_size} is larger than the {len(data.train)} training images of "
            f"{cfg.dataset}{f' (subset {cfg.subset})' if cfg.subset else ''}: no full batch exists. "
            f"Pass --batch_size {len(data.train)} or smaller."
        )
    image_size = cfg.image_size or data.spec.image_size
    check_image_size(image_size, cfg)
    set_seed(cfg.seed)
    encoder = build_encoder(cfg, data, image_size)
    model = prepare_batchnorm(encoder.projection_network(), "sync" if plan["sync_batchnorm"] else "per-chunk")
    if accelerator.device.type == "cuda" and cfg.memory_check:
        refuse_what_cannot_fit(cfg, model, image_size, accelerator)
    fast = cfg.fast_path(accelerator.device.type)
    train_set, augment, loader = training_views(cfg, data, image_size, accelerator, gpu_augment=fast["gpu_augment"],
                                                cache_images=fast["cache_images"])
    if fast["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
    optimizer = build_optimizer(cfg, model.parameters(), fused=fast["fused_optimizer"])
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    forward = compiled_forward(model, accelerator, requested=fast["compile"])
    loss_fn = build_loss(cfg.method, **cfg.loss_kwargs())
    loss_fn.equal_batches = True  # the loader drops the last incomplete batch: batch_size / processes images each
    monitor = KnnMonitor(data, cfg, accelerator.device) if accelerator.is_main_process and data.class_names else None

    lock = claim_run_folder(run_dir, args, cfg) if accelerator.is_main_process else None
    try:
        accelerator.wait_for_everyone()
        if cfg.log_with:
            accelerator.init_trackers("hscl_zoo", config=cfg.to_dict())
        with StopOnSignal(on_force_exit=lock.release if lock else None) as stop:
            stopped = train_epochs(cfg, args, accelerator, run_dir, encoder, model, data, monitor, train_set, augment,
                                   loader, forward, optimizer, loss_fn, fast=fast, plan=plan, stop=stop)
        if stopped is not None:
            accelerator.end_training()
            raise SystemExit(exit_status(stopped))
        result: dict[str, Any] = {}
        if accelerator.is_main_process:
            result = export_run(cfg, encoder, data, run_dir, accelerator.device, num_processes=world,
                                config_path=args.config)
        accelerator.wait_for_everyone()
        accelerator.end_training()
        return result
    finally:
        if lock is not None:
            lock.release()


def train_epochs(
    cfg: PretrainConfig,
    args: argparse.Namespace,
    accelerator: Accelerator,
    run_dir: Path,
    encoder: ContrastiveEncoder,
    model: torch.nn.Module,
    data: LoadedData,
    monitor: KnnMonitor | None,
    train_set: Dataset,
    augment: BatchSimCLRAugment | None,
    loader: Any,
    forward: Callable[[torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    loss_fn: ContrastiveLoss,
    *,
    fast: dict[str, bool],
    plan: dict[str, Any],
    stop: StopOnSignal,
) -> int | None:
    """The epochs still to train (after the latest checkpoint with --resume, from within an epoch
    when a signal stopped it there), each logged to metrics.jsonl and checkpointed when due.
    Returns the signal that stopped training (after a checkpoint and the resume instructions),
    or None when every epoch ran."""
    start_epoch, start_step, carried = 1, 0, (0.0, 0)
    metrics_path = run_dir / "metrics.jsonl"
    generator = augment.generator if augment is not None else None
    if args.resume and (checkpoint := latest_checkpoint(run_dir)) is not None:
        state = load_checkpoint(accelerator, checkpoint, queue=loss_fn.queue, generator=generator)
        start_epoch, start_step = state["epoch"] + 1, state.get("step", 0)
        carried = (state.get("loss_sum", 0.0), start_step)
        if accelerator.is_main_process:
            rewrite_metrics_upto(metrics_path, state["epoch"])
            within = f", step {start_step} of epoch {start_epoch}" if start_step else ""
            print(f"resuming {run_dir} after epoch {state['epoch']}{within} ({checkpoint.name})", flush=True)
    elif accelerator.is_main_process and metrics_path.exists():
        metrics_path.unlink()

    last_record = time.perf_counter()
    for epoch in range(start_epoch, cfg.epochs + 1):
        loader.set_epoch(epoch)
        train_set.set_epoch(epoch)
        skip = start_step if epoch == start_epoch else 0
        if augment is not None and not skip:
            augment.set_epoch(epoch, rank=accelerator.process_index)
        loss_fn.set_epoch(epoch)
        epoch_loader = loader
        if skip:  # a fresh loader starts its own epoch count at 0: set it, or it would shuffle as epoch 0
            epoch_loader = accelerator.skip_first_batches(loader, skip)
            epoch_loader.set_epoch(epoch)
        model.train()
        record = train_epoch(cfg, epoch, accelerator, epoch_loader, augment, forward, optimizer, loss_fn,
                             channels_last=fast["channels_last"], diagnostics_every=plan["diagnostics_every"],
                             start_step=skip, carried=carried if skip else (0.0, 0), stop=stop)
        if "stopped_by" in record:
            save_checkpoint(accelerator, run_dir, epoch - 1, {"config": cfg.to_dict(), "loss_sum": record["loss_sum"]},
                            step=record["step"], keep=cfg.keep_checkpoints, queue=loss_fn.queue, generator=generator)
            if accelerator.is_main_process:
                name = signal.Signals(record["stopped_by"]).name
                print(f"{name}: stopped in epoch {epoch} after step {record['step']}; checkpoint written to "
                      f"{run_dir / 'checkpoints'}. Continue with the same launch command and --output_dir {run_dir} "
                      "--resume", flush=True)
            return record["stopped_by"]
        if accelerator.is_main_process:
            if data.class_names and due(epoch, cfg.monitor_every, cfg.epochs):
                monitor_started = time.perf_counter()
                record["knn_top1"] = monitor(encoder)
                record["knn_train_images"] = len(monitor.splits[0])
                record["monitor_seconds"] = time.perf_counter() - monitor_started
            record["wall_seconds"] = time.perf_counter() - last_record
            with metrics_path.open("a") as f:
                f.write(json.dumps(record) + "\n")
            accelerator.print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()))
            if (warning := collapse_warning(record, cfg)) is not None:
                print(warning, flush=True)
        if cfg.log_with:
            accelerator.log({k: v for k, v in record.items() if k != "epoch"}, step=epoch)
        if due(epoch, cfg.checkpoint_every, cfg.epochs):
            save_checkpoint(accelerator, run_dir, epoch, {"config": cfg.to_dict()}, keep=cfg.keep_checkpoints,
                            queue=loss_fn.queue)
        last_record = time.perf_counter()
    return None


def load_training_data(cfg: PretrainConfig, accelerator: Accelerator) -> tuple[LoadedData, PretrainConfig]:
    """The run's dataset (own data measured by the main process first, so the others read its
    cache), with only ``labelled_fraction`` of its training labels kept (and, with
    ``train_on_unlabelled`` false, only the labelled images), and the config with the
    normalisation it will use recorded in ``mean``/``std``.

    Raises ValueError before training when the method (or label-positive pairing) needs labels
    and the data has none."""
    with accelerator.main_process_first():
        data = load_splits(cfg.dataset, cfg.data_dir, subset=cfg.subset, seed=cfg.seed, full_test=cfg.full_test,
                           **source_options(cfg.to_dict()))
    data = partly_labelled(data, cfg.labelled_fraction, seed=cfg.seed)
    if not cfg.train_on_unlabelled:
        data = data.labelled()
        if accelerator.is_main_process:
            print(f"train_on_unlabelled false: pretraining on the {len(data.train)} labelled training images only.",
                  flush=True)
    uses_labels = cfg.positives == "labels" or cfg.method_spec.reads_labels
    if not data.class_names and (uses_labels or cfg.label_positive_pairing):
        raise ValueError(f"{cfg.dataset} has no labels (no class folders or label column), and method {cfg.method!r}"
                         f"{' with label_positive_pairing' if cfg.label_positive_pairing else ''} needs them. Train "
                         "ucl or hucl on unlabelled images, or give one subfolder per class / a label_column.")
    return data, dataclasses.replace(cfg, mean=cfg.mean or list(data.spec.mean), std=cfg.std or list(data.spec.std))


def build_encoder(cfg: PretrainConfig, data: LoadedData, image_size: int) -> ContrastiveEncoder:
    """The config's backbone and stem at `image_size`, headed for the data's classes (one placeholder
    class when nothing is labelled), normalising with the config's mean and std."""
    return create_model(
        cfg.backbone,
        num_classes=len(data.class_names) or 1,
        image_size=image_size,
        small_stem={"small": True, "default": False, "auto": None}[cfg.stem],
        class_names=data.class_names or [UNLABELLED_HEAD],
        mean=cfg.mean,
        std=cfg.std,
    )


def due(epoch: int, every: int, last: int) -> bool:
    """Whether a per-epoch task (kNN monitor, checkpoint) set to run `every` epochs runs after
    `epoch`: on multiples of `every`, and always after the last epoch."""
    return epoch % every == 0 or epoch == last


def refuse_what_cannot_fit(cfg: PretrainConfig, model: torch.nn.Module, image_size: int, accelerator: Accelerator) -> None:
    """Estimate one step's memory on this process (`hscl_zoo.training.resources`) and raise
    ValueError if it exceeds the device's free memory; print a warning when it comes close."""
    local = cfg.batch_size // accelerator.num_processes * cfg.views
    per_pass = cfg.chunk_size * cfg.views if cfg.chunk_size else local  # the cache: chunk_size images' views a pass
    estimate = estimate_training_memory(model, image_size=image_size, images_per_pass=per_pass, local_views=local,
                                        global_views=cfg.batch_size * cfg.views, mixed_precision=cfg.mixed_precision,
                                        optimizer=cfg.optimizer)
    free, _ = torch.cuda.mem_get_info(accelerator.device)
    setting = (f"{cfg.backbone} ({cfg.stem} stem) at {image_size} px, {per_pass} views a pass, "
               f"mixed_precision {cfg.mixed_precision}")
    warning = check_memory_fit(estimate, free, setting=f"{setting} (memory_check false skips this check)")
    if warning and accelerator.is_main_process:
        print(warning, flush=True)


def compiled_forward(model: torch.nn.Module, accelerator: Accelerator, *, requested: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """The model, compiled when `compile` is set, and compiled once: when the Accelerate config's
    dynamo backend is on, `prepare` has compiled it already (and turned on TF32 for matmuls
    without mixed precision). The loss always stays eager: its finiteness check and the fused
    node's buffers reused in backward are not for the compiler."""
    if accelerator.state.dynamo_plugin.backend != DynamoBackend.NO:
        if requested and accelerator.is_main_process:
            print("compile: the Accelerate config's dynamo backend already compiled the model; not compiling it again.",
                  flush=True)
        return model
    return torch.compile(model) if requested else model


def training_views(
    cfg: PretrainConfig,
    data: LoadedData,
    image_size: int,
    accelerator: Accelerator,
    *,
    gpu_augment: bool,
    cache_images: bool,
) -> tuple[Dataset, BatchSimCLRAugment | None, SeededLoader]:
    """The training set, the device augmenter (None when the workers augment) and the seeded
    loader of one process's share of each global batch."""
    augmentation = simclr_transform(image_size, mean=cfg.mean or data.spec.mean, std=cfg.std or data.spec.std)
    augment = None
    if gpu_augment:
        train_set = RawImageDataset(data.train, cache=cache_images, share=workers_need_shared_memory(cfg.num_workers),
                                    label_positive=cfg.label_positive_pairing, views=cfg.views, seed=cfg.seed)
        augment = BatchSimCLRAugment.from_transform(augmentation, views=cfg.views, seed=cfg.seed).to(accelerator.device)
    else:
        train_set = MultiViewDataset(data.train, augmentation, views=cfg.views,
                                     label_positive=cfg.label_positive_pairing, seed=cfg.seed)
    per_process = cfg.batch_size // accelerator.num_processes
    loader = make_loader(train_set, per_process, shuffle=True, seed=cfg.seed, num_workers=cfg.num_workers,
                         drop_last=True, pin_memory=accelerator.device.type == "cuda",
                         persistent_workers=cfg.num_workers > 0)
    copies = cfg.views if not gpu_augment or cfg.label_positive_pairing else 1
    image_bytes = 3 * image_size * image_size * copies * (1 if gpu_augment else 4)
    warning = batches_in_flight_warning(per_process * image_bytes, num_workers=cfg.num_workers,
                                        shm_free=shared_memory_free())
    if warning and accelerator.is_local_main_process:
        print(warning, flush=True)
    return train_set, augment, loader


def train_epoch(
    cfg: PretrainConfig,
    epoch: int,
    accelerator: Accelerator,
    loader: Iterable,
    augment: BatchSimCLRAugment | None,
    forward: Callable[[torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    loss_fn: ContrastiveLoss,
    *,
    channels_last: bool,
    diagnostics_every: int = 1,
    start_step: int = 0,
    carried: tuple[float, int] = (0.0, 0),
    stop: StopOnSignal | None = None,
) -> dict[str, Any]:
    """One pass over the loader; returns the epoch's record for metrics.jsonl (without the kNN monitor).

    `epoch_seconds` and `views_per_second` time the steps from the first batch to the device
    having finished the last one; the progress bar shows each step's loss (on CUDA at most every
    `LOSS_REFRESH_SECONDS`) and the diagnostics updated every `diagnostics_every` steps.

    A loader resumed within the epoch starts at step `start_step`, with `carried` the summed loss
    and count of the steps before it (the diagnostics cover only the steps after it). When `stop`
    reports a signal after a step, the pass ends there and the record is instead
    ``{"stopped_by": signal, "step": steps done in the epoch, "loss_sum": their summed loss}``."""
    meter = diagnostics_meter(cfg, loss_fn)
    loss_sum = torch.full((), carried[0], device=accelerator.device)
    steps, seen, started = carried[1], 0, time.perf_counter()
    shown = -LOSS_REFRESH_SECONDS
    bar = tqdm(loader, desc=f"epoch {epoch}/{cfg.epochs}", disable=not accelerator.is_local_main_process, leave=False,
               initial=start_step)
    for step, (images, labels, _) in enumerate(bar, start_step):
        views = augment(images) if augment is not None else images
        B, V = views.shape[:2]
        optimizer.zero_grad(set_to_none=True)
        if cfg.chunk_size is not None:
            loss, z = gradient_cache_step(forward, loss_fn, views, labels, chunk_size=cfg.chunk_size,
                                          backward=accelerator.backward, channels_last=channels_last)
        else:
            x = views.flatten(0, 1)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            z = forward(x).view(B, V, -1)
            loss = loss_fn(z, labels)
            accelerator.backward(loss)
        optimizer.step()
        loss_sum += loss.detach()
        steps += 1
        seen += B * V * accelerator.num_processes
        if cfg.diagnostics and step % diagnostics_every == 0:
            meter.update(z.detach().float(), labels)
        if not bar.disable and (accelerator.device.type != "cuda" or time.perf_counter() - shown >= LOSS_REFRESH_SECONDS):
            bar.set_postfix(loss=f"{loss.item():.4f}")
            shown = time.perf_counter()
        if stop is not None and (signum := stop.requested(accelerator)) is not None:
            bar.close()
            return {"stopped_by": signum, "step": steps, "loss_sum": loss_sum.item()}
    if accelerator.device.type == "cuda":
        torch.cuda.synchronize(accelerator.device)
    seconds = time.perf_counter() - started
    record: dict[str, Any] = {
        "epoch": epoch,
        "train_loss": accelerator.reduce(loss_sum / max(steps, 1), reduction="mean").item(),
        "views_per_second": seen / seconds,
        "epoch_seconds": seconds,
    }
    level = getattr(loss_fn.hardening, "current_level", None)
    if level is not None:
        record["threshold"] = level
    if cfg.diagnostics:
        record.update(reduce_diagnostics(accelerator, meter))
    return record


def export_run(
    cfg: PretrainConfig,
    encoder: ContrastiveEncoder,
    data: LoadedData,
    run_dir: Path,
    device: torch.device,
    *,
    num_processes: int,
    config_path: str | None,
) -> dict[str, Any]:
    """Probe the trained encoder, fit its linear head, write linear_eval.json and the Hub folder
    (unlabelled data: no probe, an empty evaluation and an untrained one-output head). The result
    adds ``views_per_second_after_epoch1``: the median training throughput of epochs 2 on (epoch 1
    holds compilation, cuDNN's search and the allocator's warm-up; None with one epoch)."""
    evaluation: dict[str, Any] = {}
    training = training_summary(cfg, num_processes, len(data.class_names) or 1, config_path)
    encoder.training_summary = training  # the audit reads the run's temperature and hardening from it
    if data.class_names:
        evaluation = evaluate_encoder(encoder, data, metrics=METRICS, epochs=cfg.probe_epochs, knn_k=cfg.knn_k,
                                      seed=cfg.seed, device=device)
        encoder.classifier.load_state_dict(evaluation.pop("head"))
        (run_dir / "linear_eval.json").write_text(json.dumps(evaluation, indent=2) + "\n")
    history = read_metrics(run_dir / "metrics.jsonl")
    hub_dir = write_hub_folder(encoder, run_dir / "hub", training=training, evaluation=evaluation, history=history)
    later = [h["views_per_second"] for h in history if h["epoch"] >= 2]
    throughput = statistics.median(later) if later else None
    if not evaluation:
        print(f"{cfg.dataset} is unlabelled: no linear probe. Hub-ready folder: {hub_dir}", flush=True)
        return {"hub_dir": str(hub_dir), "views_per_second_after_epoch1": throughput}
    print(
        f"linear-probe top-1 {evaluation['top1']:.2f}% (top-5 {evaluation['top5']:.2f}%), "
        f"kNN top-1 {evaluation['knn_top1']:.2f}% on {cfg.dataset} {data.spec.test_split} "
        f"({len(data.test)} images; fitted on {evaluation['train_images']} labelled training images). "
        f"Hub-ready folder: {hub_dir}"
        + (f". Training throughput from epoch 2: {throughput:,.0f} views/s." if throughput else ""),
        flush=True,
    )
    return {**evaluation, "hub_dir": str(hub_dir), "views_per_second_after_epoch1": throughput}
