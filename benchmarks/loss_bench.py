"""Forward + backward time of the five losses against their baselines; medians over reruns.

For each thread count and batch size B (V = 2 views, d dims, random unit features, labels from
`--classes` classes) it times, forward + backward on the same input:

* our five losses, `hscl_zoo.build_loss(name)`, H-SCL(beta) at every beta of `--betas`
  (hucl at beta = 1);
* `official-style` at every beta: `benchmarks/official_style.py`, our transcription of the
  official script's approach (per-row Python mask loop, exp-space arithmetic, indexed assignment);
* `official` at every beta, only with `--official-repo PATH`: the official repository's own
  `nce_supervised_hard`, loaded from a local copy by `benchmarks/official_repo.py` (which says
  exactly what is changed: on the CPU its `.cuda()` calls are removed, nothing else);
* `loop-reference`: the plain-loop reference of the tests (`hscl_zoo.losses.reference`) as
  H-SCL(beta = 1), very slow, so only up to `--reference-max-batch` (never on CUDA by default);
* `floor`: the bare similarity matmul plus one logsumexp.

Before timing it checks in float64 that every baseline gives our H-SCL(beta) value and gradient.

Timing: a rerun is one whole pass over every (threads, B) cell; within a cell each repeat runs
every method once, in rotating order, so drifts of a shared machine hit all methods alike. Each
rerun gives per-method medians and, from them, per-rerun ratios; the table reports the median
over reruns of both (ratios are computed within a rerun, never across). On CUDA one timing is
`--iters-per-sync` calls between two synchronisations, divided by their number, so kernel launch
queues stay full as in training; the official function and its transcription are timed one call
at a time (they synchronise on every row anyway).

    python benchmarks/loss_bench.py --json benchmarks/results/loss_bench_cpu.json
    python benchmarks/loss_bench.py --official-repo ~/src/H-SCL       # also the official function
    python benchmarks/loss_bench.py --device cuda --json benchmarks/results/loss_bench_cuda.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from official_repo import TEMPERATURE as OFFICIAL_TEMPERATURE  # benchmarks/, the script's own folder
from official_repo import load_official_loss
from official_style import official_style_hscl_beta
from provenance import command_line, git_commit, machine, utc_now

from hscl_zoo import LOSS_NAMES, build_loss
from hscl_zoo.losses.reference import exp_tilt, reference_loss

warnings.filterwarnings("ignore", message="Converting a tensor with requires_grad=True to a scalar")

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
CPU_BATCHES = "128,256,512"
CUDA_BATCHES = "512,1024,2048,4096,8192"


def floor_loss(temperature: float) -> LossFn:
    """Similarity matmul and one row logsumexp: the least any of these losses must do."""

    def fn(features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        flat = features.reshape(-1, features.shape[-1])
        return torch.logsumexp(flat @ flat.T / temperature, dim=1).mean()

    return fn


def beta_name(method: str, beta: float) -> str:
    return f"{method} b={beta:g}"


def methods(args: argparse.Namespace) -> dict[str, LossFn]:
    """Every timed method by column name, in table order."""
    t = args.temperature
    table: dict[str, LossFn] = {"floor": floor_loss(t)}
    for name in LOSS_NAMES:
        if name == "hscl-beta":
            for beta in args.betas:
                table[beta_name(name, beta)] = build_loss(name, temperature=t, beta=beta)
        else:
            table[name] = build_loss(name, temperature=t)
    for beta in args.betas:
        table[beta_name("official-style", beta)] = lambda f, y, b=beta: official_style_hscl_beta(f, y, t, b)
    if args.official is not None:
        for beta in args.betas:
            table[beta_name("official", beta)] = lambda f, y, b=beta: args.official(f, y, b)
    table["loop-reference"] = lambda f, y: reference_loss(
        f, y, method="hscl-beta", positives="labels", temperature=t, eta=exp_tilt(1.0))
    return table


def make_inputs(B: int, args: argparse.Namespace, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    # Unit vectors, as a projection head's normalised output: the logits then lie in
    # [-1/temperature, 1/temperature] as inside the losses (raw Gaussian features would give the
    # floor logits of size ~d/temperature, whose exps underflow into slow float32 denormals).
    features = torch.nn.functional.normalize(torch.randn(B, 2, args.dim, generator=gen, dtype=dtype), dim=-1)
    labels = torch.randint(0, args.classes, (B,), generator=gen)
    return features.to(args.device), labels.to(args.device)


def value_and_grad(fn: LossFn, f: torch.Tensor, y: torch.Tensor) -> tuple[float, torch.Tensor]:
    x = f.clone().requires_grad_()
    value = fn(x, y)
    value.backward()
    return value.item(), x.grad


def check_agreement(fns: dict[str, LossFn], args: argparse.Namespace) -> list[str]:
    """float64: each baseline equals our H-SCL(beta) in value and gradient, or the bench stops.

    The official function allocates its masks with torch's default dtype, so its check runs with
    the default dtype set to float64; the official script detaches the hardening weights for
    beta < 1 in one version of the file, so it is compared with both `detach_weights` settings
    and the matching one is reported."""
    lines = []
    cases = [(B, beta_name(m, beta), beta) for B in args.batch_sizes for beta in args.betas
             for m in ("official-style", "official") if beta_name(m, beta) in fns]
    cases.append((args.reference_check_batch, "loop-reference", 1.0))
    for B, name, beta in cases:
        f, y = make_inputs(B, args, torch.float64, seed=1000 + B)
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            other, other_grad = value_and_grad(fns[name], f, y)
        finally:
            torch.set_default_dtype(default_dtype)
        mismatches = []
        for detach in (False, True) if name.startswith("official ") else (False,):
            ours, grad = value_and_grad(build_loss("hscl-beta", temperature=args.temperature, beta=beta,
                                                   detach_weights=detach), f, y)
            value_err, grad_err = abs(ours - other), (grad - other_grad).abs().max().item()
            if value_err <= 1e-9 * max(1.0, abs(ours)) and grad_err <= 1e-9:
                lines.append(f"B={B}: {name} = {other:.12f}, hscl-beta (detach_weights={detach}) = {ours:.12f}, "
                             f"max |grad diff| = {grad_err:.1e}")
                break
            mismatches.append(f"detach_weights={detach}: |dloss|={value_err:.3g}, max|dgrad|={grad_err:.3g}")
        else:
            raise SystemExit(f"{name} disagrees with hscl-beta at B={B}: {'; '.join(mismatches)}")
    return lines


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def row_loop(name: str) -> bool:
    """The official function and its transcription loop over rows with a host sync in each."""
    return name.startswith("official")


def time_block(fn: LossFn, features: torch.Tensor, labels: torch.Tensor, iters: int, device: str) -> float:
    """Seconds per call of forward + backward, over `iters` calls between two syncs."""
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        features.grad = None
        fn(features, labels).backward()
    sync(device)
    return (time.perf_counter() - start) / iters


def bench_cell(fns: dict[str, LossFn], threads: int, B: int, args: argparse.Namespace) -> dict[str, list[float]]:
    """Timings of every method at one (threads, B): `repeats` rotations, then the loop reference."""
    torch.set_num_threads(threads)
    features, labels = make_inputs(B, args, torch.float32, seed=B)
    features.requires_grad_()
    fast = [name for name in fns if name != "loop-reference"]
    iters = {name: 1 if row_loop(name) else args.iters_per_sync for name in fns}
    times: dict[str, list[float]] = {name: [] for name in fast}
    for name in fast:
        for _ in range(args.warmup):
            time_block(fns[name], features, labels, iters[name], args.device)
    gc.collect()
    gc.disable()
    try:
        for r in range(args.repeats):
            shift = r % len(fast)
            for name in fast[shift:] + fast[:shift]:
                times[name].append(time_block(fns[name], features, labels, iters[name], args.device))
        if B <= args.reference_max_batch:
            times["loop-reference"] = [time_block(fns["loop-reference"], features, labels, 1, args.device)
                                       for _ in range(args.reference_repeats)]
    finally:
        gc.enable()
    return times


def ratio_pairs(args: argparse.Namespace, names: list[str]) -> list[tuple[str, str, str]]:
    """(label, numerator, denominator) of every ratio the table reports."""
    pairs = []
    for beta in args.betas:
        ours = beta_name("hscl-beta", beta)
        pairs.append((f"{ours} / floor", ours, "floor"))
        pairs.append((f"official-style / hscl-beta b={beta:g}", beta_name("official-style", beta), ours))
        if beta_name("official", beta) in names:
            pairs.append((f"official / hscl-beta b={beta:g}", beta_name("official", beta), ours))
            pairs.append((f"official-style / official b={beta:g}", beta_name("official-style", beta),
                          beta_name("official", beta)))
    pairs.append(("loop-reference / hscl-beta b=1", "loop-reference", beta_name("hscl-beta", 1.0)))
    return [p for p in pairs if p[1] in names and p[2] in names]


def summarise(cells: list[dict[str, Any]], pairs: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """Per (threads, B): median over reruns of each method's per-rerun median and of each ratio."""
    rows = []
    for key in sorted({(c["threads"], c["B"]) for c in cells}):
        runs = [c for c in cells if (c["threads"], c["B"]) == key]
        medians = {name: statistics.median(r["median_s"][name] for r in runs)
                   for name in runs[0]["median_s"]}
        ratios = {}
        for label, num, den in pairs:
            per_rerun = [r["median_s"][num] / r["median_s"][den] for r in runs
                         if num in r["median_s"] and den in r["median_s"]]
            if per_rerun:
                ratios[label] = {"median": statistics.median(per_rerun), "min": min(per_rerun),
                                 "max": max(per_rerun), "per_rerun": per_rerun}
        loads = [x for r in runs for x in r["load"]]
        rows.append(dict(threads=key[0], B=key[1], reruns=len(runs), median_ms={n: v * 1e3 for n, v in medians.items()},
                         ratios=ratios, load_min=min(loads), load_max=max(loads)))
    return rows


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.2f}" if ms < 10 else f"{ms:.1f}"


