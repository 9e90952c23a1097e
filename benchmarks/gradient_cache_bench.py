"""Peak memory and time of one gradient computation: the gradient cache against the direct one.

One step's gradient (zero_grad, forward, loss, backward; the optimiser step is the same for both
and left out) on --images images x --views views of a timm backbone with the projection head:

* direct: every view encoded in one graph, the loss, backward (what pretraining does today);
* cache:  ``hscl_zoo.gradient_cache_backward`` with chunks of --chunk-size images (each with its views).

Memory: on CUDA, torch.cuda.max_memory_allocated above the allocation before the step; on the
CPU, the growth of the process's peak resident set (VmHWM, reset through /proc/self/clear_refs)
over the resident set before the step, with glibc told to mmap every block over 64 KiB so that
freed activations leave the resident set (as ``train_throughput.py --loss-memory``). Before
measuring, one small step of each mode allocates the gradients and loads the kernels. The model
is in training mode: BatchNorm normalises per chunk under the cache (see hscl_zoo.training.gradient_cache).
Time: wall clock and, as the CPU here is shared, the process's CPU time (on a loaded host run with
--threads 1: idle OpenMP threads spin and inflate both).

    python benchmarks/gradient_cache_bench.py --threads 1      # CPU: 2048 images x 2 views, chunks of 128 images
    python benchmarks/gradient_cache_bench.py --device cuda --images 4096 --steps 5

Writes benchmarks/results/gradient_cache_<machine>.json unless --json says otherwise.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import re
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import hscl_zoo
from provenance import command_line, git_commit, utc_now  # benchmarks/, the script's own folder

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("direct", "cache")


def machine_name(device: torch.device) -> str:
    """The CPU model and core count, or the GPU's name: what the numbers were measured on."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), flags=re.MULTILINE)
        model = names[0].strip() if names else model
    return f"{model}, {os.cpu_count()} cores"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


class PeakMemory:
    """Bytes of peak memory growth over the start of a ``with`` block, on CUDA or a Linux CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.how = "max_memory_allocated" if device.type == "cuda" else "peak RSS growth (VmHWM)"
        self.bytes = 0

    def __enter__(self) -> PeakMemory:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._before = torch.cuda.memory_allocated(self.device)
        else:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
            self._before = status_kib("VmRSS") * 1024
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.bytes = torch.cuda.max_memory_allocated(self.device) - self._before
        else:
            self.bytes = status_kib("VmHWM") * 1024 - self._before


def gradient_step(mode: str, model: nn.Module, loss_fn: nn.Module, views: torch.Tensor, labels: torch.Tensor,
                  chunk_size: int) -> float:
    """One step's gradient by ``mode``; returns the loss."""
    model.zero_grad(set_to_none=False)
    if mode == "cache":
        return hscl_zoo.gradient_cache_backward(model, loss_fn, views, labels, chunk_size=chunk_size).item()
    B, V = views.shape[:2]
    loss = loss_fn(model(views.flatten(0, 1)).view(B, V, -1), labels)
    loss.backward()
    return loss.item()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--images", type=int, default=2048, help="images per step (embeddings = images x views)")
    p.add_argument("--views", type=int, default=2)
    p.add_argument("--chunk-size", type=int, default=128,
                   help="images encoded at once by the cache, each with its --views views (as recipes count chunk_size)")
    p.add_argument("--backbone", default="resnet18")
    p.add_argument("--stem", choices=["default", "small"], default="default",
                   help="timm's stem, or the CIFAR stem (3x3 conv, no max-pool: 16x the activations at 32 px)")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--loss", default="hscl-beta", choices=list(hscl_zoo.LOSS_NAMES))
    p.add_argument("--steps", type=int, default=1, help="measured steps per mode (median time, max memory)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--json", default=None, help="output file (default benchmarks/results/gradient_cache_<machine>.json)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    command = command_line(__file__, argv)
    commit = git_commit()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cpu":
        if platform.system() != "Linux":
            raise SystemExit("CPU memory is read from /proc/self (Linux only); run with --device cuda elsewhere.")
        ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD
    machine = machine_name(device)
    torch.manual_seed(0)
    encoder = hscl_zoo.create_model(args.backbone, num_classes=10, image_size=args.image_size,
                                    small_stem=args.stem == "small")
    model = nn.Sequential(encoder.backbone, encoder.projector).to(device).train()
    loss_fn = hscl_zoo.build_loss(args.loss)
    views = torch.randn(args.images, args.views, 3, args.image_size, args.image_size, device=device)
    labels = torch.randint(0, 10, (args.images,), device=device)
    warm = min(args.images, 2 * args.chunk_size)
    for mode in MODES:
        gradient_step(mode, model, loss_fn, views[:warm], labels[:warm], args.chunk_size)

    n = args.images * args.views
    load = os.getloadavg()
    print(f"{machine}; torch {torch.__version__}, {torch.get_num_threads()} threads; load average {load}")
    print(f"{args.backbone} ({args.stem} stem, {args.image_size} px), {args.loss}: {args.images} images x "
          f"{args.views} views = {n} embeddings; cache chunks of {args.chunk_size} images\n")
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu_times: dict[str, list[float]] = {mode: [] for mode in MODES}
    peaks: dict[str, list[int]] = {mode: [] for mode in MODES}
    losses: dict[str, float] = {}
    meter = PeakMemory(device)
    for _ in range(args.steps):
        for mode in MODES:
            with meter:
                start, cpu_start = time.perf_counter(), time.process_time()
                losses[mode] = gradient_step(mode, model, loss_fn, views, labels, args.chunk_size)
                times[mode].append(time.perf_counter() - start)
                cpu_times[mode].append(time.process_time() - cpu_start)
            peaks[mode].append(meter.bytes)
    rows = []
    print(f"| mode | embeddings | chunk | peak MiB ({meter.how}) | step s (wall) | step s (process CPU) "
          "| memory vs direct | CPU time vs direct |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for mode in MODES:
        peak, seconds, cpu = max(peaks[mode]), statistics.median(times[mode]), statistics.median(cpu_times[mode])
        row = {"mode": mode, "embeddings": n, "chunk_size": args.chunk_size if mode == "cache" else None,
               "peak_mib": peak / 2**20, "step_s": seconds, "step_cpu_s": cpu,
               "memory_ratio": peak / max(peaks["direct"]), "cpu_time_ratio": cpu / statistics.median(cpu_times["direct"]),
               "wall_time_ratio": seconds / statistics.median(times["direct"]), "loss": losses[mode],
               "all_step_s": times[mode], "all_step_cpu_s": cpu_times[mode]}
        rows.append(row)
        print(f"| {mode} | {n} | {row['chunk_size'] or '-'} | {row['peak_mib']:,.0f} | {seconds:,.1f} | {cpu:,.1f} | "
              f"{row['memory_ratio']:.3f} | {row['cpu_time_ratio']:.2f}x |")
    out = {"command": command, "commit": commit, "finished": utc_now(), "machine": machine, "device": str(device),
           "torch": torch.__version__, "threads": torch.get_num_threads(), "memory_measured_by": meter.how, "load_before": load, "load_after": os.getloadavg(),
           "args": vars(args), "rows": rows}
    print(f"\nload average after: {out['load_after']}")
    path = Path(args.json) if args.json else RESULTS / f"gradient_cache_{slug(machine)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
