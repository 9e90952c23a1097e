"""Does a streamed run learn what the map-style run learns? The same short runs, both ways.

`hscl-zoo train` on a CIFAR-10 sample written as a parquet folder (rows drawn at random, kept in
the file's own order: the Hub's file is sorted by class, as many are), once reading it as a table
and once as a stream (``--streaming true``), for each seed; every other setting is the same. The
encoders' linear-probe and kNN top-1 on the sample's test rows are recorded per run, with the
median per path and the median of the paired differences. Runs one after the other, one process
each, in this process's environment.

    python benchmarks/stream_vs_map_scores.py --data-dir ../shared/data/cifar10 \\
        --json benchmarks/results/stream_vs_map_scores_cpu.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from provenance import command_line, git_commit, machine, utc_now  # benchmarks/, the script's own folder

PATHS = {"map": [], "stream": ["--streaming", "true"]}


def write_sample(data_dir: Path, out: Path, rows: dict[str, int], seed: int = 0) -> dict[str, int]:
    """`rows[split]` rows of each split of the parquet folder `data_dir`, drawn at random and kept
    in the file's order, written to `out` in row groups of 250 (the stream's shards)."""
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for split, n in rows.items():
        (source,) = sorted(data_dir.rglob(f"{split}-*.parquet"))[:1]
        table = pq.read_table(source)
        keep = np.sort(np.random.default_rng(seed).choice(len(table), n, replace=False))
        pq.write_table(table.take(keep), out / f"{split}-00000-of-00001.parquet", row_group_size=250)
        written[split] = n
    return written


def train(sample: Path, run_dir: Path, seed: int, path: str, settings: list[str]) -> dict[str, float]:
    cmd = [sys.executable, "-m", "hscl_zoo.cli", "train", "--dataset", "cifar10", "--data_dir", str(sample),
           "--seed", str(seed), "--output_dir", str(run_dir), *settings, *PATHS[path]]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    evaluation = json.loads((run_dir / "linear_eval.json").read_text())
    return {"linear_top1": evaluation["top1"], "knn_top1": evaluation["knn_top1"],
            "train_images": evaluation["train_images"]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, required=True, help="CIFAR-10's parquet folder (the Hub's layout)")
    p.add_argument("--train-rows", type=int, default=2000)
    p.add_argument("--test-rows", type=int, default=1000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--settings", nargs="*", default=["--backbone", "resnet18", "--epochs", "4", "--batch_size", "128",
                                                     "--probe_epochs", "50", "--knn_k", "20"],
                   help="recipe settings both paths share")
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="stream-vs-map-"))
    try:
        sample = work / "sample"
        rows = write_sample(args.data_dir, sample, {"train": args.train_rows, "test": args.test_rows})
        runs = []
        for seed in args.seeds:
            for path in PATHS:
                scores = train(sample, work / f"{path}-s{seed}", seed, path, args.settings)
                runs.append({"path": path, "seed": seed, **scores})
                print(f"{path} seed {seed}: linear {scores['linear_top1']:.2f} %  kNN {scores['knn_top1']:.2f} %", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {}
    for metric in ("linear_top1", "knn_top1"):
        per_path = {path: [r[metric] for r in runs if r["path"] == path] for path in PATHS}
        summary[metric] = {"median": {path: statistics.median(v) for path, v in per_path.items()},
                           "median_stream_minus_map": statistics.median(
                               s - m for s, m in zip(per_path["stream"], per_path["map"], strict=True))}
    result = {"command": command_line(__file__, argv), "commit": git_commit(), "measured": utc_now(),
              "machine": machine("cpu"), "rows": rows, "seeds": args.seeds, "settings": args.settings,
              "runs": runs, "summary": summary}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
