"""What the next GPU call should do, decided from the files already committed (issues 40 and 48).

A lent GPU comes with about 15 minutes of machine time, one command of at most 10 minutes. This
module turns the repository's state (the GPU budgets' run records, the published releases, the
GPU check results) into an ordered plan that fits one call, so `bash tools/gpu_sprint.sh next`
never redoes finished work and spends the minutes on what users need most, first:

1. Runs, two side by side, in the order of `WORK` (declared once, below): the CIFAR-100 row at
   seed 0 (Table 1's order, H-SCL(beta), the flagship, first), then the flagship and SCL at 200
   epochs (``gpu-cifar100-200ep``), then the CIFAR-10 seed-0 encoders that have a run record but
   no release, then seeds 1 and 2 for paired verdicts. A seed-0 run is released
   (``<method>-<dataset>.<tag>``, its budget's tag in `RELEASE_TAGS`, bf16 shards). An
   H-SCL(tau) run takes its threshold schedule from the SCL run of its budget and seed, so it
   never starts beside that run, only after it. A run's estimate scales the newest measured pair
   by its budget's epochs x training images (`Costs.train`); a run whose estimate is over a whole
   call is not planned (`--show` says so): a run is never planned to be cut.
2. With at least `CHECKS_NEED_SECONDS` left: the checks never run on a GPU, the step-parity check
   with TF32 off and on (`benchmarks/cuda_parity.py`) and the loss-memory benchmark.

A run is named ``<budget>/<method>-s<seed>`` (``gpu-cifar100/hscl-beta-s0``). Everything here is a
pure function of a `State` (what exists) and `Costs` (how long things took, read from the
committed sprint logs), so the plan is unit-tested without a GPU; `state_of` and `costs_of` read
them from a checkout, also while its releases are hidden for a call (`sprint_pack.HIDDEN`).

    python tools/sprint_plan.py --show                  # the plan for the next calls
    python tools/sprint_plan.py --show --quote docs/benchmarks.md   # and its quote on the Benchmarks page
    python tools/sprint_plan.py --datasets              # the data the next call carries
    python tools/sprint_plan.py --elapsed 300 --skip step-parity   # the next item, one line
"""

from __future__ import annotations

import argparse
import json
import re
from datetime import datetime, timezone
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hscl_zoo.reproduction.budgets import BUDGETS, GPU_BUDGETS
from hscl_zoo._files import replace_block
from sprint_pack import HIDDEN  # tools/, the script's own folder

ROOT = Path(__file__).resolve().parents[1]
CALL_SECONDS = 540
"""The work one device call holds: 9 minutes, under the 10-minute limit of a command (the rest is
the machine's start, the install of the packed wheels and the files' way back)."""
CHECKS_NEED_SECONDS = 240
"""The checks start only with at least this much of the call left (the loss-memory benchmark was
cut once already, so it gets room rather than an estimate)."""
RELEASE_TAGS = {"gpu-cifar100": "gpu-30ep", "gpu-cifar10": "gpu-30ep", "gpu-cifar100-200ep": "gpu-200ep"}
"""The tag of each GPU budget's seed-0 releases (``hscl_zoo.zoo.registry.RELEASE_TAGS`` says each in
users' words)."""
TRAIN_IMAGES = {"cifar10": 50_000, "cifar100": 50_000}
GPU_PROFILE = "benchmarks/results/gpu_data_path.json"
"""A GPU's data-path profile (benchmarks/data_path_profile.py), measured by the first call of a
sprint before it trains: once newer than the newest sprint log, the pair's training time comes from
its end-to-end rate (`costs_of`)."""
COMPILE_GAIN = 1.05
"""Runs train compiled when a profile's compiled end-to-end rate beats the eager one by this factor."""
"""Training images of the GPU budgets' full datasets (a budget's ``subset`` overrides them)."""
METHOD_ORDER = ("scl", "hscl-beta", "hucl", "ucl", "hscl-tau")
"""Within a later seed (hscl_zoo.reproduction.budgets.RUN_ORDER): SCL before H-SCL(tau), which reads it."""
WORK: tuple[tuple[str, tuple[int, ...], tuple[str, ...]], ...] = (
    ("gpu-cifar100", (0,), ("hscl-beta", "scl", "hucl", "ucl", "hscl-tau")),
    ("gpu-cifar100-200ep", (0,), ("hscl-beta", "scl")),
    ("gpu-cifar10", (0,), ("ucl", "hucl", "hscl-tau", "scl", "hscl-beta")),
    ("gpu-cifar100", (1, 2), METHOD_ORDER),
    ("gpu-cifar10", (1, 2), METHOD_ORDER),
)
"""The sprint's runs in the order users need them, as (budget, seeds, methods): the flagship's
CIFAR-100 row first (Table 1's order: H-SCL(beta), SCL, H-UCL, UCL, H-SCL(tau)), then the flagship
and its comparator at 200 epochs, then CIFAR-10 at seed 0 (whatever lacks a record or a release),
then the seeds that pair the verdicts."""
RELEASES_REGISTRY = "hscl_zoo/zoo/released.json"
PLAN_BLOCK = "gpu-plan"
"""The marker name of the plan's quote on a page: ``<!-- results:gpu-plan -->``."""
CHECKS = {"step-parity": "benchmarks/results/gpu_step_parity.json",
          "loss-memory": "benchmarks/results/gpu_loss_memory.json"}
