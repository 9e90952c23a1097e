"""The two side modes of `train_throughput.py` (its docstring says what each measures), and the
pieces its default mode shares with them:

* ``--augment-bench``: the augmentation alone, uint8 batch -> normalised views: the batched torch ops
  (hscl_zoo.data.device_augment), kornia.augmentation, and the CPU per-image pipeline;
* ``--loss-memory``: the peak memory of one loss forward + backward per number of views.

Run through ``python benchmarks/train_throughput.py --augment-bench`` / ``--loss-memory``.
"""

from __future__ import annotations

import ctypes
import gc
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import hscl_zoo
from hscl_zoo.data.catalog import DatasetSpec
from hscl_zoo.data.device_augment import BatchSimCLRAugment
from hscl_zoo.data.raw_images import RawImageDataset
from hscl_zoo.data.transforms import simclr_transform

NUM_CLASSES = 10
"""The classes of the benchmark's labels (CIFAR-10's, or the synthetic table's)."""


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------------------ augment-only mode


def kornia_pipeline(spec: DatasetSpec, kernel: int, device: torch.device) -> torch.nn.Module:
    import kornia.augmentation as K

    return torch.nn.Sequential(
        K.RandomResizedCrop((32, 32), scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)),
        K.RandomHorizontalFlip(p=0.5),
        K.ColorJitter(0.4, 0.4, 0.4, 0.1, p=0.8),
        K.RandomGrayscale(p=0.2),
        K.RandomGaussianBlur((kernel, kernel), (0.1, 2.0), p=0.5),
        K.Normalize(torch.tensor(spec.mean), torch.tensor(spec.std)),
    ).to(device)


def augment_bench(train, spec, args, device) -> list[dict[str, Any]]:
    try:
        import kornia
    except ImportError:
        kornia = None
        print("note: kornia is not installed (it is no dependency of hscl_zoo): its row is left out; "
              "`pip install kornia` to compare with it.\n")
    raw = RawImageDataset(train.select(range(min(len(train), args.batch_size))), cache=True)
    images = raw.images.to(device)
    ours = BatchSimCLRAugment(32, mean=spec.mean, std=spec.std, views=args.views).to(device)
    cpu_transform = simclr_transform(32, mean=spec.mean, std=spec.std)
    pil = [train[i]["image"] for i in range(min(len(train), args.batch_size))]
    n_views = images.shape[0] * args.views

    def cpu_call() -> None:
        for image in pil:
            for _ in range(args.views):
                cpu_transform(image)

    methods = {"torch (hscl_zoo.data.device_augment)": lambda: ours(images)}
    if kornia is not None:
        theirs = kornia_pipeline(spec, ours.blur_kernel, device)
        methods[f"kornia {kornia.__version__}"] = lambda: theirs(images.float().div_(255).repeat_interleave(args.views, dim=0))
    methods["CPU per-image pipeline, 1 process"] = cpu_call
    times: dict[str, list[float]] = {name: [] for name in methods}
    for fn in methods.values():  # warm-up
        fn()
    sync(device)
    names = list(methods)
    for r in range(args.repeats):  # rotating order: drifts of a shared machine hit all alike
        for name in names[r % len(names):] + names[: r % len(names)]:
            start = time.perf_counter()
            methods[name]()
            sync(device)
            times[name].append(time.perf_counter() - start)
    ref = statistics.median(times[names[0]])
    rows = []
    print(f"| augmentation ({images.shape[0]} images x {args.views} views, 32x32, {device}) | ms/batch | views/s | time vs torch |")
    print("|---|---:|---:|---:|")
    for name in names:
        med = statistics.median(times[name])
        rows.append({"method": name, "ms_per_batch": 1e3 * med, "views_per_s": n_views / med, "ratio": med / ref})
        print(f"| {name} | {1e3 * med:,.1f} | {n_views / med:,.0f} | {med / ref:.2f}x |")
    return rows


# ------------------------------------------------------------------------------------------ loss-memory mode


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def memory_subject(name: str, N: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A loss by name, or a reference: "calibration" keeps exactly one N x N float32 matrix alive
    while it returns (the measurement should read 1.00), "floor" is one similarity matmul plus one
    logsumexp (the least any of these losses must hold)."""
    if name == "calibration":
        def one_matrix(features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            n = features.shape[0] * features.shape[1]
            block = torch.ones(n, n, device=features.device)  # written, so resident
            return features.sum() * block[-1, -1]
        return one_matrix
    if name == "floor":
        def floor(features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            flat = torch.nn.functional.normalize(features.reshape(-1, features.shape[-1]), dim=-1)
            return torch.logsumexp(flat @ flat.T / 0.5, dim=1).mean()
        return floor
    kwargs: dict[str, Any] = {"temperature": 0.5}
    if name == "hscl-tau":
        kwargs["threshold"] = -0.1
    return hscl_zoo.build_loss(name, **kwargs)


def loss_memory(args, device) -> list[dict[str, Any]]:
    if device.type == "cpu":
        if platform.system() != "Linux":
            raise SystemExit("--loss-memory on CPU reads /proc/self (Linux only); run it on CUDA elsewhere.")
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD: big blocks are mmapped and returned on free
    rows = []
    print(f"| loss | N (views) | peak MiB | in N x N float32 | fwd+bwd ms | measured by ({device}) |")
    print("|---|---:|---:|---:|---:|---|")
    for B in args.memory_batches:
        N = B * 2
        gen = torch.Generator().manual_seed(0)
        base_features = torch.randn(B, 2, 128, generator=gen)
        labels = torch.randint(0, NUM_CLASSES, (B,), generator=gen).to(device)
        for name in ["calibration", "floor", *args.losses]:
            loss_fn = memory_subject(name, N)
            features = base_features.to(device).requires_grad_(True)
            small = torch.randn(8, 2, 128, device=device, requires_grad=True)
            loss_fn(small, labels[:8]).backward()  # load kernels before measuring
            gc.collect()
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            else:
                Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current VmRSS
                before = _status_kib("VmRSS") * 1024
            start = time.perf_counter()
            loss_fn(features, labels).backward()
            sync(device)
            seconds = time.perf_counter() - start
            if device.type == "cuda":
                peak = torch.cuda.max_memory_allocated() - before
                how = "max_memory_allocated"
            else:
                peak = _status_kib("VmHWM") * 1024 - before
                how = "peak RSS growth"
            units = peak / (4 * N * N)
            rows.append({"loss": name, "N": N, "peak_mib": peak / 2**20, "nxn_float32": units, "ms": 1e3 * seconds})
            print(f"| {name} | {N} | {peak / 2**20:,.0f} | {units:.2f} | {1e3 * seconds:,.0f} | {how} |", flush=True)
            del features, loss_fn
            gc.collect()
    return rows
