"""Fill the paper's graph table (Table 2) record by record: resumable, shareable by several workers.

    python recipes/graph_table.py --data_dir DIR --out results/graphs-paper/records \
        --phase a:0-2 --phase b:0:MUTAG,PTC_MR,IMDB-BINARY --phase a:3-9 --threads 1

A phase is PROTOCOL:SEEDS[:DATASETS] (seeds as 0-9 or 0,3,5; datasets default to all five). Every
record that exists is skipped; a worker claims the next missing one with a claim file holding its
process id (a dead worker's claim is taken over), so two workers started on the same --out share
the grid. A protocol-(b) record keeps each finished fold in ``seed<N>.folds/`` beside it until the
record lands, so a killed run loses at most the folds in progress (protocol (a): the records).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

from hscl_zoo.graphs.catalog import GRAPH_DATASETS, load_graph_dataset
from hscl_zoo.graphs.protocol import grid, record_path, run_record, write_record

ROOT = Path(__file__).resolve().parents[1]


def _seeds(text: str) -> list[int]:
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def _phase(text: str) -> tuple[str, list[int], list[str]]:
    parts = text.split(":")
    if len(parts) not in (2, 3) or parts[0] not in ("a", "b"):
        raise argparse.ArgumentTypeError(f"a phase is PROTOCOL:SEEDS[:DATASETS] with protocol a or b, got {text!r}.")
    datasets = parts[2].split(",") if len(parts) == 3 else [s.tu_name for s in GRAPH_DATASETS.values()]
    return parts[0], _seeds(parts[1]), datasets


def _claim(path: Path) -> bool:
    claim = path.with_suffix(".claim")
    claim.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            os.kill(int(claim.read_text() or "0"), 0)
            return False
        except (ProcessLookupError, ValueError):
            claim.unlink(missing_ok=True)
            return _claim(path)
    with os.fdopen(fd, "w") as handle:
        handle.write(str(os.getpid()))
    return True


def _commit() -> str:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "hscl_zoo", "recipes"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return head + ("+dirty" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", required=True, help="folder holding NAME/raw/ for each TU dataset")
    parser.add_argument("--out", type=Path, required=True, help="records folder")
    parser.add_argument("--phase", type=_phase, action="append", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--limit", type=int, default=0, help="stop after this many records (0: none)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    command = " ".join(["python recipes/graph_table.py", *(sys.argv[1:] if argv is None else argv)])
    cache: dict = {}
    done = 0
    for protocol, seeds, datasets in args.phase:
        for key in grid(datasets, [protocol], seeds):
            path = record_path(args.out, key)
            if path.exists() or not _claim(path):
                continue
            try:
                graphs = cache.get(key.dataset) or cache.setdefault(key.dataset, load_graph_dataset(
                    f"tu:{key.dataset}", args.data_dir, download=False))
                folds = path.with_suffix(".folds")
                record = run_record(graphs, key, {"epochs": args.epochs}, progress=folds if key.protocol == "b" else None)
                record["provenance"] = {"commit": _commit(), "command": command, "threads": args.threads,
                                        "cpu": platform.processor() or platform.machine(),
                                        "torch": torch.__version__,
                                        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")}
                write_record(path, record)
                shutil.rmtree(folds, ignore_errors=True)
                print(f"{key.label}: {record['mean_test_accuracy']:.4f} in {record['seconds']} s", flush=True)
            finally:
                path.with_suffix(".claim").unlink(missing_ok=True)
            done += 1
            if args.limit and done >= args.limit:
                return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
