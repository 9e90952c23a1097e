"""Time the README's default run and record what it reached, for the README to quote.

Runs `accelerate launch recipes/pretrain.py --output_dir <fresh temporary folder>` (the README's
first command; digits, ResNet-18, H-SCL(beta)) as a subprocess, times it from launch to exit,
and writes a JSON with the wall time, the final linear probe (top-1, top-5) and kNN top-1 from
the run's `linear_eval.json`, the per-epoch seconds from its `metrics.jsonl`, the machine, the
load average before and after, the command and the git commit.

    python benchmarks/default_run.py                      # writes results/default-digits.json
    python benchmarks/default_run.py --keep runs/default  # also keep the run folder
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import ROOT, git_commit, machine, utc_now

RECIPE = "recipes/pretrain.py"


def accelerate_executable() -> str:
    """`accelerate` from this interpreter's environment (else the one on PATH)."""
    beside = Path(sys.executable).with_name("accelerate")
    found = str(beside) if beside.is_file() else shutil.which("accelerate")
    if found is None:
        raise SystemExit("accelerate is not installed here: pip install -c constraints.txt -e .")
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "results" / "default-digits.json", help="JSON to write")
    p.add_argument("--keep", type=Path, default=None, help="keep the run's output folder here (default: deleted)")
    args = p.parse_args(argv)
    if args.keep is not None and args.keep.exists():
        raise SystemExit(f"--keep {args.keep} exists; choose a new folder.")

    commit = git_commit()  # the code as it was when the run started
    with tempfile.TemporaryDirectory(prefix="default-run-") as tmp:
        run_dir = args.keep or Path(tmp) / "run"
        command = [accelerate_executable(), "launch", RECIPE, "--output_dir", str(run_dir)]
        shown = f"accelerate launch {RECIPE} --output_dir <new folder>"
        print(f"running: {shown}", flush=True)
        load_before = os.getloadavg()
        started = time.perf_counter()
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - started
        load_after = os.getloadavg()
        if result.returncode != 0:
            raise SystemExit(f"the default run failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
        evaluation = json.loads((run_dir / "linear_eval.json").read_text())
        history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        config = json.loads((run_dir / "config.json").read_text())

    record = {
        "command": shown,
        "git_commit": commit,
        "date": utc_now(),
        "machine": machine(),
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
        "wall_seconds": round(wall, 1),
        "epoch_seconds": [round(h["epoch_seconds"], 2) for h in history],
        "linear_top1": evaluation["top1"],
        "linear_top5": evaluation["top5"],
        "knn_top1": evaluation["knn_top1"],
        "test_images": evaluation["protocol"]["num_test"],
        "config": {k: config[k] for k in ("dataset", "backbone", "stem", "method", "epochs", "batch_size",
                                          "probe_epochs", "mixed_precision")},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{wall:.0f} s wall; linear top-1 {record['linear_top1']:.2f} %, top-5 {record['linear_top5']:.2f} %, "
          f"kNN {record['knn_top1']:.2f} %; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
