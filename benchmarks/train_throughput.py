"""Images per second of contrastive pretraining: the full step, the data pipeline, the compute.

Three modes, each printing markdown tables (ratios come from the same run):

* default: for every backbone x stem x loss x configuration, three rows, in images per second
  counting every view (the paper's ~560 img/s on an A100 counts both views):
    - data:    the data pipeline alone: decode -> augment -> views on the device, per batch;
    - compute: the step alone on pre-made tensors already on the device:
               forward both views -> loss -> backward -> optimizer step;
    - e2e:     the whole step fed by a fresh pipeline, its views made before each step;
    - e2e-overlap (with ``--overlap``): the same, the views made one batch ahead on a side
               stream beside the step before (what a training run gets).
  Each row is one timed window of ``--steps`` steps after ``--warmup`` steps, the device
  synchronised only before and after it (a sync per step would measure latency, not throughput).
  The data and e2e stages first discard the batches the workers prepared ahead (``workers x
  prefetch_factor``), so that none made before the timer starts is counted.
  Configurations: "plain" (the recipe today: CPU SimCLR transforms in DataLoader workers, fp32,
  contiguous, eager, unfused Adam) and, when any option flag is given, "fast" with those
  options. Peak device memory per stage on CUDA (torch.cuda.max_memory_allocated).
* ``--augment-bench``: the augmentation alone, uint8 batch -> normalised views: our batched torch
  ops (hscl_zoo.data.device_augment), kornia.augmentation, and the CPU per-image pipeline (one process).
* ``--loss-memory``: peak memory of one loss forward + backward at N = 2 x {512, 1024, 2048, 4096}
  views (d = 128), for each loss. CUDA: torch.cuda.max_memory_allocated above the inputs. CPU:
  the growth of the process's peak resident set (VmHWM, reset through /proc/self/clear_refs)
  over the resident set before the call, with glibc told to mmap every block over 64 KiB (so
  freed N x N buffers leave the resident set); both are also given in units of one N x N
  float32 matrix.

The last two modes are in `throughput_modes.py` beside this script.

    python benchmarks/train_throughput.py --device cpu --backbones resnet18 --steps 3
    python benchmarks/train_throughput.py --device cuda --backbones resnet18 resnet50 --batch-size 512 \\
        --channels-last --compile --fused-optim --gpu-augment --bf16 --cache --workers 16
    python benchmarks/train_throughput.py --augment-bench --device cuda
    python benchmarks/train_throughput.py --loss-memory --device cuda

Data: the CIFAR-10 train parquet of ../shared/data/cifar10 when present (``--data-dir``), its
first ``--rows`` rows; otherwise random 32x32 images encoded as PNG, so decoding is always real.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

import datasets
from PIL import Image

import hscl_zoo
from hscl_zoo.data.catalog import DatasetSpec, get_spec
from hscl_zoo.data.datasets import load_split
from hscl_zoo.data.device_augment import BatchSimCLRAugment
from hscl_zoo.data.loaders import make_loader
from hscl_zoo.data.overlap import OverlappedViews
from hscl_zoo.data.raw_images import RawImageDataset
from hscl_zoo.data.transforms import simclr_transform
from hscl_zoo.data.views import MultiViewDataset
from hscl_zoo.losses.methods import LOSS_NAMES
from provenance import command_line, git_commit, utc_now  # benchmarks/, the script's own folder
from throughput_modes import NUM_CLASSES, augment_bench, loss_memory, sync  # its --augment-bench and --loss-memory

ROOT = Path(__file__).resolve().parents[1]

warnings.filterwarnings("ignore", message=".*pin_memory.*")
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "cifar10"


# ------------------------------------------------------------------------------------------ helpers


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_mib(device: torch.device) -> float | None:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return None


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def timed_window(step: Callable[[], None], device: torch.device, warmup: int, steps: int,
                 before: Callable[[], None] | None = None) -> float:
    """Seconds of ``steps`` calls after ``warmup`` calls (and ``before``, untimed), the device
    synchronised before the timer starts and after the last call only."""
    for _ in range(warmup):
        step()
    if before is not None:
        before()
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return time.perf_counter() - start


def prefetched(loader) -> int:
    """How many batches the loader's workers prepare ahead of the consumer."""
    return loader.num_workers * (loader.prefetch_factor or 0)


