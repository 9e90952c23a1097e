"""Time and peak memory of the drop-in losses (hscl_zoo.losses.compat) against the losses they replace.

Three pairs, forward + backward on the same input (B images, V = 2 views, d dims, labels from
`--classes` classes, float32, one thread by default):

* `SupConLoss` (method scl) against pytorch-metric-learning's `SupConLoss`, the library's
  adaptation of SupContrast's loss (SupContrast is a script, not a package), on the 2B views
  with each image's label;
* `NTXentLoss` (method ucl) against lightly's NT-Xent written out from lightly's documented
  formula as one vectorised cross-entropy (lightly itself is not installed: it pulls
  pytorch-lightning and hydra); it is checked equal to ours before timing;
* `MetricLearningLoss` (method scl) against pytorch-metric-learning's `NTXentLoss` on the 2B
  views labelled by image (its documented self-supervised use; the two then agree exactly).
  pml's `NTXentLoss` builds a (positive pairs x negative pairs) matrix, 2B x 2B(2B - 2) floats:
  67 MB at B = 128, 4.3 GB at B = 512 (and 1.5 GB already at B = 128 with 10 classes), several
  copies of it through backward; above `--pml-ntxent-max-batch` (128) it is not run, and the
  JSON records the size of that matrix instead.

Timing follows benchmarks/loss_bench.py: each repeat runs every method once in rotating order; a
rerun gives per-method medians and, from them, per-rerun ratios ours / reference; the JSON
reports the median over reruns of both. Memory is the growth of the process's peak resident set
(VmHWM, reset through /proc/self/clear_refs) over one call, with glibc's mmap threshold pinned at
64 KiB so that freed tensors leave the resident set (as benchmarks/gradient_cache_bench.py); the
largest of `--memory-calls` calls per rerun, then the median over reruns.

    python benchmarks/dropin_losses.py --json benchmarks/results/dropin_losses_cpu.json
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from gradient_cache_bench import PeakMemory  # benchmarks/, the script's own folder
from provenance import command_line, git_commit, machine, utc_now
from pytorch_metric_learning import losses as pml

from hscl_zoo import MetricLearningLoss, NTXentLoss, SupConLoss

Call = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""One loss call on (B, 2, d) features and (B,) labels, in the library's own signature."""


