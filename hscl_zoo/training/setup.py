"""A pretraining run's setup, everything before its first step: the arguments and the run folder
(refuse, resume or overwrite), the data, the encoder, its optimizer, compilation and the
training views with their loader. `hscl_zoo.training.pretrain` calls these in that order.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import DynamoBackend, InitProcessGroupKwargs, set_seed
from torch.utils.data import Dataset

from hscl_zoo.config_help import build_train_parser
from hscl_zoo.data.datasets import LoadedData, load_splits
from hscl_zoo.data.device_augment import BatchSimCLRAugment
from hscl_zoo.data.labelling import partly_labelled
from hscl_zoo.data.loaders import SeededLoader, make_loader
from hscl_zoo.data.raw_images import (
    RawImageDataset,
    batches_in_flight_warning,
    shared_memory_free,
    workers_need_shared_memory,
)
from hscl_zoo.data.resident import ResidentBatches
from hscl_zoo.data.stream_eval import stream_eval_data, stream_spec
from hscl_zoo.data.streaming import StreamingViews, StreamLoader, open_stream
from hscl_zoo.data.sources import source_options
from hscl_zoo.data.transforms import simclr_transform
from hscl_zoo.data.views import MultiViewDataset
from hscl_zoo.losses.methods import build_loss
from hscl_zoo.models import ContrastiveEncoder, create_model
from hscl_zoo.training.config import MIN_IMAGE_SIZE, PretrainConfig, parse_overrides
from hscl_zoo.training.gradient_cache import prepare_batchnorm
from hscl_zoo.training.resources import check_memory_fit, estimate_training_memory
from hscl_zoo.training.run_folder import LOCK_FILE, RunLock, foreign_entries, remove_run_files
from hscl_zoo.training.state import TrainingParts

__all__ = ["RESUMABLE_CHANGES", "UNLABELLED_HEAD", "TrainingParts", "build_encoder", "build_optimizer",
           "check_fresh_folder", "check_image_size", "claim_run_folder", "compiled_forward", "load_training_data",
           "make_accelerator", "parse_args", "prepare_training", "refuse_what_cannot_fit", "resolve_run", "run_contents",
           "training_views"]

RESUMABLE_CHANGES = {"num_workers", "log_with", "monitor_every", "checkpoint_every", "memory_check", "dist_timeout",
                     "verbose"}
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


def load_training_data(cfg: PretrainConfig, accelerator: Accelerator) -> tuple[LoadedData, PretrainConfig]:
    """The run's dataset (own data measured by the main process first, so the others read its
    cache), with only ``labelled_fraction`` of its training labels kept (and, with
    ``train_on_unlabelled`` false, only the labelled images), and the config with the
    normalisation it will use recorded in ``mean``/``std``.

    Raises ValueError before training when the method (or label-positive pairing) needs labels
    and the data has none."""
    with accelerator.main_process_first():
        if cfg.streaming:
            spec = stream_spec(cfg.dataset, image_size=cfg.image_size, mean=cfg.mean, std=cfg.std)
            data = stream_eval_data(cfg.dataset, cfg.data_dir, examples=cfg.stream_eval_examples, spec=spec,
                                    columns={"image_column": cfg.image_column, "label_column": cfg.label_column},
                                    train_split=cfg.train_split, test_split=cfg.test_split, seed=cfg.seed)
        else:
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


def compiled_forward(model: torch.nn.Module, accelerator: Accelerator, *, requested: bool,
                     mode: str = "default") -> Callable[[torch.Tensor], torch.Tensor]:
    """The model, compiled (in torch.compile's `mode`) when `compile` is set, and compiled once:
    when the Accelerate config's dynamo backend is on, `prepare` has compiled it already (and
    turned on TF32 for matmuls without mixed precision). The loss always stays eager: the fused
    node's buffers reused in backward are not for the compiler."""
    if accelerator.state.dynamo_plugin.backend != DynamoBackend.NO:
        if requested and accelerator.is_main_process:
            print("compile: the Accelerate config's dynamo backend already compiled the model; not compiling it again.",
                  flush=True)
        return model
    return torch.compile(model, mode=mode) if requested else model