"""Each check and the file that records it once it ran on a GPU (where its result lands)."""


def runs_dir(budget: str) -> str:
    """Where a budget's run records live: ``results/<budget>/runs``."""
    return f"results/{budget}/runs"


def split_run(run: str) -> tuple[str, str, int]:
    """``gpu-cifar100/hscl-beta-s0`` -> ("gpu-cifar100", "hscl-beta", 0)."""
    budget, _, name = run.partition("/")
    method, _, seed = name.rpartition("-s")
    return budget, method, int(seed)


def record_path(run: str) -> str:
    """The repository path of a run's record: ``results/<budget>/runs/<method>-s<seed>.json``."""
    budget, _, name = run.partition("/")
    return f"{runs_dir(budget)}/{name}.json"


def record_landing(run: str, state: State) -> str:
    """Where a run's record lands: its budget's runs folder, or ``results/<budget>/release-runs/``
    when a record of it is committed already (a run trained again for its missing release), so
    that the committed record is never overwritten."""
    if run not in state.runs:
        return record_path(run)
    budget, _, name = run.partition("/")
    return f"results/{budget}/release-runs/{name}.json"


def zoo_name(run: str) -> str:
    """``gpu-cifar100/hscl-beta-s0`` -> ``hscl-beta-cifar100``: the zoo name the run trains."""
    budget, method, _ = split_run(run)
    return f"{method}-{BUDGETS[budget].settings['dataset']}"


def release_name(run: str) -> str:
    """``gpu-cifar100/hscl-beta-s0`` -> ``hscl-beta-cifar100.gpu-30ep``: the zoo entry the run
    trains, tagged with its budget's `RELEASE_TAGS` entry."""
    return f"{zoo_name(run)}.{RELEASE_TAGS[split_run(run)[0]]}"


def image_epochs(budget: str) -> int:
    """Training images a run of `budget` goes through, epochs x images: what its time scales with."""
    settings = BUDGETS[budget].settings
    return settings["epochs"] * (settings.get("subset") or TRAIN_IMAGES[settings["dataset"]])


@dataclass(frozen=True)
class State:
    """What exists: finished runs ("gpu-cifar10/ucl-s0", ...), published releases
    ("ucl-cifar10.gpu-30ep", ...) and the checks already run on a GPU."""

    runs: frozenset[str] = frozenset()
    checks: frozenset[str] = frozenset()
    releases: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Costs:
    """Seconds each kind of item takes on the GPU, and the file each number came from. `pair`: the
    seconds two runs of the budget `measured` took side by side (the slower of the two)."""

    pair: float
    release: float
    checks: dict[str, float]
    sources: dict[str, str] = field(default_factory=dict)
    measured: str = "gpu-cifar100"

    def train(self, budget: str) -> float:
        """Seconds a run of `budget` takes beside another: `pair` scaled by its epochs x images."""
        return self.pair * image_epochs(budget) / image_epochs(self.measured)


@dataclass(frozen=True)
class Item:
    """One unit of a call's work. `must_fit`: the seconds that have to fit the time left for it
    to start (a pair's training); `seconds`: the whole item's estimate, releases included, which
    are packed as they land and so need not fit (a cut call keeps the runs). `releases`: the
    zoo entries its runs publish."""

    kind: str
    runs: tuple[str, ...] = ()
    check: str | None = None
    seconds: float = 0.0
    must_fit: float = 0.0
    releases: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.check if self.kind == "check" else "train " + " ".join(self.runs)

    def to_json(self) -> dict:
        return {"kind": self.kind, "name": self.name, "runs": list(self.runs), "check": self.check,
                "releases": list(self.releases), "seconds": round(self.seconds, 1), "must_fit": round(self.must_fit, 1)}


