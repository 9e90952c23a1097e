"""Where a training step's time goes: the device data path against the step, measured and profiled.

The recipe's own parts on one device (issue 58): the training split resident there
(`hscl_zoo.data.resident.ResidentBatches`), views made by `BatchSimCLRAugment` with its generator on
the device, and the step of `hscl_zoo.training.epochs.train_step` (model, loss with its per-call
checks off, fused Adam on CUDA). In one run, interleaved so that a drifting clock hits all alike,
for eager and (``--compile``) compiled model and augmentation:

* ``data``: gather and views alone;
* ``compute``: the step alone, on views made once beforehand;
* ``e2e``: gather, views and step, as an epoch runs them.

Each is views per second (every view counted) over ``--steps`` steps after ``--warmup``, the
median of ``--reruns`` windows. Then torch.profiler records ``--profile-steps`` end-to-end steps,
each phase under its own label; the summary keeps each phase's share and the top operators by
self time on the device (the CPU's when the device is the CPU). On CUDA the host
synchronisations inside those steps are counted (torch's sync debug mode). Everything lands in
one JSON (``--json``, under benchmarks/results/), with the commit and the machine.

    python benchmarks/data_path_profile.py --device cuda --data-dir DIR --bf16 --channels-last --compile \\
        --json benchmarks/results/h200_data_path.json
    python benchmarks/data_path_profile.py --device cpu --dataset digits --backbone resnet10t --batch-size 32 \\
        --steps 2 --warmup 1 --reruns 1 --profile-steps 2 --json /tmp/profile.json    # the rehearsal
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from hscl_zoo.data.datasets import load_splits
from hscl_zoo.data.device_augment import BatchSimCLRAugment
from hscl_zoo.data.raw_images import RawImageDataset
from hscl_zoo.data.resident import ResidentBatches
from hscl_zoo.data.transforms import simclr_transform
from hscl_zoo.losses.methods import build_loss
from hscl_zoo.models import create_model
from hscl_zoo.training import PretrainConfig
from hscl_zoo.training.epochs import train_step
from hscl_zoo.training.setup import build_optimizer
from hscl_zoo.training.state import RunState, TrainingParts
from provenance import command_line, git_commit, machine, utc_now  # benchmarks/, the script's own folder

PHASES = ("data:gather", "data:views", "step")


class Bench:
    """One configuration's parts (eager or compiled) over the resident split."""

    def __init__(self, args: argparse.Namespace, images: torch.Tensor, labels: torch.Tensor, mean, std,
                 compiled: bool) -> None:
        self.device = torch.device(args.device)
        self.cfg = PretrainConfig(method=args.loss, backbone=args.backbone, batch_size=args.batch_size,
                                  mixed_precision="bf16" if args.bf16 else "no")
        self.batches = ResidentBatches(images, labels, args.batch_size, device=self.device, seed=0)
        self.augment = BatchSimCLRAugment.from_transform(
            simclr_transform(images.shape[-1], mean=mean, std=std), seed=0, generator_device=self.device).to(self.device)
        model = create_model(args.backbone, num_classes=int(labels.max()) + 1, image_size=images.shape[-1],
                             small_stem=True, mean=mean, std=std).projection_network().to(self.device)
        if args.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        self.optimizer = build_optimizer(self.cfg, model.parameters(), fused=self.device.type == "cuda")
        self.loss_fn = build_loss(args.loss)
        self.loss_fn.equal_batches, self.loss_fn.labelled_only, self.loss_fn.check_finite = True, True, False
        self.forward: Callable = model
        if compiled:
            self.forward = torch.compile(model, mode=args.compile_mode)
            self.augment.compile_kernels(mode=args.compile_mode)
        parts = TrainingParts(None, model, None, self.augment, self.batches, self.forward, self.optimizer, self.loss_fn,
                              {"channels_last": args.channels_last})
        self.run = RunState(self.cfg, _NoAccelerator, parts)  # type: ignore[arg-type]
        self.autocast = (lambda: torch.autocast(self.device.type, dtype=torch.bfloat16)) if args.bf16 else contextlib.nullcontext
        self.batches.set_epoch(1)
        self.augment.set_epoch(1)
        self._rows = iter(())

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch's uint8 images and labels (a new epoch's order when one ends)."""
        try:
            images, labels, _ = next(self._rows)
        except StopIteration:
            self._rows = iter(self.batches)
            images, labels, _ = next(self._rows)
        return images, labels

    def views(self) -> tuple[torch.Tensor, torch.Tensor]:
        with record_function("data:gather"):
            images, labels = self.batch()
        with record_function("data:views"):
            return self.augment(images), labels

    def step(self, views: torch.Tensor, labels: torch.Tensor) -> None:
        with record_function("step"), self.autocast():
            train_step(self.run, views, labels)


class _NoAccelerator:
    """`train_step` needs only the accelerator's backward: one process, no scaler."""

    @staticmethod
    def backward(loss: torch.Tensor) -> None:
        loss.backward()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rate(bench: Bench, stage: str, steps: int, fixed: tuple[torch.Tensor, torch.Tensor]) -> float:
    """Views per second of `stage` over `steps` steps (timed from a synchronised start to a synchronised end)."""
    views_per_step = fixed[0].shape[0] * fixed[0].shape[1]
    sync(bench.device)
    started = time.perf_counter()
    for _ in range(steps):
        if stage == "data":
            bench.views()
        elif stage == "compute":
            bench.step(*fixed)
        else:
            bench.step(*bench.views())
    sync(bench.device)
    return views_per_step * steps / (time.perf_counter() - started)