def cycle(loader) -> Iterator:
    epoch = 0
    while True:
        epoch += 1
        loader.set_epoch(epoch)
        if hasattr(loader.dataset, "set_epoch"):
            loader.dataset.set_epoch(epoch)
        yield from loader


def load_data(args: argparse.Namespace) -> tuple[datasets.Dataset, DatasetSpec, str]:
    spec = get_spec(args.dataset)
    data_dir = Path(args.data_dir) if args.data_dir else DEFAULT_DATA
    if data_dir.is_dir():
        train = load_split(args.dataset, spec.train_split, data_dir)
        rows = min(args.rows, len(train))
        return train.select(range(rows)), spec, f"{spec.name} train ({data_dir}), first {rows} rows"
    rng = np.random.default_rng(0)
    images = []
    for _ in range(args.rows):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buffer, format="PNG")
        images.append({"bytes": buffer.getvalue(), "path": None})
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=NUM_CLASSES)})
    table = datasets.Dataset.from_dict({"image": images, "label": (np.arange(args.rows) % NUM_CLASSES).tolist()}, features)
    return table, spec, f"synthetic: {args.rows} random 32x32 PNG images ({data_dir} not found)"


# ------------------------------------------------------------------------------------------ one configuration


class Config:
    def __init__(self, name: str, args: argparse.Namespace, fast: bool) -> None:
        on = lambda flag: fast and bool(getattr(args, flag))  # noqa: E731
        self.name = name
        self.channels_last = on("channels_last")
        self.compile = on("compile")
        self.compile_loss = on("compile_loss")
        self.fused_optim = on("fused_optim")
        self.gpu_augment = on("gpu_augment")
        self.bf16 = on("bf16")
        self.cache = on("cache")

    def label(self) -> str:
        opts = [k for k in ("channels_last", "compile", "compile_loss", "fused_optim", "gpu_augment", "bf16", "cache")
                if getattr(self, k)]
        return self.name + (f" ({', '.join(o.replace('_', '-') for o in opts)})" if opts else "")


def make_pipeline(cfg: Config, train: datasets.Dataset, spec: DatasetSpec, args: argparse.Namespace,
                  device: torch.device, overlap: bool = False) -> tuple[Callable[[], tuple[torch.Tensor, torch.Tensor]], Any]:
    """A callable giving the next (views (B*V, 3, S, S) on the device, labels) batch, and its loader.
    ``overlap``: the device views made one batch ahead on a side stream (the recipe's
    `hscl_zoo.data.overlap.OverlappedViews`), so that they are made while the step before runs."""
    pin = device.type == "cuda"
    memory_format = torch.channels_last if cfg.channels_last else torch.contiguous_format
    if cfg.gpu_augment:
        dataset = RawImageDataset(train, cache=cfg.cache)
        augment = BatchSimCLRAugment(32, mean=spec.mean, std=spec.std, views=args.views, seed=0).to(device)
    else:
        dataset = MultiViewDataset(train, simclr_transform(32, mean=spec.mean, std=spec.std), views=args.views)
        augment = None
    loader = make_loader(dataset, args.batch_size, seed=0, num_workers=args.workers, drop_last=True,
                         pin_memory=pin, persistent_workers=args.workers > 0)
    on_device = ((images.to(device, non_blocking=pin), labels.to(device, non_blocking=pin), index)
                 for images, labels, index in cycle(loader))
    ahead = iter(OverlappedViews(on_device, augment, device)) if overlap and augment is not None else None

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        if ahead is not None:
            views, labels, _ = next(ahead)
        else:
            images, labels, _ = next(on_device)
            views = augment(images) if augment is not None else images
        return views.flatten(0, 1).contiguous(memory_format=memory_format), labels

    return next_batch, loader