def training_views(
    cfg: PretrainConfig,
    data: LoadedData,
    image_size: int,
    accelerator: Accelerator,
    *,
    gpu_augment: bool,
    cache_images: bool,
    device_data: bool = False,
) -> tuple[Dataset, BatchSimCLRAugment | None, SeededLoader | ResidentBatches]:
    """The training set, the device augmenter (None when the workers augment) and the batches of
    one process's share of each global batch: a seeded loader, or with `device_data` the split
    resident on the device (`hscl_zoo.data.resident`), augmented by a generator there."""
    augmentation = simclr_transform(image_size, mean=cfg.mean or data.spec.mean, std=cfg.std or data.spec.std)
    augment = None
    per_process = cfg.batch_size // accelerator.num_processes
    if cfg.streaming:
        return streamed_views(cfg, data, augmentation, accelerator)
    if device_data:
        train_set = RawImageDataset(data.train, cache=True)
        augment = BatchSimCLRAugment.from_transform(augmentation, views=cfg.views, seed=cfg.seed,
                                                    generator_device=accelerator.device).to(accelerator.device)
        batches = ResidentBatches(train_set.images, torch.from_numpy(train_set.labels), per_process,
                                  device=accelerator.device, seed=cfg.seed, num_processes=accelerator.num_processes,
                                  process_index=accelerator.process_index)
        return train_set, augment, batches
    if gpu_augment:
        train_set = RawImageDataset(data.train, cache=cache_images, share=workers_need_shared_memory(cfg.num_workers),
                                    label_positive=cfg.label_positive_pairing, views=cfg.views, seed=cfg.seed)
        augment = BatchSimCLRAugment.from_transform(augmentation, views=cfg.views, seed=cfg.seed).to(accelerator.device)
    else:
        train_set = MultiViewDataset(data.train, augmentation, views=cfg.views,
                                     label_positive=cfg.label_positive_pairing, seed=cfg.seed)
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


def streamed_views(cfg: PretrainConfig, data: LoadedData, augmentation: Any,
                   accelerator: Accelerator) -> tuple[StreamingViews, None, StreamLoader]:
    """The training split as a stream (`hscl_zoo.data.streaming`): this process's shard, shuffled
    per epoch, views cut in DataLoader workers, batches kept in step over processes (each batch only
    when every process has one, so all take the same steps)."""
    source = open_stream(cfg.dataset, split=cfg.train_split or data.spec.train_split, data_dir=cfg.data_dir,
                         image_column=cfg.image_column, label_column=cfg.label_column,
                         needs_labels=cfg.positives == "labels" or cfg.method_spec.reads_labels)
    world = accelerator.num_processes
    views = StreamingViews(source, augmentation, views=cfg.views, seed=cfg.seed, buffer_size=cfg.stream_buffer_size,
                           rank=accelerator.process_index, world_size=world, skip_unreadable=cfg.skip_unreadable)

    def all_have(have: bool) -> bool:
        flag = torch.tensor([float(have)], device=accelerator.device)
        return accelerator.reduce(flag, reduction="sum").item() == world

    loader = StreamLoader(views, cfg.batch_size // world, num_workers=cfg.num_workers,
                          all_have=all_have if world > 1 else None,
                          max_steps=cfg.stream_epoch_examples // cfg.batch_size if cfg.stream_epoch_examples else None,
                          pin_memory=accelerator.device.type == "cuda")
    return views, None, loader


def make_accelerator(cfg: PretrainConfig) -> Accelerator:
    """The run's Accelerator: its mixed precision and tracker, the run folder as project folder,
    a loader seeded by the config and collectives that give up after ``dist_timeout`` seconds."""
    return Accelerator(
        mixed_precision=cfg.mixed_precision,
        log_with=cfg.log_with,
        project_dir=cfg.output_dir,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=cfg.seed, non_blocking=True),
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.dist_timeout))],
    )


def prepare_training(cfg: PretrainConfig, data: LoadedData, image_size: int, accelerator: Accelerator,
                     plan: dict[str, Any]) -> TrainingParts:
    """Everything the recipe's epochs need, built as a run builds it (seeded initialisation,
    BatchNorm per `plan`, the CUDA memory check, the fast path, `accelerator.prepare`), so that
    `hscl_zoo.training.pretrain` and the benchmark against a bare loop train the same thing."""
    set_seed(cfg.seed)
    encoder = build_encoder(cfg, data, image_size)
    model = prepare_batchnorm(encoder.projection_network(), "sync" if plan["sync_batchnorm"] else "per-chunk")
    if accelerator.device.type == "cuda" and cfg.memory_check:
        refuse_what_cannot_fit(cfg, model, image_size, accelerator)
    fast = cfg.fast_path(accelerator.device.type)
    train_set, augment, loader = training_views(cfg, data, image_size, accelerator, gpu_augment=fast["gpu_augment"],
                                                cache_images=fast["cache_images"], device_data=fast["device_data"])
    if fast["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
    optimizer = build_optimizer(cfg, model.parameters(), fused=fast["fused_optimizer"])
    if isinstance(loader, (ResidentBatches, StreamLoader)):
        model, optimizer = accelerator.prepare(model, optimizer)
    else:
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    forward = compiled_forward(model, accelerator, requested=fast["compile"], mode=cfg.compile_mode)
    if augment is not None and fast["compile"]:
        augment.compile_kernels(mode=cfg.compile_mode)
    loss_fn = build_loss(cfg.method, **cfg.loss_kwargs())
    loss_fn.equal_batches = True  # the loader drops the last incomplete batch: batch_size / processes images each
    # checked once, not every step (a stream's labels are not all known in advance)
    loss_fn.labelled_only = not cfg.streaming and bool((np.asarray(data.train.select_columns(["label"])["label"]) >= 0).all())
    loss_fn.check_finite = False  # train_epoch checks each epoch's loss instead, without waiting every step
    return TrainingParts(encoder, model, train_set, augment, loader, forward, optimizer, loss_fn, fast)
