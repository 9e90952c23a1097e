"""Forward + backward time of the five losses against three baselines; prints one markdown table.

For each thread count and batch size B (V views, d dims, random features, labels from
`--classes` classes) it times, forward + backward on the same input:

* our five losses, `hscl_zoo.build_loss(name)` with default settings;
* (a) the plain-loop reference of the tests, `hscl_zoo.losses.reference.reference_loss`, as
  H-SCL(beta) -- very slow, so only up to `--reference-max-batch` and with
  `--reference-repeats` repeats ("-" in the table elsewhere);
* (b) `benchmarks/official_style.official_style_hscl_beta`, a transcription of the official
  script's approach (Python loop over rows for the masks, exp-space arithmetic, indexed assignment);
* (c) the floor: the bare similarity matmul plus one logsumexp, forward + backward.

The features are random unit vectors (each loss still normalises them, as it must).

Before timing it checks, in float64, that (b) and (a) give our H-SCL(beta) value and gradient.
Each repeat runs every method once, in rotating order, so slow drifts of a shared machine hit
all of them alike; the table gives medians in milliseconds and ratios of those medians, all from
the same run.

    python benchmarks/loss_bench.py                          # CPU, 1 and 2 threads
    python benchmarks/loss_bench.py --device cuda --json gpu.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import torch
from official_style import official_style_hscl_beta  # benchmarks/, the script's own folder

from hscl_zoo import LOSS_NAMES, METHODS, build_loss
from hscl_zoo.losses.reference import exp_tilt, reference_loss

warnings.filterwarnings("ignore", message="Converting a tensor with requires_grad=True to a scalar")

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def floor_loss(temperature: float) -> LossFn:
    """(c): similarity matmul and one row logsumexp -- the least any of these losses must do."""

    def fn(features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        flat = features.reshape(-1, features.shape[-1])
        return torch.logsumexp(flat @ flat.T / temperature, dim=1).mean()

    return fn


def methods(args: argparse.Namespace) -> dict[str, LossFn]:
    table: dict[str, LossFn] = {"floor": floor_loss(args.temperature)}
    for name in LOSS_NAMES:
        kwargs = {"temperature": args.temperature}
        if any(h.name == "beta" for h in METHODS[name].hyperparameters):
            kwargs["beta"] = args.beta
        table[name] = build_loss(name, **kwargs)
    table["official-style"] = lambda f, y: official_style_hscl_beta(f, y, args.temperature, args.beta)
    table["loop-reference"] = lambda f, y: reference_loss(
        f, y, method="hscl-beta", positives="labels", temperature=args.temperature, eta=exp_tilt(args.beta)
    )
    return table


def make_inputs(B: int, args: argparse.Namespace, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    # Unit vectors, as a projection head's normalised output: the logits then lie in
    # [-1/temperature, 1/temperature] as inside the losses (raw Gaussian features would give the
    # floor logits of size ~d/temperature, whose exps underflow into slow float32 denormals).
    features = torch.nn.functional.normalize(torch.randn(B, args.views, args.dim, generator=gen, dtype=dtype), dim=-1)
    labels = torch.randint(0, args.classes, (B,), generator=gen)
    return features.to(args.device), labels.to(args.device)


def check_agreement(fns: dict[str, LossFn], args: argparse.Namespace) -> list[str]:
    """float64: (b) at every benchmarked B and (a) at a small B agree with our H-SCL(beta)."""
    lines = []
    cases = [(B, "official-style") for B in args.batch_sizes] + [(args.reference_check_batch, "loop-reference")]
    for B, name in cases:
        f, y = make_inputs(B, args, torch.float64, seed=1000 + B)
        f_ours = f.clone().requires_grad_()
        f_other = f.clone().requires_grad_()
        ours = fns["hscl-beta"](f_ours, y)
        other = fns[name](f_other, y)
        ours.backward()
        other.backward()
        value_err = abs(ours.item() - other.item())
        grad_err = (f_ours.grad - f_other.grad).abs().max().item()
        if value_err > 1e-9 * max(1.0, abs(ours.item())) or grad_err > 1e-9:
            raise SystemExit(f"{name} disagrees with hscl-beta at B={B}: |dloss|={value_err:.3g}, max|dgrad|={grad_err:.3g}")
        lines.append(f"B={B}: {name} = {other.item():.12f}, hscl-beta = {ours.item():.12f}, max |grad diff| = {grad_err:.1e}")
    return lines


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_once(fn: LossFn, features: torch.Tensor, labels: torch.Tensor, device: str) -> float:
    features.grad = None
    sync(device)
    start = time.perf_counter()
    fn(features, labels).backward()
    sync(device)
    return time.perf_counter() - start


def bench(fns: dict[str, LossFn], threads: int, B: int, args: argparse.Namespace) -> dict[str, list[float]]:
    torch.set_num_threads(threads)
    features, labels = make_inputs(B, args, torch.float32, seed=B)
    features.requires_grad_()
    fast = [name for name in fns if name != "loop-reference"]
    times: dict[str, list[float]] = {name: [] for name in fast}
    for name in fast:
        for _ in range(args.warmup):
            time_once(fns[name], features, labels, args.device)
    gc.collect()
    gc.disable()
    try:
        for r in range(args.repeats):
            shift = r % len(fast)
            for name in fast[shift:] + fast[:shift]:
                times[name].append(time_once(fns[name], features, labels, args.device))
        if B <= args.reference_max_batch:
            times["loop-reference"] = [
                time_once(fns["loop-reference"], features, labels, args.device) for _ in range(args.reference_repeats)
            ]
    finally:
        gc.enable()
    return times


def quartiles(times: list[float]) -> tuple[float, float]:
    """(75th, 25th) percentile of one method's timings: their ratio shows how noisy the cell was."""
    if len(times) < 2:
        return times[0], times[0]
    q = statistics.quantiles(times, n=4)
    return q[2], q[0]