def lightly_formula(temperature: float) -> Call:
    """lightly's NT-Xent from its documented formula: the 2B normalised outputs, each one's
    cross-entropy of its other view against every output but itself, averaged."""

    def fn(features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        B = features.shape[0]
        z = F.normalize(torch.cat([features[:, 0], features[:, 1]]), dim=1)
        logits = (z @ z.T / temperature).fill_diagonal_(-float("inf"))
        target = torch.arange(2 * B, device=z.device).roll(B)
        return F.cross_entropy(logits, target)

    return fn


def pml_call(loss: torch.nn.Module, by_image: bool = False) -> Call:
    """The loss on the 2B views, labelled by the image's class, or by the image itself."""

    def fn(features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        labels = torch.arange(features.shape[0]) if by_image else labels
        return loss(torch.cat([features[:, 0], features[:, 1]]), labels.repeat(2))

    return fn


PML_NTXENT = "MetricLearningLoss vs pml NTXentLoss"


def pml_ntxent_matrix_bytes(B: int) -> int:
    """Bytes of pml NTXentLoss's (positive pairs x negative pairs) float32 matrix, views labelled by image."""
    n = 2 * B
    return n * n * (n - 2) * 4


def pairs(args: argparse.Namespace) -> dict[str, tuple[Call, Call]]:
    """Name -> (ours, reference), each a call in the library's own signature."""
    t = args.temperature
    ntxent = NTXentLoss(temperature=t)
    metric = MetricLearningLoss(temperature=t, method="scl")
    return {
        "SupConLoss vs pml SupConLoss": (SupConLoss(temperature=t), pml_call(pml.SupConLoss(temperature=t))),
        "NTXentLoss vs lightly formula": (lambda f, y: ntxent(f[:, 0], f[:, 1]), lightly_formula(t)),
        PML_NTXENT: (pml_call(metric, by_image=True), pml_call(pml.NTXentLoss(temperature=t), by_image=True)),
    }


def make_inputs(B: int, args: argparse.Namespace, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    features = F.normalize(torch.randn(B, 2, args.dim, generator=gen, dtype=dtype), dim=-1)
    return features, torch.randint(0, args.classes, (B,), generator=gen)


def check_ntxent(args: argparse.Namespace) -> str:
    """float64: our NTXentLoss equals the lightly formula in value and gradient, or the bench stops."""
    features, labels = make_inputs(16, args, torch.float64, seed=0)
    ours, theirs = pairs(args)["NTXentLoss vs lightly formula"]
    results = []
    for fn in (ours, theirs):
        x = features.clone().requires_grad_()
        value = fn(x, labels)
        value.backward()
        results.append((value.item(), x.grad))
    value_err, grad_err = abs(results[0][0] - results[1][0]), (results[0][1] - results[1][1]).abs().max().item()
    if value_err > 1e-10 or grad_err > 1e-12:
        raise SystemExit(f"NTXentLoss disagrees with the lightly formula: |dloss|={value_err:.3g}, max|dgrad|={grad_err:.3g}")
    return f"B=16 float64: NTXentLoss = lightly formula = {results[0][0]:.12f}, max |grad diff| = {grad_err:.1e}"


def step(fn: Call, features: torch.Tensor, labels: torch.Tensor) -> float:
    features.grad = None
    start = time.perf_counter()
    fn(features, labels).backward()
    return time.perf_counter() - start


def bench_cell(calls: dict[str, Call], B: int, args: argparse.Namespace) -> dict[str, Any]:
    """One rerun at one B: every call's median time and largest peak-memory growth."""
    features, labels = make_inputs(B, args, torch.float32, seed=B)
    features.requires_grad_()
    names = list(calls)
    for name in names:
        for _ in range(args.warmup):
            step(calls[name], features, labels)
    meter = PeakMemory(torch.device("cpu"))
    memory = {}
    for name in names:
        peaks = []
        for _ in range(args.memory_calls):
            with meter:
                step(calls[name], features, labels)
            peaks.append(meter.bytes)
        memory[name] = max(peaks)
    times: dict[str, list[float]] = {name: [] for name in names}
    gc.collect()
    gc.disable()
    try:
        for r in range(args.repeats):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                times[name].append(step(calls[name], features, labels))
    finally:
        gc.enable()
    return dict(median_s={n: statistics.median(ts) for n, ts in times.items()}, peak_bytes=memory,
                times_s={n: [round(t, 7) for t in ts] for n, ts in times.items()})


def summarise(cells: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    """Per (pair, B): medians over reruns of ours and the reference, and of the per-rerun ratios."""
    rows = []
    for name in names:
        for B in sorted({c["B"] for c in cells}):
            runs = [c for c in cells if c["B"] == B]
            ours, ref = f"{name}: ours", f"{name}: reference"
            row: dict[str, Any] = dict(pair=name, B=B, reruns=len(runs))
            if ref not in runs[0]["median_s"]:
                row.update(ours_ms=statistics.median(r["median_s"][ours] for r in runs) * 1e3,
                           ours_peak_mib=statistics.median(r["peak_bytes"][ours] for r in runs) * 2**-20,
                           reference_skipped=f"not run: its pair matrix alone is {pml_ntxent_matrix_bytes(B) / 1e9:.1f} GB")
                rows.append(row)
                continue
            for key, measure, scale in (("ms", "median_s", 1e3), ("peak_mib", "peak_bytes", 2**-20)):
                row[f"ours_{key}"] = statistics.median(r[measure][ours] for r in runs) * scale
                row[f"reference_{key}"] = statistics.median(r[measure][ref] for r in runs) * scale
            time_ratios = [r["median_s"][ours] / r["median_s"][ref] for r in runs]
            memory_ratios = [r["peak_bytes"][ours] / r["peak_bytes"][ref] for r in runs if r["peak_bytes"][ref] > 0]
            row["time_ratio"] = dict(median=statistics.median(time_ratios), min=min(time_ratios), max=max(time_ratios))
            row["memory_ratio"] = dict(median=statistics.median(memory_ratios), min=min(memory_ratios),
                                       max=max(memory_ratios)) if memory_ratios else None
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| pair | B | ours ms | reference ms | time ours / ref | ours MiB | reference MiB | memory ours / ref |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "reference_skipped" in r:
            lines.append(f"| {r['pair']} | {r['B']} | {r['ours_ms']:.2f} | {r['reference_skipped']} | - | "
                         f"{r['ours_peak_mib']:.1f} | - | - |")
            continue
        t, m = r["time_ratio"], r["memory_ratio"] or dict(median=float("nan"), min=float("nan"), max=float("nan"))
        lines.append(f"| {r['pair']} | {r['B']} | {r['ours_ms']:.2f} | {r['reference_ms']:.2f} | "
                     f"{t['median']:.2f}x ({t['min']:.2f}-{t['max']:.2f}) | {r['ours_peak_mib']:.1f} | "
                     f"{r['reference_peak_mib']:.1f} | {m['median']:.2f}x ({m['min']:.2f}-{m['max']:.2f}) |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch-sizes", default="128,512", help="comma-separated B (images; 2B embeddings)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--temperature", type=float, default=0.5)
    p.add_argument("--reruns", type=int, default=3)
    p.add_argument("--repeats", type=int, default=20, help="timed rotations of every call per cell and rerun")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--memory-calls", type=int, default=3, help="calls measured for peak memory per cell and rerun")
    p.add_argument("--pml-ntxent-max-batch", type=int, default=128,
                   help="largest B at which pml's NTXentLoss runs (it allocates 32 B^3 bytes and more)")
    p.add_argument("--json", type=Path, default=None, help="write the machine, settings and every measurement here")
    args = p.parse_args(argv)
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if min(args.reruns, args.repeats, args.memory_calls, args.threads) < 1:
        raise SystemExit("--reruns, --repeats, --memory-calls and --threads must be at least 1.")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if platform.system() != "Linux":
        raise SystemExit("memory is read from /proc/self (Linux only).")
    ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD
    torch.set_num_threads(args.threads)
    command = command_line(__file__, argv)
    commit = git_commit()
    info = machine("cpu")
    print(f"command: {command}\nmachine: {info}")
    agreement = check_ntxent(args)
    print(agreement)
    table = pairs(args)
    calls = {f"{name}: {side}": fn for name, both in table.items() for side, fn in zip(("ours", "reference"), both)}
    cells = []
    for rerun in range(args.reruns):
        for B in args.batch_sizes:
            load_before = os.getloadavg()[0]
            skipped = B > args.pml_ntxent_max_batch
            cell = bench_cell({n: fn for n, fn in calls.items() if not (skipped and n == f"{PML_NTXENT}: reference")},
                              B, args)
            cells.append(dict(rerun=rerun, B=B, load=[load_before, os.getloadavg()[0]], **cell))
            print(f"  rerun {rerun + 1}/{args.reruns}: B={B} (1-min load {load_before:.2f} -> {cells[-1]['load'][1]:.2f})",
                  flush=True)
    rows = summarise(cells, list(table))
    print("\n" + markdown(rows))
    print(f"\nforward + backward, V=2, d={args.dim}, {args.classes} classes, T={args.temperature}, float32, "
          f"{args.threads} thread(s); medians over {args.reruns} reruns (ratios per rerun, min-max); memory: peak RSS "
          "growth (VmHWM) over one call.")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(dict(
            command=command, git_commit=commit, date=utc_now(), machine=info, threads=args.threads,
            batch_sizes=args.batch_sizes, views=2, dim=args.dim, classes=args.classes, temperature=args.temperature,
            reruns=args.reruns, repeats=args.repeats, warmup=args.warmup, memory_calls=args.memory_calls,
            pml_ntxent_max_batch=args.pml_ntxent_max_batch,
            memory_measured_by="peak RSS growth (VmHWM) over one call, M_MMAP_THRESHOLD = 64 KiB",
            agreement=agreement, rows=rows, cells=cells,
        ), indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