def profile_steps(bench: Bench, steps: int) -> dict[str, Any]:
    """torch.profiler over `steps` end-to-end steps: each phase's share, the top operators, and (on
    CUDA) the host synchronisations counted by torch's sync debug mode."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if bench.device.type == "cuda" else [])
    syncs = 0
    sync(bench.device)
    with warnings.catch_warnings(record=True) as caught, profile(activities=activities) as prof:
        warnings.simplefilter("always")
        if bench.device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                bench.step(*bench.views())
        finally:
            if bench.device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
        sync(bench.device)
    syncs = sum("synchroniz" in str(w.message).lower() for w in caught)
    on_device = bench.device.type == "cuda"
    events = prof.key_averages()
    total = lambda e: (e.device_time_total if on_device else e.cpu_time_total)  # noqa: E731
    own = lambda e: (e.self_device_time_total if on_device else e.self_cpu_time_total)  # noqa: E731
    phases = {e.key: total(e) / 1e3 / steps for e in events if e.key in PHASES}
    top = sorted((e for e in events if e.key not in PHASES), key=own, reverse=True)[:15]
    return {
        "steps": steps, "time": "device" if on_device else "cpu",
        "ms_per_step": {phase: round(phases.get(phase, 0.0), 3) for phase in PHASES},
        "top_ops": [{"op": e.key, "self_ms_per_step": round(own(e) / 1e3 / steps, 3), "calls_per_step": e.count / steps}
                    for e in top],
        "host_syncs": syncs if on_device else None,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    data = load_splits(args.dataset, args.data_dir, subset=args.rows, seed=0)
    raw = RawImageDataset(data.train, cache=True)
    labels = torch.from_numpy(raw.labels)
    results: dict[str, Any] = {"configurations": {}}
    for compiled in (False, True) if args.compile else (False,):
        name = "compiled" if compiled else "eager"
        bench = Bench(args, raw.images, labels, data.spec.mean, data.spec.std, compiled)
        started = time.perf_counter()
        for _ in range(args.warmup):
            bench.step(*bench.views())
        warmup_seconds = time.perf_counter() - started
        fixed = bench.views()
        windows: dict[str, list[float]] = {"data": [], "compute": [], "e2e": []}
        for _ in range(args.reruns):
            for stage in windows:
                windows[stage].append(rate(bench, stage, args.steps, fixed))
        median = {stage: statistics.median(values) for stage, values in windows.items()}
        results["configurations"][name] = {
            "views_per_second": {stage: round(value, 1) for stage, value in median.items()},
            "windows": {stage: [round(v, 1) for v in values] for stage, values in windows.items()},
            "e2e_over_compute": round(median["e2e"] / median["compute"], 3),
            "warmup_seconds": round(warmup_seconds, 2),
            "profile": profile_steps(bench, args.profile_steps),
        }
        print(f"{name}: data {median['data']:,.0f}  compute {median['compute']:,.0f}  e2e {median['e2e']:,.0f} views/s "
              f"(e2e {median['e2e'] / median['compute']:.2f}x compute)", flush=True)
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dataset", default="cifar100", help="a dataset name of the catalogue (digits needs no files)")
    p.add_argument("--data-dir", default=None, help="its parquet folder (the Hub's layout)")
    p.add_argument("--rows", type=int, default=None, help="training images kept resident (default: all)")
    p.add_argument("--backbone", default="resnet18")
    p.add_argument("--loss", default="hscl-beta")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--steps", type=int, default=50, help="steps per timed window")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--reruns", type=int, default=3, help="timed windows per stage; the median is reported")
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true", help="also measure the compiled model and augmentation")
    p.add_argument("--compile-mode", default="default", choices=("default", "reduce-overhead", "max-autotune"))
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args(argv)
    for key in ("batch_size", "steps", "warmup", "reruns", "profile_steps"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.backends.cudnn.benchmark = True
    results = {"command": command_line(__file__, argv), "commit": git_commit(), "measured": utc_now(),
               "machine": machine(args.device), "settings": {k: v for k, v in vars(args).items() if k != "json"},
               **measure(args)}
    results["settings"]["data_dir"] = str(args.data_dir) if args.data_dir else None
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
