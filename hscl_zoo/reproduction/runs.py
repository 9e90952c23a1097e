"""One reproduction run: pretrain and probe in a process of its own, resume it, or reuse its record.

A run lives in ``<runs>/<name>/`` (the recipe's output folder) and, once finished, in the record
``<runs>/<name>.json``: the probe's scores, the per-epoch history, the config, the hardware and
the commit of the code that trained it. Budgets (`recipes/reproduce.py`) and studies
(`recipes/study.py`) both go through :func:`run_or_reuse`, so a re-run command only does what is
missing and an interrupted run continues from its last checkpoint.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from hscl_zoo._provenance import code_commit

Record = dict[str, Any]


def run_or_reuse(runs: Path, name: str, settings: Callable[[], dict[str, Any]], *, pretrain: Sequence[str],
                 fields: dict[str, Any]) -> Record:
    """The record of run `name` under `runs`: read if finished, else trained (or resumed) by the
    command `pretrain` (e.g. ``[python, recipes/pretrain.py]``) and written.

    `settings` gives the pretraining keys of a new run (called only when the run has not started;
    its ValueError becomes a SystemExit naming the problem); `fields` (method, seed, variant ...)
    head the record."""
    run_dir, record_path = runs / name, runs / f"{name}.json"
    if record_path.is_file():
        return json.loads(record_path.read_text())
    cmd = list(pretrain)
    if (run_dir / "config.json").is_file():
        cmd += ["--output_dir", str(run_dir), "--resume"]
    else:
        try:
            keys = {**settings(), "output_dir": str(run_dir)}
        except ValueError as error:
            raise SystemExit(f"error: {error}") from error
        cmd += [item for key, value in keys.items() for item in (f"--{key}", str(value))]
    started = time.perf_counter()
    print(f"[{name}] {' '.join(cmd[1:])}", flush=True)
    result = subprocess.run(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if result.returncode != 0:
        raise SystemExit(f"error: run {run_dir} failed (exit {result.returncode}); re-run this command to resume it.")
    evaluation = json.loads((run_dir / "linear_eval.json").read_text())
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    record = {
        **fields,
        "top1": evaluation["top1"],
        "top5": evaluation["top5"],
        "knn_top1": evaluation["knn_top1"],
        "history": history,
        "wall_seconds": time.perf_counter() - started,
        "train_seconds": sum(h["epoch_seconds"] for h in history),
        "hardware": hardware(),
        "commit": code_commit(),
        "config": json.loads((run_dir / "config.json").read_text()),
        "probe_protocol": evaluation["protocol"],
        "evaluation_seconds": evaluation.get("seconds"),
        "timings": timings(time.perf_counter() - started, history, run_dir),
        "features_from": evaluation.get("features_from"),
    }
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    return record


def timings(wall: float, history: list[dict[str, Any]], run_dir: Path) -> dict[str, Any]:
    """Where a run's wall seconds went: ``training`` (the epochs' steps, `epoch_seconds`) and
    ``outside_training`` (the rest) with its items: ``start`` (the interpreter, imports and
    anything before the recipe's first line), ``arguments``, ``data``, ``setup``, the epochs'
    ``monitor`` and ``checkpoints_and_logs`` (an epoch's wall time beyond its steps and monitor),
    ``evaluation`` (features and each metric, from linear_eval.json) and ``export`` (the rest of
    the finish: the Hub folder). Phases come from the recipe's phase_seconds.json; without it (an
    older recipe) only the two totals."""
    training = sum(h["epoch_seconds"] for h in history)
    result: dict[str, Any] = {"wall": round(wall, 3), "training": round(training, 3),
                              "outside_training": round(wall - training, 3)}
    phases_path = run_dir / "phase_seconds.json"
    if not phases_path.is_file():
        return result
    phases = json.loads(phases_path.read_text())
    evaluation = json.loads((run_dir / "linear_eval.json").read_text()).get("seconds") or {}
    monitor = sum(h.get("monitor_seconds", 0.0) for h in history)
    items = {"start": wall - sum(phases.values()), "arguments": phases["arguments"], "data": phases["data"],
             "setup": phases["setup"], "monitor": monitor,
             "checkpoints_and_logs": phases["epochs"] - training - monitor,
             "evaluation": sum(evaluation.values()), "export": phases["finish"] - sum(evaluation.values())}
    result["items"] = {name: round(value, 3) for name, value in items.items()}
    result["evaluation"] = evaluation
    return result


def hardware() -> str:
    """The device the runs train on, named as the summaries report it."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    threads = os.environ.get("OMP_NUM_THREADS") or torch.get_num_threads()
    return f"CPU ({os.cpu_count()} cores, {platform.machine()}, torch threads {threads})"