def make_step(cfg: Config, backbone: str, stem: str, loss_name: str, args: argparse.Namespace,
              device: torch.device) -> Callable[[torch.Tensor, torch.Tensor], None]:
    encoder = hscl_zoo.create_model(backbone, num_classes=NUM_CLASSES, image_size=32, small_stem=stem == "small")
    model = encoder.projection_network().to(device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-6, fused=cfg.fused_optim or None)
    loss_kwargs: dict[str, Any] = {"temperature": 0.5}
    if loss_name == "hscl-tau":
        loss_kwargs["threshold"] = -0.1
    loss_fn = hscl_zoo.build_loss(loss_name, **loss_kwargs)
    forward: Callable[[torch.Tensor], torch.Tensor] = torch.compile(model) if cfg.compile else model
    loss_call = torch.compile(loss_fn) if cfg.compile_loss else loss_fn
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if cfg.bf16 else nullcontext
    model.train()

    def step(views: torch.Tensor, labels: torch.Tensor) -> None:
        with autocast():
            z = forward(views).view(labels.shape[0], -1, 128)
            loss = loss_call(z, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def run_config(cfg: Config, backbone: str, stem: str, loss_name: str, train, spec, args, device) -> list[dict[str, Any]]:
    views_per_batch = args.batch_size * args.views
    rows: list[dict[str, Any]] = []
    base = {"backbone": backbone, "stem": stem, "loss": loss_name, "config": cfg.label()}

    def record(stage: str, seconds: float, extra: dict[str, Any] | None = None) -> None:
        per_step = seconds / args.steps
        rows.append({**base, "stage": stage, "img_per_s": views_per_batch / per_step, "ms_per_step": 1e3 * per_step,
                     "steps": args.steps, "peak_mib": peak_mib(device), **(extra or {})})

    def drain(next_batch: Callable[[], Any], loader) -> Callable[[], None]:
        return lambda: [next_batch() for _ in range(prefetched(loader))]

    # data only
    torch.manual_seed(0)
    next_batch, loader = make_pipeline(cfg, train, spec, args, device)
    reset_peak(device)
    record("data", timed_window(next_batch, device, args.warmup, args.steps, before=drain(next_batch, loader)))
    del loader, next_batch

    # compute only, on pre-made tensors
    step = make_step(cfg, backbone, stem, loss_name, args, device)
    gen = torch.Generator().manual_seed(0)
    views = torch.randn(views_per_batch, 3, 32, 32, generator=gen).to(device)
    if cfg.channels_last:
        views = views.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, NUM_CLASSES, (args.batch_size,), generator=gen).to(device)
    first = time.perf_counter()
    step(views, labels)  # first call: compilation when asked, allocator warm-up
    sync(device)
    first_s = time.perf_counter() - first
    reset_peak(device)
    record("compute", timed_window(lambda: step(views, labels), device, max(args.warmup - 1, 0), args.steps),
           {"first_step_s": first_s})

    # end to end, on a fresh pipeline whose queue did not fill while the compute stage ran
    torch.manual_seed(0)
    next_batch, loader = make_pipeline(cfg, train, spec, args, device)
    reset_peak(device)
    record("e2e", timed_window(lambda: step(*next_batch()), device, args.warmup, args.steps,
                               before=drain(next_batch, loader)))
    del loader, next_batch
    if args.overlap and cfg.gpu_augment:
        torch.manual_seed(0)
        next_batch, loader = make_pipeline(cfg, train, spec, args, device, overlap=True)
        reset_peak(device)
        record("e2e-overlap", timed_window(lambda: step(*next_batch()), device, args.warmup, args.steps,
                                           before=drain(next_batch, loader)))
        del loader, next_batch
    gc.collect()
    return rows


def print_throughput(rows: list[dict[str, Any]]) -> None:
    print("| backbone | stem | loss | config | stage | img/s | ms/step | peak MiB | vs plain |")
    print("|---|---|---|---|---|---:|---:|---:|---:|")
    plain = {(r["backbone"], r["stem"], r["loss"], r["stage"]): r["img_per_s"] for r in rows if r["config"] == "plain"}
    for r in rows:
        ref = plain.get((r["backbone"], r["stem"], r["loss"], r["stage"]))
        ratio = "-" if ref is None or r["config"] == "plain" else f"{r['img_per_s'] / ref:.2f}x"
        print(f"| {r['backbone']} | {r['stem']} | {r['loss']} | {r['config']} | {r['stage']} | {fmt(r['img_per_s'])} | "
              f"{fmt(r['ms_per_step'])} | {fmt(r['peak_mib'], 0)} | {ratio} |")
    firsts = [r for r in rows if r["stage"] == "compute" and "compile" in r["config"]]
    for r in firsts:
        print(f"\nfirst compute step (includes compilation) of {r['backbone']}/{r['stem']}/{r['loss']}/{r['config']}: "
              f"{r['first_step_s']:.1f} s")


