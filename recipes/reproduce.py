"""Measure the paper's claims: the five methods x N seeds at a named budget, probed and summarised.

    python recipes/reproduce.py --budget cpu-cifar10-10k --data_dir ../shared/data/cifar10
    python recipes/reproduce.py --budget cpu-tinyimagenet-20k --data_dir ../shared/data/tinyimagenet --seeds 0
    python recipes/reproduce.py --budget cpu-cifar10-10k --summary-only --readme README.md  # from the run files
    python recipes/reproduce.py --budget gpu-cifar10 --data_dir ../shared/data/cifar10 --seeds 0

Each run is `recipes/pretrain.py` in its own process under `<out>/runs/<method>-s<seed>/`; a
finished run is skipped and an interrupted one resumed, so re-running the command only does
what is missing. Per run a JSON (`<out>/runs/<method>-s<seed>.json`), then from those files
alone: `<out>/summary.md` (tables, verdicts on the paper's claims), `<out>/summary.csv` and the
figures in `<out>/figures/`. Budgets are defined in `hscl_zoo/reproduction/budgets.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from hscl_zoo.losses import LOSS_NAMES, METHODS
from hscl_zoo.reproduction.budgets import BUDGETS, RUN_ORDER, Budget, method_settings
from hscl_zoo.reproduction.figures import plot_histories
from hscl_zoo.reproduction.report import quote_in_readme, render_markdown, write_csv
from hscl_zoo.reproduction.summary import by_method, display

PRETRAIN = Path(__file__).resolve().parent / "pretrain.py"



def run_one(out: Path, budget: Budget, method: str, seed: int, data_dir: str | None) -> dict[str, Any]:
    """Train and probe one (method, seed), or reuse a finished run; return its result record."""
    run_dir = out / "runs" / f"{method}-s{seed}"
    record_path = out / "runs" / f"{method}-s{seed}.json"
    if record_path.is_file():
        return json.loads(record_path.read_text())
    cmd = [sys.executable, str(PRETRAIN)]
    if (run_dir / "config.json").is_file():
        cmd += ["--output_dir", str(run_dir), "--resume"]
    else:
        try:
            settings = {**budget.settings, **method_settings(out / "runs", method, seed), "method": method,
                        "seed": seed, "output_dir": str(run_dir)}
        except ValueError as error:
            raise SystemExit(f"error: {error}") from error
        if data_dir is not None:
            settings["data_dir"] = data_dir
        cmd += [item for key, value in settings.items() for item in (f"--{key}", str(value))]
    started = time.perf_counter()
    print(f"[{method} seed {seed}] {' '.join(cmd[1:])}", flush=True)
    result = subprocess.run(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if result.returncode != 0:
        raise SystemExit(f"error: run {run_dir} failed (exit {result.returncode}); re-run this command to resume it.")
    evaluation = json.loads((run_dir / "linear_eval.json").read_text())
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    record = {
        "method": method,
        "seed": seed,
        "top1": evaluation["top1"],
        "top5": evaluation["top5"],
        "knn_top1": evaluation["knn_top1"],
        "history": history,
        "wall_seconds": time.perf_counter() - started,
        "train_seconds": sum(h["epoch_seconds"] for h in history),
        "hardware": hardware(),
        "config": json.loads((run_dir / "config.json").read_text()),
        "probe_protocol": evaluation["protocol"],
    }
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    return record


def hardware() -> str:
    """The device the runs train on, named as the summary reports it."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    threads = os.environ.get("OMP_NUM_THREADS") or torch.get_num_threads()
    return f"CPU ({os.cpu_count()} cores, {platform.machine()}, torch threads {threads})"


def summarise(out: Path, budget: Budget) -> str:
    """Rewrite summary.md, summary.csv and the figures of `out` from its runs/*.json; return summary.md."""
    records = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]
    if not records:
        raise SystemExit(f"error: {out / 'runs'} holds no finished run (*.json) to summarise yet.")
    dataset = budget.settings["dataset"]
    paper = {m: spec.paper_top1[dataset][0] for m, spec in METHODS.items() if dataset in spec.paper_top1}
    text = render_markdown(budget.name, budget.description, budget.settings, records, paper)
    (out / "summary.md").write_text(text)
    write_csv(out / "summary.csv", records)
    first_seed = {m: rs[0] for m, rs in by_method(records).items()}
    plot_histories([(f"{display(m)} (seed {r['seed']})", r["history"]) for m, r in first_seed.items()], out / "figures")
    return text


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description="Run the paper's five methods over seeds at a budget and summarise.")
    parser.add_argument("--budget", required=True, choices=sorted(BUDGETS))
    parser.add_argument("--data_dir", help="local parquet folder (e.g. ../shared/data/cifar10); default: the Hub")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(LOSS_NAMES), choices=LOSS_NAMES)
    parser.add_argument("--out", type=Path, help="results folder (default: results/<budget>)")
    parser.add_argument("--summary-only", action="store_true",
                        help="train nothing: rewrite the summary and figures from the finished runs/*.json")
    parser.add_argument("--readme", type=Path,
                        help="also rewrite this README's <!-- results:BUDGET --> block with the summary's table and verdicts")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    out = args.out or Path("results") / args.budget
    (out / "runs").mkdir(parents=True, exist_ok=True)
    budget = BUDGETS[args.budget]
    if not args.summary_only:
        for seed in args.seeds:
            for method in (m for m in RUN_ORDER if m in args.methods):
                run_one(out, budget, method, seed, args.data_dir)
    text = summarise(out, budget)
    if args.readme is not None:
        try:
            args.readme.write_text(quote_in_readme(args.readme.read_text(), budget.name, text))
        except ValueError as error:
            raise SystemExit(f"error: {args.readme}: {error}") from error
    print(text)
    return text


if __name__ == "__main__":
    main()