def priority() -> list[str]:
    """Every run the sprint wants, most valuable first (`WORK` expanded, each run once)."""
    runs = [f"{budget}/{method}-s{seed}" for budget, seeds, methods in WORK for seed in seeds for method in methods]
    return list(dict.fromkeys(runs))


def releases_of(run: str, state: State) -> tuple[str, ...]:
    """The release a seed-0 run publishes: its tagged name, unless its zoo name holds a release of
    a budget as long or longer on its dataset (the repository keeps one release per zoo name, the
    best: a 200-epoch release replaces the 30-epoch one), or the run has its record and its zoo
    name holds any GPU release (the better one was kept)."""
    budget, _, seed = split_run(run)
    settings = BUDGETS[budget].settings
    held = {tag for name in state.releases for base, _, tag in [name.partition(".")] if base == zoo_name(run)}
    longer = {RELEASE_TAGS[b] for b in RELEASE_TAGS if BUDGETS[b].settings["dataset"] == settings["dataset"]
              and BUDGETS[b].settings["epochs"] >= settings["epochs"]}
    if seed != 0 or held & longer or (run in state.runs and held & set(RELEASE_TAGS.values())):
        return ()
    return (release_name(run),)


def missing(run: str, state: State) -> bool:
    """Whether `run` is still to train: no record yet, or a seed-0 run whose release is missing
    (the CIFAR-10 SCL and H-SCL(beta) weights of the first GPU session were lost)."""
    return run not in state.runs or bool(releases_of(run, state))


def too_long(state: State, costs: Costs, budget: float = CALL_SECONDS) -> list[str]:
    """The missing runs whose estimate is over a whole call of `budget` seconds: never planned."""
    return [r for r in priority() if missing(r, state) and costs.train(split_run(r)[0]) > budget]


def ready(run: str, done: Iterable[str]) -> bool:
    """Whether `run` can start now: an H-SCL(tau) run needs the SCL record of its budget and seed."""
    budget, method, seed = split_run(run)
    return method != "hscl-tau" or f"{budget}/scl-s{seed}" in set(done)


def next_item(state: State, costs: Costs, elapsed: float, budget: float = CALL_SECONDS,
              skip: Iterable[str] = ()) -> Item | None:
    """The most valuable missing item that may start `elapsed` seconds into a call of `budget`
    seconds, or None. Items named in `skip` (tried this call) are passed over."""
    skip = set(skip) | set(too_long(state, costs, budget))
    left = budget - elapsed
    todo = [r for r in priority() if missing(r, state) and r not in skip and ready(r, state.runs)]
    # `ready` reads finished runs only: H-SCL(tau) never pairs with its own SCL
    for pair in (tuple(todo[:2]), tuple(todo[:1])):
        seconds = max((costs.train(split_run(run)[0]) for run in pair), default=0.0)
        if pair and seconds <= left:
            releases = tuple(name for run in pair for name in releases_of(run, state))
            return Item("train", pair, seconds=seconds + (costs.release if releases else 0.0), must_fit=seconds,
                        releases=releases)
    if left < CHECKS_NEED_SECONDS:
        return None
    for check in CHECKS:
        if check not in state.checks and check not in skip and costs.checks[check] <= left:
            return Item("check", check=check, seconds=costs.checks[check], must_fit=costs.checks[check])
    return None


def done_after(state: State, item: Item) -> State:
    """The state once `item` has landed."""
    if item.kind == "check":
        return State(state.runs, state.checks | {item.check}, state.releases)
    return State(state.runs | set(item.runs), state.checks, state.releases | set(item.releases))


def plan(state: State, costs: Costs, budget: float = CALL_SECONDS, elapsed: float = 0.0) -> list[Item]:
    """The items one call does in order, if each takes its estimate."""
    items: list[Item] = []
    while (item := next_item(state, costs, elapsed, budget)) is not None:
        items.append(item)
        state, elapsed = done_after(state, item), elapsed + item.seconds
    return items


def plan_calls(state: State, costs: Costs, budget: float = CALL_SECONDS, limit: int = 20) -> list[list[Item]]:
    """The plan of each of the next calls until nothing is missing (at most `limit` calls)."""
    calls = []
    while len(calls) < limit and (items := plan(state, costs, budget)):
        calls.append(items)
        for item in items:
            state = done_after(state, item)
    return calls


def datasets_of(items: Iterable[Item]) -> list[str]:
    """The datasets a call's items train on, in first-use order: what the call must carry."""
    names = [BUDGETS[split_run(run)[0]].settings["dataset"] for item in items for run in item.runs]
    return list(dict.fromkeys(names))


