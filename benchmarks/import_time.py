"""How long the package takes to start: `python -X importtime` of each entry point, in fresh
interpreters, against `import torch`.

Each case runs `--runs` times (default 7) after one untimed run (which writes the .pyc files) as
`python -X importtime -c CODE` from this checkout; per run it records the process's wall time and
the import time Python reports (the sum of the top-level imports' cumulative microseconds), and
the JSON keeps the median of each, every run, and the five slowest top-level imports of the
median run. The goals of issue 26 are checked from the medians: `hscl-zoo list` under 0.5 s of
wall time, and loading the losses (`from hscl_zoo.losses import ContrastiveLoss, build_loss`,
which imports torch) within 1.2x `import torch`.

    python benchmarks/import_time.py                   # writes benchmarks/results/import_time.json
    python benchmarks/import_time.py --runs 11 --out /tmp/import_time.json
    python benchmarks/import_time.py --source ../before --out benchmarks/results/import_time_before.json

`--source` measures the package of another checkout (an earlier commit, for a before/after
comparison); the JSON records that checkout's commit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from provenance import ROOT, command_line, git_commit, machine, utc_now

CASES = {
    "import torch": "import torch",
    "import hscl_zoo": "import hscl_zoo",
    "import hscl_zoo.losses": "import hscl_zoo.losses",
    "from hscl_zoo.losses import ContrastiveLoss, build_loss": "from hscl_zoo.losses import ContrastiveLoss, build_loss",
    # what the hscl-zoo console script runs
    "hscl-zoo list": "import sys; from hscl_zoo.cli import main; sys.exit(main(['list']))",
    "hscl-zoo --help": "import sys; from hscl_zoo.cli import main; sys.exit(main(['--help']))",
}
LIST_GOAL_S = 0.5
LOSSES_GOAL_RATIO = 1.2


def top_level_imports(stderr: str) -> dict[str, int]:
    """Cumulative microseconds of each top-level import in `-X importtime` output."""
    times = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "[us]" in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        if not name.startswith("  "):  # one space after the bar; nested imports are indented further
            times[name.strip()] = int(cumulative)
    return times


def run_once(code: str, source: Path) -> tuple[float, dict[str, int]]:
    env = {**os.environ, "PYTHONPATH": str(source)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=source, env=env, capture_output=True,
                          text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{code!r} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return wall, top_level_imports(done.stderr)


def measure(code: str, runs: int, source: Path) -> dict:
    run_once(code, source)
    samples = [run_once(code, source) for _ in range(runs)]
    walls = [wall for wall, _ in samples]
    imports = [sum(t.values()) / 1e6 for _, t in samples]
    median_run = sorted(range(runs), key=lambda i: walls[i])[runs // 2]
    slowest = sorted(samples[median_run][1].items(), key=lambda kv: -kv[1])[:5]
    return {
        "wall_s_median": round(statistics.median(walls), 4),
        "import_s_median": round(statistics.median(imports), 4),
        "wall_s": [round(w, 4) for w in walls],
        "import_s": [round(i, 4) for i in imports],
        "slowest_top_level_imports_s": {name: round(us / 1e6, 4) for name, us in slowest},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=7, help="timed runs per case (default: %(default)s)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "import_time.json")
    p.add_argument("--source", type=Path, default=ROOT, help="checkout whose hscl_zoo to measure (default: this one)")
    args = p.parse_args(argv)
    if args.runs < 1:
        raise SystemExit(f"--runs must be at least 1, got {args.runs}.")
    source = args.source.resolve()
    if not (source / "hscl_zoo" / "__init__.py").is_file():
        raise SystemExit(f"--source {args.source} holds no hscl_zoo package; give the root of a checkout.")

    commit = git_commit(source)
    load_before = os.getloadavg()
    results = {}
    for name, code in CASES.items():
        results[name] = measure(code, args.runs, source)
        print(f"{name:<58} wall {results[name]['wall_s_median']:.3f} s   imports {results[name]['import_s_median']:.3f} s",
              flush=True)
    load_after = os.getloadavg()

    torch_s = results["import torch"]["import_s_median"]
    losses_s = results["from hscl_zoo.losses import ContrastiveLoss, build_loss"]["import_s_median"]
    goals = {
        "hscl-zoo list wall s < 0.5": results["hscl-zoo list"]["wall_s_median"] < LIST_GOAL_S,
        "losses import / torch import <= 1.2": losses_s / torch_s <= LOSSES_GOAL_RATIO,
    }
    record = {
        "command": command_line(__file__, argv),
        "source": str(source),
        "git_commit": commit,
        "date": utc_now(),
        "machine": machine(),
        "python_executable": sys.executable,
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
        "runs_per_case": args.runs,
        "cases": {name: {"code": CASES[name], **result} for name, result in results.items()},
        "losses_over_torch_import_ratio": round(losses_s / torch_s, 3),
        "goals_met": goals,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"losses / torch import time: {losses_s / torch_s:.2f}x; goals met: {goals}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