def fmt_ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.2f}" if ms < 10 else f"{ms:.1f}"


def fmt_ratio(num: float | None, den: float | None) -> str:
    return "-" if num is None or den is None else f"{num / den:.2f}x"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:k]")
    p.add_argument("--threads", default=None, help="comma-separated torch thread counts (CPU default 1,2)")
    p.add_argument("--batch-sizes", default="128,256,512")
    p.add_argument("--views", type=int, default=2)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--classes", type=int, default=10, help="labels drawn uniformly from this many classes")
    p.add_argument("--temperature", type=float, default=0.5)
    p.add_argument("--beta", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=30, help="timed runs of each fast method per cell")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reference-max-batch", type=int, default=128, help="largest B at which the loop reference is timed")
    p.add_argument("--reference-repeats", type=int, default=3)
    p.add_argument("--reference-check-batch", type=int, default=16)
    p.add_argument("--json", type=Path, default=None, help="also write all timings here")
    args = p.parse_args(argv)
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda was asked for but torch.cuda.is_available() is False.")
    if args.views != 2:
        raise SystemExit("the official-style baseline is defined for two views; use --views 2.")
    default_threads = "1,2" if args.device == "cpu" else str(torch.get_num_threads())
    thread_counts = [int(t) for t in (args.threads or default_threads).split(",")]

    fns = methods(args)
    print("# loss_bench: forward + backward, median ms")
    print(f"command: python {' '.join(['benchmarks/loss_bench.py', *(argv if argv is not None else sys.argv[1:])])}")
    device_name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else platform.processor() or platform.machine()
    print(f"torch {torch.__version__}, device {args.device} ({device_name}), {os.cpu_count()} CPU cores visible")
    print(f"V={args.views}, d={args.dim}, {args.classes} classes, temperature={args.temperature}, beta={args.beta}, float32, "
          f"{args.repeats} repeats ({args.warmup} warm-up) per cell")
    print("agreement check (float64, before timing):")
    for line in check_agreement(fns, args):
        print("  " + line)

    rows = []
    for threads in thread_counts:
        for B in args.batch_sizes:
            load_before = os.getloadavg()[0]
            times = bench(fns, threads, B, args)
            load_after = os.getloadavg()[0]
            med = {name: statistics.median(ts) for name, ts in times.items()}
            rows.append(dict(threads=threads, B=B, median_s=med, times_s=times, load=(load_before, load_after)))
            print(f"  done: threads={threads} B={B} (1-min load average {load_before:.2f} -> {load_after:.2f})", flush=True)

    names = [n for n in fns]
    header = ["threads", "B", *names, "hscl-beta / floor", "official / hscl-beta", "loop / hscl-beta", "spread", "load"]
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|")
    for row in rows:
        med = row["median_s"]
        cells = [str(row["threads"]), str(row["B"]), *(fmt_ms(med.get(n)) for n in names)]
        cells += [
            fmt_ratio(med["hscl-beta"], med["floor"]),
            fmt_ratio(med["official-style"], med["hscl-beta"]),
            fmt_ratio(med.get("loop-reference"), med["hscl-beta"]),
            fmt_ratio(*quartiles(row["times_s"]["hscl-beta"])),
            f"{row['load'][0]:.1f}-{row['load'][1]:.1f}",
        ]
        print("| " + " | ".join(cells) + " |")
    print()
    print(f"Times in ms (median). loop-reference (hscl_zoo/losses/reference.py, H-SCL(beta)) is timed only for "
          f"B <= {args.reference_max_batch} with {args.reference_repeats} repeats: its Python loop over "
          f"anchor x candidate pairs takes tens of seconds per call at B = 128 and grows ~4x per doubling of B; "
          f"'-' marks the skipped cells. spread: 75th / 25th percentile of the hscl-beta timings (near 1x on a "
          f"quiet machine); load: the 1-minute load average before and after the cell, on {os.cpu_count()} cores.")
    if args.json is not None:
        args.json.write_text(json.dumps(dict(
            device=args.device, device_name=device_name, torch=torch.__version__, views=args.views, dim=args.dim,
            classes=args.classes, temperature=args.temperature, beta=args.beta, repeats=args.repeats, rows=rows,
        ), indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