def state_of(root: Path = ROOT) -> State:
    """The State of a checkout (or of a sprint's view of one): run records under each GPU
    budget's runs folder, the releases the registry lists or the view holds, and each check
    whose result file exists."""
    runs = frozenset(f"{budget}/{p.stem}" for budget in GPU_BUDGETS
                     for p in (root / runs_dir(budget)).glob("*-s[0-9]*.json"))
    registry = root / RELEASES_REGISTRY
    releases = set(json.loads(registry.read_text())) if registry.is_file() else set()
    releases |= {p.parent.name for folder in (root / "releases", root / HIDDEN / "releases")
                 for p in folder.glob("*/eval.json")}
    checks = frozenset(name for name, path in CHECKS.items() if (root / path).is_file())
    return State(runs, checks, frozenset(releases))


def _newest_parts(root: Path, prefix: str) -> tuple[list[dict], str] | None:
    """The timed parts whose name starts with `prefix` of the newest sprint log in
    benchmarks/results/ (gpu_sprint_*.json, h100_sprint.json) holding any, and that log's path.
    Newest by the log's ``started`` stamp, then its file name; a log without a stamp predates them."""
    logs = []
    for path in (root / "benchmarks" / "results").glob("*sprint*.json"):
        log = json.loads(path.read_text())
        parts = [p for p in log.get("parts", []) if p.get("part", "").startswith(prefix)
                 and isinstance(p.get("seconds"), (int, float)) and not isinstance(p.get("seconds"), bool)]
        if parts:
            logs.append((str(log.get("started") or ""), path.name, parts, path.relative_to(root).as_posix()))
    if not logs:
        return None
    *_, parts, path = max(logs, key=lambda log: log[:2])
    return parts, path


def _measured(root: Path, prefix: str) -> tuple[float, str] | None:
    """Longest `seconds` of the newest sprint log's parts named `prefix`..., and the log's path."""
    newest = _newest_parts(root, prefix)
    return None if newest is None else (max(float(p["seconds"]) for p in newest[0]), newest[1])


def part_budget(part: str) -> str:
    """The GPU budget a training part trained: ``train-gpu-cifar100-scl-s0`` -> gpu-cifar100; the
    first sprint's parts (``train-ucl-s0``) name none: gpu-cifar10, the only budget it trained."""
    named = [b for b in GPU_BUDGETS if re.match(rf"train-{re.escape(b)}-[a-z-]+-s\d+$", part)]
    return max(named, key=len) if named else "gpu-cifar10"


def compile_pays(profile: dict) -> bool:
    """Whether a profile (data_path_profile.py's JSON) measured the compiled end to end at least
    `COMPILE_GAIN` times the eager one: the runs then train compiled."""
    configurations = profile.get("configurations", {})
    if "compiled" not in configurations or "eager" not in configurations:
        return False
    rate = lambda name: configurations[name]["views_per_second"]["e2e"]  # noqa: E731
    return rate("compiled") >= COMPILE_GAIN * rate("eager")


def profile_rate(root: Path) -> tuple[float, str] | None:
    """The end-to-end views/s the runs will train at by the GPU profile under `root` (the compiled
    rate when compiling pays), and the profile's time as a sprint log stamps it; None without one."""
    path = root / GPU_PROFILE
    if not path.is_file():
        return None
    profile = json.loads(path.read_text())
    configuration = "compiled" if compile_pays(profile) else "eager"
    stamp = datetime.fromisoformat(profile["measured"]).astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return float(profile["configurations"][configuration]["views_per_second"]["e2e"]), stamp


def pair_from_profile(rate: float, budget: str, outside: float) -> float:
    """Seconds of two runs of `budget` side by side on one GPU at `rate` views/s end to end (they
    share it: each trains at half the rate), plus the `outside` seconds a run spends outside its
    epochs (start-up, monitor, checkpoints, evaluation)."""
    views = image_epochs(budget) * BUDGETS[budget].settings.get("views", 2)
    return outside + 2 * views / rate


