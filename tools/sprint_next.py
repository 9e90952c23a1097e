"""`bash tools/gpu_sprint.sh next`: do the most valuable missing GPU work that fits one call.

The plan comes from `sprint_plan` (what the committed files lack, in priority order, within the
call's time). Each item's results land in a *view* of the repository (the committed results
copied in, plus what this call adds, at the paths they will have in the repository), and
`sprint_pack.pack` rewrites $OUT after every landing, so a call cut at the device's limit still
returns what finished. A training item runs its two runs side by side; each seed-0 run, once its
record has landed, is first packed as its bf16 weights (seconds; the release can be rebuilt from
them on the CPU) and then released (``hscl-zoo release --dtype bf16``, re-evaluated on the
device), whose folder replaces the weights in $OUT when it lands.

The sprint log (``benchmarks/results/gpu_sprint_<time>.json``; ``rehearsal_<time>.json`` in a
rehearsal, which no cost estimate reads) records the carried code (commit, sha256 of its diff),
the command, the plan, and per part its command, exit status, seconds and every file's sha256.
With ``--rehearse`` the same plan runs on the CPU at the rehearsal budget's tiny sizes, its clock
advanced by each item's estimate, so it takes the decisions a GPU call would.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sprint_pack  # tools/, the script's own folder
import sprint_plan
from hscl_zoo.reproduction.budgets import BUDGETS, GPU_BUDGETS

ROOT = Path(__file__).resolve().parents[1]
PROFILE = {False: sprint_plan.GPU_PROFILE, True: "benchmarks/results/data_path_rehearsal.json"}
"""Where the data-path profile of a call lands (benchmarks/data_path_profile.py), on a GPU and in a
rehearsal: the first call profiles before it trains (on a GPU its time counts against the call, and
the plan's estimates then come from its rate), later calls read the committed file."""
SEEDED = (*(f"{sprint_plan.runs_dir(b)}/*.json" for b in GPU_BUDGETS), "benchmarks/results/*sprint*.json",
          sprint_plan.RELEASES_REGISTRY, *sprint_plan.CHECKS.values(), PROFILE[False])
"""The committed files a view starts from (what `sprint_plan` reads, and the GPU's profile)."""


class Sprint:
    """One call's work: the view, the log, and the packing after every landing."""

    def __init__(self, args: argparse.Namespace, source: dict[str, Any]):
        self.args, self.view, self.out = args, args.view, args.out
        self.lock = threading.Lock()
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        self.logs = f"runs/gpu-sprint/logs/{stamp}"  # ignored by git: unpacked beside the results, not committed
        self.log_path = f"benchmarks/results/{'rehearsal' if args.rehearse else 'gpu_sprint'}_{stamp}.json"
        self.small: list[str] = [self.log_path]
        self.weights: list[str] = []
        self.log: dict[str, Any] = {"source": source, "command": args.command, "device": args.device,
                                    "rehearsal": args.rehearse, "budget_seconds": args.budget_seconds,
                                    "started": stamp, "plan": [], "parts": []}
        self.failed = 0
        self.compile = False
        (self.view / self.logs).mkdir(parents=True, exist_ok=True)

    def part(self, name: str, cmd: list[str], expect: list[str], small: bool = True,
             timings_from: str | None = None) -> bool:
        """Run `cmd` (its log in the view), record it in the sprint log with the sha256 of every
        file under the view paths `expect` (files or folders), and pack, those files in
        results.tgz when `small`. `timings_from`: a run record whose itemised seconds (where the
        run's wall time went, `hscl_zoo.reproduction.runs.timings`) the part's entry repeats.
        True when it exited 0 and wrote everything it was expected to."""
        log = f"{self.logs}/{name}.log"
        started = time.perf_counter()
        print(f"[sprint] {name}: {shlex.join(cmd)}", flush=True)
        with (self.view / log).open("w") as handle:
            code = subprocess.run(cmd, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT).returncode
        seconds = time.perf_counter() - started
        present = [e for e in expect if (self.view / e).exists()]
        written = sorted(p.relative_to(self.view).as_posix() for e in present
                         for p in ([self.view / e] if (self.view / e).is_file() else (self.view / e).rglob("*"))
                         if p.is_file())
        ok = code == 0 and len(present) == len(expect)
        print(f"[sprint] {name}: exit {code} after {seconds:.0f} s", flush=True)
        entry = {"part": name, "command": shlex.join(cmd), "exit": code, "seconds": round(seconds, 1),
                 "files": {f: sprint_pack.sha256(self.view / f) for f in written}}
        if ok and timings_from is not None:
            entry["timings"] = json.loads((self.view / timings_from).read_text()).get("timings")
        with self.lock:
            self.failed += not ok
            self.small += [log, *(written if small else [])]
            self.log["parts"].append(entry)
        self.pack()
        return ok

    def pack(self) -> None:
        with self.lock:
            (self.view / self.log_path).write_text(json.dumps(self.log, indent=1) + "\n")
            self.log["left_out"] = sprint_pack.pack(self.view, self.out, self.small, self.weights)

    def land_weights(self, part: str, target: str, run_dir: Path) -> None:
        """The run's encoder in bf16 shards with its float32 evaluation, at `target` of the view
        (``runs/gpu-weights/<budget>/<run>``): what `hscl-zoo release` rebuilds the release from on
        the CPU if the call is cut before the device's release lands."""
        code = ("import sys, shutil; from hscl_zoo.zoo.hub import load; from hscl_zoo.zoo.saving import save_pretrained;"
                "m = load(sys.argv[1] + '/hub'); save_pretrained(m, sys.argv[2] + '/hub', training=m.training_summary, "
                "dtype='bf16', max_shard_size='15MiB'); shutil.copy(sys.argv[1] + '/linear_eval.json', sys.argv[2])")
        if self.part(f"weights-{part}", [sys.executable, "-c", code, str(run_dir), str(self.view / target)],
                     [f"{target}/linear_eval.json", f"{target}/hub"], small=False):
            with self.lock:
                self.weights.append(target)
            self.pack()

    def train(self, run: str) -> None:
        """Train one run (recipes/reproduce.py in a work folder seeded with its budget's records in
        the view, so H-SCL(tau) finds its SCL), land its record, then its weights and release if it
        publishes one. A run trained again only for its release (its record is committed) lands
        its record under ``results/<budget>/release-runs/``, beside the committed one."""
        budget, method, seed = sprint_plan.split_run(run)
        name = f"{method}-s{seed}"
        part = f"{budget}-{name}"
        work = self.args.state / "work" / budget / name
        (work / "runs").mkdir(parents=True, exist_ok=True)
        for record in (self.view / sprint_plan.runs_dir(budget)).glob("*.json"):
            if not (work / "runs" / record.name).exists():
                shutil.copy(record, work / "runs" / record.name)
        state = sprint_plan.state_of(self.view)
        release = sprint_plan.releases_of(run, state)
        record = sprint_plan.record_landing(run, state)
        (self.view / record).parent.mkdir(parents=True, exist_ok=True)
        trained = work / "runs" / f"{name}.json"
        if trained.exists() and not (work / "runs" / name).is_dir():  # the committed record, not this call's run
            trained.unlink()
        run_budget = budget + ("-rehearsal" if self.args.rehearse else "")
        data = self.args.data / BUDGETS[budget].settings["dataset"]
        cmd = [sys.executable, "recipes/reproduce.py", "--budget", run_budget, "--data_dir", str(data),
               "--seeds", str(seed), "--methods", method, "--out", str(work), *(["--compile"] if self.compile else [])]
        copy = f"cp {shlex.quote(str(trained))} {shlex.quote(str(self.view / record))}"
        if not self.part(f"train-{part}", ["bash", "-c", f"{shlex.join(cmd)} && {copy}"], [record],
                         timings_from=record) or not release:
            return
        target = f"runs/gpu-weights/{budget}/{name}"
        self.land_weights(part, target, work / "runs" / name)
        folder = f"releases/{release[0]}"
        # the budget's own description names the run's data (a JPEG re-encoding) on the card and in the registry
        if self.part(f"release-{part}", [sys.executable, "-m", "hscl_zoo.cli", "release", str(work / "runs" / name),
                                         "--name", release[0], "--dtype", "bf16", "--out", str(self.view / folder),
                                         "--budget", BUDGETS[run_budget].description,
                                         "--device", self.args.device], [folder], small=False):
            with self.lock:  # the release holds the same bf16 weights, re-evaluated: it replaces them
                self.weights = [w for w in self.weights if w != target] + [folder]
            self.pack()

    def check(self, check: str) -> None:
        result = sprint_plan.CHECKS[check]
        py = [sys.executable]
        if check == "step-parity":
            cmd = py + ["benchmarks/cuda_parity.py", "--device", self.args.device, "--json", str(self.view / result)]
        else:
            sizes = ["32", "64"] if self.args.rehearse else ["512", "1024", "2048", "4096"]
            cmd = py + ["benchmarks/train_throughput.py", "--loss-memory", "--device", self.args.device,
                        "--memory-batches", *sizes, "--json", str(self.view / result)]
        self.part(check, cmd, [result])  # a failed parity row is a result too: its file lands

    def profile(self) -> None:
        """Profile the data path and the step first (once: a committed profile is read instead), and
        decide from it whether the runs compile."""
        result = PROFILE[self.args.rehearse]
        if not (self.view / result).is_file():
            name = next((n for n in ("cifar100", "cifar10") if (self.args.data / n).is_dir()), None)
            if name is None:
                return
            sizes = (["--rows", "64", "--backbone", "resnet10t", "--batch-size", "32", "--steps", "1", "--warmup", "1",
                      "--reruns", "1", "--profile-steps", "1"] if self.args.rehearse else
                     ["--bf16", "--channels-last", "--steps", "30", "--warmup", "5"])
            self.part("profile", [sys.executable, "benchmarks/data_path_profile.py", "--device", self.args.device,
                                  "--dataset", name, "--data-dir", str(self.args.data / name), "--compile", *sizes,
                                  "--json", str(self.view / result)], [result])
        if (self.view / result).is_file():
            self.compile = sprint_plan.compile_pays(json.loads((self.view / result).read_text()))
            self.log["compile"] = self.compile

    def run(self) -> int:
        started, simulated = time.perf_counter(), 0.0  # a rehearsal's clock counts the items' estimates only
        self.profile()
        elapsed = simulated if self.args.rehearse else time.perf_counter() - started
        state, costs = sprint_plan.state_of(self.view), sprint_plan.costs_of(self.view)
        self.log["plan"] = [item.to_json() for item in
                            sprint_plan.plan(state, costs, self.args.budget_seconds, elapsed=elapsed)]
        self.log["costs"] = {"pair": costs.pair, "measured": costs.measured, "release": costs.release, "checks": costs.checks,
                             "sources": costs.sources}
        self.pack()  # the plan and the carried code come back even if nothing finishes
        tried: list[str] = []
        while True:
            elapsed = simulated if self.args.rehearse else time.perf_counter() - started
            item = sprint_plan.next_item(sprint_plan.state_of(self.view), costs, elapsed, self.args.budget_seconds, tried)
            if item is None:
                break
            print(f"[sprint] {elapsed:.0f} s in: {item.name}", flush=True)
            if item.kind == "train":
                threads = [threading.Thread(target=self.train, args=(run,)) for run in item.runs]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                tried += item.runs
            else:
                self.check(item.check)
                tried.append(item.check)
            simulated += item.seconds
        self.log["finished"] = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        self.pack()
        print(f"[sprint] done: {len(self.log['parts'])} part(s), {self.failed} failed; packed into {self.out}", flush=True)
        return self.failed


def seed_view(view: Path) -> None:
    """Copy the committed files the planner reads into `view`, leaving any already there."""
    for pattern in SEEDED:
        for path in ROOT.glob(pattern):
            target = view / path.relative_to(ROOT)
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--state", type=Path, required=True, help="working folder (run folders, the view)")
    p.add_argument("--view", type=Path, help="the repository view (default: STATE/view, seeded from the checkout)")
    p.add_argument("--out", type=Path, required=True, help="the folder the device call returns")
    p.add_argument("--data", type=Path, required=True,
                   help="the folder of the datasets' parquet folders (cifar10/, cifar100/, as packed in .gpu/data)")
    p.add_argument("--rehearse", action="store_true", help="on the CPU at the rehearsal budget's sizes")
    p.add_argument("--budget-seconds", type=float, default=sprint_plan.CALL_SECONDS)
    p.add_argument("--source", type=Path, help="the packed source.json (commit, diff hash) naming the carried code")
    p.add_argument("--command", default="bash tools/gpu_sprint.sh next", help="the command, as the log records it")
    args = p.parse_args(argv)
    args.device = "cpu" if args.rehearse else "cuda"
    args.view = args.view or args.state / "view"
    if not args.data.is_dir():
        raise SystemExit(f"error: no data folder at {args.data}; run 'bash tools/gpu_sprint.sh pack' first or "
                         "set DATA to the folder holding cifar10/ and cifar100/.")
    source = json.loads(args.source.read_text()) if args.source else sprint_pack.source(ROOT)
    seed_view(args.view)
    return Sprint(args, source).run()


if __name__ == "__main__":
    raise SystemExit(main())