# ------------------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backbones", nargs="+", default=["resnet18", "resnet50"])
    p.add_argument("--stems", nargs="+", default=["small"], choices=["small", "default"])
    p.add_argument("--losses", nargs="+", default=list(LOSS_NAMES), choices=list(LOSS_NAMES))
    p.add_argument("--batch-size", type=int, default=None,
                   help="images per step (views = batch x --views); default 512 on CUDA (smaller is launch-bound), 64 on CPU")
    p.add_argument("--views", type=int, default=2)
    p.add_argument("--steps", type=int, default=None, help="timed steps per stage, one window; default 50 on CUDA, 5 on CPU")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first; default 10 on CUDA, 2 on CPU")
    p.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 16))
    p.add_argument("--data-dir", default=None, help=f"the dataset's parquet folder (default {DEFAULT_DATA})")
    p.add_argument("--dataset", default="cifar10", choices=["cifar10", "cifar100"], help="what --data-dir holds")
    p.add_argument("--rows", type=int, default=4096, help="rows of the training split to use")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    for flag, text in [("channels-last", "model and inputs in channels_last"), ("compile", "torch.compile the model"),
                       ("compile-loss", "torch.compile the loss"), ("fused-optim", "Adam(fused=True)"),
                       ("gpu-augment", "raw uint8 loader + BatchSimCLRAugment on --device"),
                       ("bf16", "bf16 autocast (losses compute in float32)"),
                       ("cache", "with --gpu-augment: decode the rows once into a uint8 tensor")]:
        p.add_argument(f"--{flag}", action="store_true", help=text)
    p.add_argument("--no-plain", action="store_true", help="skip the plain configuration")
    p.add_argument("--overlap", action="store_true",
                   help="with --gpu-augment: also an e2e-overlap row, the views made one batch ahead on a side stream")
    p.add_argument("--augment-bench", action="store_true", help="time the augmentation alone: torch vs kornia vs CPU")
    p.add_argument("--repeats", type=int, default=5, help="repeats of --augment-bench")
    p.add_argument("--loss-memory", action="store_true", help="peak memory of loss forward+backward per N")
    p.add_argument("--memory-batches", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    p.add_argument("--json", default=None, help="also write the rows to this file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    for key, gpu, cpu in (("batch_size", 512, 64), ("steps", 50, 5), ("warmup", 10, 2)):
        if getattr(args, key) is None:
            setattr(args, key, gpu if on_gpu else cpu)
    if args.threads:
        torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"device: {device} ({name}); torch {torch.__version__}; {os.cpu_count()} CPU cores, "
          f"{torch.get_num_threads()} intra-op threads; load average {load}")
    command = command_line(__file__, argv)
    out: dict[str, Any] = {"command": command, "git_commit": git_commit(), "date": utc_now(), "device": str(device),
                           "device_name": name, "torch": torch.__version__, "load_before": load, "args": vars(args)}
    if args.loss_memory:
        out["loss_memory"] = loss_memory(args, device)
    else:
        train, spec, source = load_data(args)
        print(f"data: {source}; batch {args.batch_size} images x {args.views} views; workers {args.workers}; "
              f"one window of {args.steps} timed steps after {args.warmup} warm-up\n")
        if args.augment_bench:
            out["augment"] = augment_bench(train, spec, args, device)
        else:
            configs = [] if args.no_plain else [Config("plain", args, fast=False)]
            if any(getattr(args, k) for k in ("channels_last", "compile", "compile_loss", "fused_optim", "gpu_augment",
                                             "bf16", "cache")):
                configs.append(Config("fast", args, fast=True))
            rows = []
            for backbone in args.backbones:
                for stem in args.stems:
                    for loss_name in args.losses:
                        for cfg in configs:
                            rows += run_config(cfg, backbone, stem, loss_name, train, spec, args, device)
                            print(f"  done: {backbone}/{stem}/{loss_name}/{cfg.label()}", file=sys.stderr, flush=True)
            print_throughput(rows)
            out["rows"] = rows
    out["load_after"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"\nload average after: {out['load_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
