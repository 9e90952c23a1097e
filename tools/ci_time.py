"""How long CI and the README's `pytest` take, measured the way CI runs them.

    python tools/ci_time.py ci --commit HEAD --label after       # a full `CI=true bash .ci/run`
    python tools/ci_time.py pytest --commit HEAD --label after   # a fresh install, then `pytest`

Each measurement clones the commit into a fresh folder under --workdir with `../shared` beside it (a
link to this checkout's `../shared`), runs it with every output line timestamped, and merges one entry
into benchmarks/results/ci_time.json under `<mode>/<label>`: the commit, the machine, the exit code,
the wall seconds, each phase's seconds and the slowest tests of each pytest phase. Phases are read from
the `ci-phase: NAME SECONDS` lines `.ci/run` prints; for a `.ci/run` older than those lines, from each
pytest session's own summary (`... in 916.12s`). Run it on a quiet machine: it measures wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from hscl_zoo._provenance import cpu_model, utc_now

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results" / "ci_time.json"
PHASE = re.compile(r"^ci-phase: (?P<name>\S+) (?P<seconds>[0-9.]+)$")
SESSION_END = re.compile(r"^=+ (?P<counts>.*?) in (?P<seconds>[0-9.]+)s(?: \([0-9:]+\))? =+$")
DURATION = re.compile(r"^(?P<seconds>[0-9.]+)s (?P<when>call|setup|teardown) +(?P<test>\S+)$")
COMMANDS = {
    "ci": "bash .ci/run",
    "pytest": 'python3 -m venv .venv && . .venv/bin/activate && pip install -q -c constraints.txt -e ".[test]" '
              '&& echo "ci-phase: install $SECONDS" && SECONDS=0 && pytest --durations=15 '
              '&& echo "ci-phase: pytest $SECONDS"',
}


def machine() -> dict[str, Any]:
    """The CPU, its visible cores and the memory: what a wall time depends on (no torch import)."""
    memory = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal")), "0") if Path("/proc/meminfo").is_file() else "0"
    return {"cpu_model": cpu_model(), "cpu_cores_visible": os.cpu_count(),
            "memory_gib": round(int(memory) / 2**20, 1)}


def resolve(commit: str) -> str:
    return subprocess.run(["git", "rev-parse", commit], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout.strip()


def fresh_clone(commit: str, workdir: Path) -> Path:
    """`workdir/main` at `commit`, with `workdir/shared` linking to this checkout's `../shared`."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    shared = ROOT.parent / "shared"
    if shared.is_dir():
        (workdir / "shared").symlink_to(shared.resolve())
    clone = workdir / "main"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", commit], cwd=clone, check=True)
    return clone


def parse(lines: list[tuple[float, str]]) -> dict[str, Any]:
    """Phases (from `ci-phase:` lines, else from pytest session summaries) and each pytest session's
    slowest tests, out of the timestamped output."""
    phases = [{"name": m["name"], "seconds": float(m["seconds"])} for _, line in lines
              if (m := PHASE.match(line.strip()))]
    sessions: list[dict[str, Any]] = []
    slowest: list[dict[str, Any]] = []
    for _, line in lines:
        text = line.strip()
        if (m := DURATION.match(text)):
            slowest.append({"seconds": float(m["seconds"]), "when": m["when"], "test": m["test"]})
        elif (m := SESSION_END.match(text)) and ("passed" in m["counts"] or "failed" in m["counts"]):
            sessions.append({"summary": m["counts"], "seconds": float(m["seconds"]), "slowest": slowest})
            slowest = []
    return {"phases": phases, "pytest_sessions": sessions}


def measure(mode: str, commit: str, workdir: Path, log: Path) -> dict[str, Any]:
    clone = fresh_clone(commit, workdir)
    env = dict(os.environ, CI="true", PYTEST_ADDOPTS="--durations=100")
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if ".venv" not in p)
    start = time.monotonic()
    lines: list[tuple[float, str]] = []
    with subprocess.Popen(["bash", "-c", COMMANDS[mode]], cwd=clone, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, bufsize=1) as process, log.open("w") as out:
        assert process.stdout is not None
        for line in process.stdout:
            stamp = time.monotonic() - start
            lines.append((stamp, line.rstrip("\n")))
            out.write(f"{stamp:9.1f} {line}")
            out.flush()
        returncode = process.wait()
    return {"commit": commit, "command": COMMANDS[mode], "machine": machine(), "started": utc_now(),
            "returncode": returncode, "wall_seconds": round(time.monotonic() - start, 1), **parse(lines)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=sorted(COMMANDS))
    parser.add_argument("--commit", default="HEAD", help="the commit to clone and measure")
    parser.add_argument("--label", required=True, help="its key in the results file, e.g. before / after")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/ci_time"),
                        help="where the fresh clone goes (emptied first)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--note", help="what else ran on the machine meanwhile, if anything (recorded as is)")
    args = parser.parse_args(argv)
    commit = resolve(args.commit)
    workdir = args.workdir / f"{args.mode}-{args.label}"
    entry = measure(args.mode, commit, workdir, workdir.with_suffix(".log"))
    if args.note:
        entry["note"] = args.note
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    results[f"{args.mode}/{args.label}"] = entry
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    phases = ", ".join(f"{phase['name']} {phase['seconds']:.0f} s" for phase in entry["phases"])
    print(f"{args.mode}/{args.label}: exit {entry['returncode']} in {entry['wall_seconds']} s ({phases}) -> {args.out}")
    return entry["returncode"]


if __name__ == "__main__":
    raise SystemExit(main())