def costs_of(root: Path = ROOT) -> Costs:
    """Costs from the committed files, each from the newest sprint log that measured it (the
    hardware's pace now, not the slowest call ever logged). A pair: the training part of that log
    slowest for its budget's epochs x images, as measured at that budget. A release: the longest
    release part of the newest log with one, else the longest time a run record spent outside its
    epochs (start-up and final evaluation: a release re-extracts the same features, so this bounds
    it). The parity check: its measured part; the loss-memory benchmark has none (cut on the first
    GPU), so it gets the checks' whole allowance."""
    newest = _newest_parts(root, "train-")
    if newest is None:
        raise SystemExit(f"error: no sprint log under {root / 'benchmarks/results'} times a training part; "
                         "run a sprint call first.")
    slowest = max(newest[0], key=lambda p: p["seconds"] / image_epochs(part_budget(p["part"])))
    train, measured = (float(slowest["seconds"]), newest[1]), part_budget(slowest["part"])
    profiled = profile_rate(root)
    log_stamp = str(json.loads((root / newest[1]).read_text()).get("started") or "")
    if profiled is not None and profiled[1] > log_stamp:
        outside = max((p.get("timings") or {}).get("outside_training", 0.0) for p in newest[0])
        train = (pair_from_profile(profiled[0], measured, outside),
                 f"{GPU_PROFILE}, {profiled[0]:,.0f} views/s, + {outside:.0f} s outside training from {newest[1]}")
    release = _measured(root, "release-")
    if release is None:
        outside = [(r["wall_seconds"] - sum(h.get("wall_seconds", h["epoch_seconds"]) for h in r["history"]), p)
                   for budget in GPU_BUDGETS for p in sorted((root / runs_dir(budget)).glob("*.json"))
                   for r in [json.loads(p.read_text())]]
        if not outside:
            raise SystemExit(f"error: no GPU run record under {root / 'results'} to estimate a release from.")
        seconds, path = max(outside)
        release = (seconds, path.relative_to(root).as_posix())
    parity = _measured(root, "parity") or _measured(root, "step-parity")
    checks = {"step-parity": parity[0] if parity else float(CHECKS_NEED_SECONDS),
              "loss-memory": float(CHECKS_NEED_SECONDS)}
    return Costs(train[0], release[0], checks, {"pair": train[1], "release": release[1],
                                                "step-parity": parity[1] if parity else "none measured"}, measured)


def show(calls: list[list[Item]], costs: Costs, unplanned: Iterable[str] = (), budget: float = CALL_SECONDS) -> str:
    """The plan of the next calls as a Markdown table, with the estimates it rests on and the runs
    left out because one call cannot hold them (`too_long`)."""
    measured = BUDGETS[costs.measured].settings["epochs"]
    lines = [f"Estimates: a pair of {costs.measured} runs ({measured} epochs) {costs.pair:.0f} s "
             f"(`{costs.sources['pair']}`, the newest measured), other budgets scaled by epochs x images; "
             f"a release {costs.release:.0f} s (`{costs.sources['release']}`); each call holds {budget:.0f} s of work.",
             "", "| call | work |", "|---:|---|"]
    for number, items in enumerate(calls, 1):
        lines.append(f"| {number} | " + "; ".join(
            item.name + (f" (+ release {', '.join(item.releases)})" if item.releases else "") for item in items) + " |")
    unplanned = list(unplanned)
    if unplanned:
        lines += ["", "Not planned: " + ", ".join(
            f"{run} (about {costs.train(split_run(run)[0]):.0f} s)" for run in unplanned)
            + f", over the {budget:.0f} s one call holds at that rate; a run is never planned to be cut."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", type=Path, default=ROOT, help="checkout (or sprint view) whose files say what exists")
    p.add_argument("--elapsed", type=float, default=0.0, help="seconds of the call already spent")
    p.add_argument("--budget-seconds", type=float, default=CALL_SECONDS)
    p.add_argument("--skip", nargs="*", default=[], help="items tried this call (run or check names)")
    p.add_argument("--show", action="store_true", help="print the plan of every call until nothing is missing")
    p.add_argument("--datasets", action="store_true", help="print the datasets the next call trains on, one a line")
    p.add_argument("--quote", type=Path, nargs="+", default=[],
                   help="with --show: also rewrite these pages' <!-- results:gpu-plan --> block (docs/benchmarks.md)")
    args = p.parse_args(argv)
    if args.elapsed < 0 or args.budget_seconds <= 0:
        raise SystemExit("error: --elapsed must be >= 0 and --budget-seconds > 0 (seconds of one device call).")
    state, costs = state_of(args.root), costs_of(args.root)
    if args.show:
        text = show(plan_calls(state, costs, args.budget_seconds), costs, too_long(state, costs, args.budget_seconds),
                    args.budget_seconds)
        for page in args.quote:
            page.write_text(replace_block(page.read_text(encoding="utf-8"), PLAN_BLOCK, text), encoding="utf-8")
        print(text, end="")
        return 0
    if args.datasets:
        print("".join(f"{name}\n" for name in datasets_of(plan(state, costs, args.budget_seconds))), end="")
        return 0
    item = next_item(state, costs, args.elapsed, args.budget_seconds, args.skip)
    if item is not None:
        print(json.dumps(item.to_json()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