def markdown(rows: list[dict[str, Any]], names: list[str], pairs: list[tuple[str, str, str]]) -> str:
    """Two tables: median ms per method, then median ratios (min-max over reruns)."""
    lines = ["| threads | B | " + " | ".join(names) + " | load |",
             "|---|---|" + "---:|" * (len(names) + 1)]
    for row in rows:
        cells = [fmt_ms(row["median_ms"].get(n)) for n in names]
        lines.append(f"| {row['threads']} | {row['B']} | " + " | ".join(cells)
                     + f" | {row['load_min']:.1f}-{row['load_max']:.1f} |")
    labels = [label for label, _, _ in pairs]
    lines += ["", "| threads | B | " + " | ".join(labels) + " |", "|---|---|" + "---:|" * len(labels)]
    for row in rows:
        cells = []
        for label in labels:
            r = row["ratios"].get(label)
            cells.append("-" if r is None else f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})")
        lines.append(f"| {row['threads']} | {row['B']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:k]")
    p.add_argument("--threads", default=None, help="comma-separated torch thread counts (CPU default 1,2)")
    p.add_argument("--batch-sizes", default=None, help=f"comma-separated B (CPU default {CPU_BATCHES}, "
                   f"CUDA {CUDA_BATCHES})")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--classes", type=int, default=10, help="labels drawn uniformly from this many classes")
    p.add_argument("--temperature", type=float, default=0.5)
    p.add_argument("--betas", default="0.5,1,2", help="H-SCL(beta) (ours, official-style, official) betas")
    p.add_argument("--reruns", type=int, default=3, help="whole passes over all cells; the table gives medians over them")
    p.add_argument("--repeats", type=int, default=20, help="timed rotations of every method per cell and rerun")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters-per-sync", type=int, default=None,
                   help="calls timed between two synchronisations (CUDA default 10, CPU 1)")
    p.add_argument("--reference-max-batch", type=int, default=None,
                   help="largest B at which the loop reference is timed (CPU default 128; CUDA 0: skipped)")
    p.add_argument("--reference-repeats", type=int, default=1, help="loop-reference calls per cell and rerun")
    p.add_argument("--reference-check-batch", type=int, default=16)
    p.add_argument("--official-repo", type=Path, default=None,
                   help="local copy of github.com/rjiang03/H-SCL: also time its nce_supervised_hard "
                        "(see benchmarks/official_repo.py for what is changed)")
    p.add_argument("--json", type=Path, default=None, help="write the machine, settings and every timing here")
    args = p.parse_args(argv)
    on_cuda = args.device.startswith("cuda")
    if on_cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda was asked for but torch.cuda.is_available() is False.")
    args.batch_sizes = [int(b) for b in (args.batch_sizes or (CUDA_BATCHES if on_cuda else CPU_BATCHES)).split(",")]
    args.betas = [float(b) for b in args.betas.split(",")]
    if 1.0 not in args.betas:
        raise SystemExit("--betas must include 1 (the loop reference and hucl run at beta = 1).")
    args.threads = [int(t) for t in (args.threads or ("1,2" if not on_cuda else str(torch.get_num_threads()))).split(",")]
    args.iters_per_sync = args.iters_per_sync or (10 if on_cuda else 1)
    if args.reference_max_batch is None:
        args.reference_max_batch = 0 if on_cuda else 128
    if min(args.reruns, args.repeats, args.iters_per_sync) < 1:
        raise SystemExit("--reruns, --repeats and --iters-per-sync must be at least 1.")
    args.official = None
    if args.official_repo is not None:
        if args.temperature != OFFICIAL_TEMPERATURE:
            raise SystemExit(f"the official function fixes the temperature at {OFFICIAL_TEMPERATURE}; "
                             f"drop --official-repo or use --temperature {OFFICIAL_TEMPERATURE}.")
        args.official = load_official_loss(args.official_repo, args.device)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = command_line(__file__, argv)
    commit = git_commit()  # the code as it was when the timings started
    fns = methods(args)
    names = list(fns)
    pairs = ratio_pairs(args, names)
    info = machine(args.device)
    print("# loss_bench: forward + backward, ms")
    print(f"command: {command}")
    print(f"machine: {info}")
    print(f"V=2, d={args.dim}, {args.classes} classes, temperature={args.temperature}, betas={args.betas}, float32; "
          f"{args.reruns} reruns x {args.repeats} repeats ({args.warmup} warm-up), {args.iters_per_sync} call(s) per timing")
    if args.official is not None:
        print(f"official: {args.official.source}, {args.official.cuda_calls_removed} .cuda() call(s) removed")
    print("agreement check (float64, before timing):")
    agreement = check_agreement(fns, args)
    for line in agreement:
        print("  " + line)

    cells = []
    for rerun in range(args.reruns):
        for threads in args.threads:
            for B in args.batch_sizes:
                load_before = os.getloadavg()[0]
                times = bench_cell(fns, threads, B, args)
                load_after = os.getloadavg()[0]
                cells.append(dict(rerun=rerun, threads=threads, B=B, load=[load_before, load_after],
                                  median_s={n: statistics.median(ts) for n, ts in times.items()},
                                  times_s={n: [round(t, 7) for t in ts] for n, ts in times.items()}))
                print(f"  rerun {rerun + 1}/{args.reruns}: threads={threads} B={B} "
                      f"(1-min load average {load_before:.2f} -> {load_after:.2f})", flush=True)

    rows = summarise(cells, pairs)
    print()
    print(markdown(rows, names, pairs))
    print()
    print(f"Medians over {args.reruns} reruns of per-rerun medians (ms); ratios are per-rerun ratios of medians, "
          f"median (min-max) over reruns. loop-reference (H-SCL(beta = 1)) is timed only for "
          f"B <= {args.reference_max_batch}; '-' marks skipped cells. load: the 1-minute load average over the "
          f"cell's timings, on {os.cpu_count()} visible cores.")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(dict(
            command=command, git_commit=commit, date=utc_now(),
            machine=info, device=args.device, threads=args.threads, batch_sizes=args.batch_sizes, views=2,
            dim=args.dim, classes=args.classes, temperature=args.temperature, betas=args.betas,
            reruns=args.reruns, repeats=args.repeats, warmup=args.warmup, iters_per_sync=args.iters_per_sync,
            official=None if args.official is None else dict(
                source=str(args.official.source), cuda_calls_removed=args.official.cuda_calls_removed),
            agreement=agreement, rows=rows, cells=cells,
        ), indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
