"""Mutation testing of the modules users' results depend on (issue 25): how many small changes to
the code (an operator flipped, a constant moved by one, an argument dropped) the tests notice.

Tool: mutmut 3 (maintained, configured in pyproject.toml's `[tool.mutmut]`), chosen because it
imports the test session once and forks one worker per mutant, so torch's seconds of import are
paid once per module rather than once per mutant, and because each mutant only runs the tests
that called the mutated function.

Each target of TARGETS runs in its own workspace, build/mutation/<target>/ (links to the checkout
and a pyproject.toml whose `[tool.mutmut]` is the repository's with `only_mutate` set to the target
and the tests restricted to the target's test files), from scratch every time, one worker. The
report, benchmarks/results/mutation.json and the generated mutation.md beside it, keeps per file
the mutant counts, the score killed / (mutants - equivalent), the commit measured (with "+dirty"
for uncommitted code), the date, the wall time, every surviving mutant (file:line and diff) and
every mutant tools/mutation_equivalents.yaml declares equivalent, with its reason.

    python tools/mutation.py --module hscl_zoo/reproduction/statistics.py   # one target
    python tools/mutation.py --all                                        # every target (hours)
    python tools/mutation.py --count --all       # mutants per file, without running any test
    python tools/mutation.py --report-only       # re-render mutation.md after editing the equivalents
    python tools/mutation.py --merge ../wt/benchmarks/results/mutation.json  # take in a worktree's newer runs

Needs the `mutation` extra (`pip install -e .[mutation]`). A measurement, not a CI step.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from importlib.metadata import version
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "mutation.json"
EQUIVALENTS = ROOT / "tools" / "mutation_equivalents.yaml"
WORK = ROOT / "build" / "mutation"

# Each target (a module; every file of hscl_zoo/losses/ is one) and the test files that exercise it.
LOSS_TESTS = (
    "tests/test_losses.py", "tests/test_unlabelled_loss.py", "tests/test_proposition_2_masses.py",
    "tests/test_negative_cosines.py", "tests/test_dropin_losses.py", "tests/test_precision.py",
    "tests/test_partial_labels.py", "tests/test_diagnostics.py", "tests/test_diagnostics_meter.py",
    "tests/test_method_table.py", "tests/test_queue.py", "tests/test_distributed.py", "tests/test_extending.py",
    "tests/test_diagnostics_contract.py", "tests/test_reference_loss.py", "tests/test_hardening_and_methods_contract.py",
    "tests/test_objective_contract.py",
)
LOSS_FILES = tuple(sorted(f.relative_to(ROOT).as_posix() for f in (ROOT / "hscl_zoo" / "losses").glob("*.py")
                          if "def " in f.read_text()))  # files without a function have no mutant
REPRODUCTION_TESTS = ("tests/test_reproduce.py", "tests/test_reproduction_rules.py")
EVALUATION_TESTS = ("tests/test_evaluation.py", "tests/test_transfer.py", "tests/test_linear_probe_contract.py",
                    "tests/test_knn_and_features_contract.py", "tests/test_evaluate_protocols_contract.py",
                    "tests/test_signatures.py")
HUB_TESTS = ("tests/test_hub.py", "tests/test_hub_sources.py", "tests/test_hub_load.py", "tests/test_hub_contract.py",
             "tests/test_hostile_model_folders.py", "tests/test_registry.py")
TARGETS: dict[str, tuple[str, ...]] = {
    **{loss_file: LOSS_TESTS for loss_file in LOSS_FILES},  # one target per file: one can be re-measured alone
    "hscl_zoo/training/gradient_cache.py": ("tests/test_gradient_cache.py", "tests/test_gradient_cache_recipe.py"),
    "hscl_zoo/training/steps.py": ("tests/test_gradient_cache_recipe.py", "tests/test_large_batch_recipe.py"),
    "hscl_zoo/reproduction/statistics.py": REPRODUCTION_TESTS,
    "hscl_zoo/reproduction/summary.py": REPRODUCTION_TESTS,
    **dict.fromkeys(("hscl_zoo/evaluation.py", "hscl_zoo/features.py", "hscl_zoo/probes.py"), EVALUATION_TESTS),
    **dict.fromkeys(("hscl_zoo/zoo/hub.py", "hscl_zoo/zoo/sources.py"), HUB_TESTS),
    "hscl_zoo/_files.py": (*HUB_TESTS, "tests/test_files.py", "tests/test_reproduce.py"),
}
GOAL = 0.9  # issue 25: at least 90 % of the non-equivalent mutants of every file killed
KINDS = ("equivalent", "gpu-only")  # what an explained survivor is (mutation_equivalents.yaml's `kind`)
CODE_NOW = {True: "same", False: "changed", None: "unknown"}  # the report's `code now` column
HUNK = re.compile(r"^@@ -(\d+)")


def target_files(target: str) -> list[str]:
    """The .py files of a target, as paths relative to the repository root."""
    path = ROOT / target
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return [str(f.relative_to(ROOT)) for f in files]


def change_lines(diff: str) -> list[str]:
    """The removed and added lines of a mutant's diff, stripped: what a mutant is, independent of
    its number (which moves whenever the function above it gains a mutant)."""
    return [line[0] + line[1:].strip() for line in diff.splitlines()
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def function_of(mutant: str) -> str:
    """`pkg.module.x_name__mutmut_3` -> `pkg.module.x_name`: the mutated function, as mutmut mangles it."""
    return mutant.partition("__mutmut_")[0]


def function_node(source: str, mangled: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The definition in `source` of a function as mutmut mangles its name (`x_name`, or
    `xǁClassǁmethod`); None when the module has no such function."""
    name, cls = (mangled.split("ǁ")[2], mangled.split("ǁ")[1]) if "ǁ" in mangled else (mangled[2:], None)
    tree = ast.parse(source)
    scope = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls), None) if cls else tree
    if scope is None:
        return None
    return next((n for n in ast.walk(scope) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name), None)


def mutant_line(source: str, mutant: str, diff: str) -> int | None:
    """The source line a mutant changes: the first removed line of its diff, looked up inside the
    mutated function (the hunk's offset from the function's first line picks among equal lines)."""
    node = function_node(source, function_of(mutant).rpartition(".")[2])
    lines = diff.splitlines()
    start = next((i for i, line in enumerate(lines) if HUNK.match(line)), None)
    offset, removed = 0, None
    for line in lines[start + 1:] if start is not None else []:
        if line.startswith("-"):
            removed = line[1:].strip()
            break
        offset += not line.startswith("+")
    if node is None or removed is None:
        return None
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    expected = first + int(HUNK.match(lines[start]).group(1)) - 1 + offset
    source_lines = source.splitlines()
    candidates = [i + 1 for i in range(first - 1, node.end_lineno) if source_lines[i].strip() == removed]
    return min(candidates, key=lambda n: abs(n - expected)) if candidates else expected


def workspace_dir(target: str) -> Path:
    return WORK / target.removesuffix(".py").replace("/", "-")


def workspace(target: str) -> Path:
    """A fresh build/mutation/<target>/: links to the checkout's top-level entries and a
    pyproject.toml with the repository's pytest and mutmut settings, mutmut's narrowed to `target`
    and its tests (mutmut reads its configuration from the working directory)."""
    ws = workspace_dir(target)
    shutil.rmtree(ws, ignore_errors=True)
    ws.mkdir(parents=True)
    for entry in ROOT.iterdir():
        if not entry.name.startswith(".") and entry.name not in ("build", "mutants", "pyproject.toml"):
            (ws / entry.name).symlink_to(entry)
    if (ROOT.parent / "shared").is_dir():  # tests/conftest.py finds the test datasets beside the checkout
        (ws / "shared").symlink_to(ROOT.parent / "shared")
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    mutmut = {**tool["mutmut"], "only_mutate": target_files(target),
              "pytest_add_cli_args_test_selection": list(TARGETS[target]), "use_git_change_detection": False}
    pytest_options = dict(tool["pytest"]["ini_options"])
    # one process: mutmut records which tests call a mutant in its own process, which xdist's workers are not
    pytest_options["addopts"] = re.sub(r"-n \S+|--dist \S+", "", pytest_options.get("addopts", "")).strip()
    tables = {"tool.pytest.ini_options": pytest_options, "tool.mutmut": mutmut}
    # JSON strings, lists of strings and booleans are valid TOML values.
    (ws / "pyproject.toml").write_text("\n".join(
        f"[{name}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in table.items())
        for name, table in tables.items()))
    return ws


def mutmut(ws: Path, *args: str, log: Path | None = None) -> str:
    """Run mutmut's command line in a workspace (one worker, one torch thread) and return its output,
    written as it comes to `log` when given (a long run can be followed there)."""
    # mutmut runs the tests from its copy of the code (mutants/), which has no releases/: the
    # package reads the checkout's releases and results, as tests/conftest.py would have it.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HSCL_ZOO_ROOT": str(ROOT)}
    cmd = [sys.executable, "-c", "from mutmut.__main__ import cli; cli()", *args]
    if log is None:
        proc = subprocess.run(cmd, cwd=ws, env=env, capture_output=True, text=True)
        output = proc.stdout if proc.returncode == 0 else proc.stdout + proc.stderr
    else:
        with log.open("w") as out:
            proc = subprocess.run(cmd, cwd=ws, env=env, stdout=out, stderr=subprocess.STDOUT)
        output = log.read_text()
    if proc.returncode != 0:
        raise SystemExit(f"mutmut {' '.join(args)} failed in {ws} (exit {proc.returncode}); its output ends:\n{output[-4000:]}")
    return output


def measured_commit(root: Path = ROOT) -> str | None:
    """The commit whose code a run measures, "+dirty" when anything but this report differs from it
    (the report itself changes with every target a checkout runs, and is not code)."""
    from hscl_zoo._provenance import code_commit

    report = [f":(exclude){RESULTS.relative_to(ROOT).with_suffix(ext).as_posix()}" for ext in (".json", ".md")]
    return code_commit(root, paths=(".", *report))


def run_target(target: str) -> dict[str, dict[str, Any]]:
    """Mutation-test one target from scratch; per file, the raw measurement (killed count and every
    mutant not killed, with its status, line and diff)."""
    from mutmut.stats import status_by_exit_code
    from hscl_zoo._provenance import utc_now

    ws = workspace(target)
    commit, date = measured_commit(ROOT), utc_now()
    started = time.perf_counter()
    mutmut(ws, "run", "--max-children", "1", log=ws / "mutmut-run.log")
    seconds = time.perf_counter() - started
    files = {}
    for file in target_files(target):
        meta = ws / "mutants" / f"{file}.meta"
        codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.is_file() else {}
        statuses = {mutant: status_by_exit_code[code] for mutant, code in codes.items()}
        not_killed = []
        for mutant in sorted(m for m, s in statuses.items() if s != "killed"):
            diff = mutmut(ws, "show", mutant).split("\n", 1)[1].strip()
            not_killed.append({"id": mutant, "status": statuses[mutant], "diff": diff,
                               "line": mutant_line((ROOT / file).read_text(), mutant, diff)})
        files[file] = {"target": target, "tests": list(TARGETS[target]), "commit": commit, "date": date,
                       "target_seconds": round(seconds, 1), "mutants": len(statuses),
                       "killed": sum(s == "killed" for s in statuses.values()), "not_killed": not_killed}
    return files


def load_equivalents(path: Path = EQUIVALENTS) -> list[dict[str, Any]]:
    """The hand-written list of explained survivors: function (mutmut's mangled name), change (the
    diff's removed and added lines, stripped), a one-line reason and, optionally, a kind:
    "equivalent" (the default: no program behaviour changes; left out of the score) or "gpu-only"
    (behaviour changes only on a CUDA device, which this machine lacks; still a survivor)."""
    entries = (yaml.safe_load(path.read_text()) or []) if path.is_file() else []
    for entry in entries:
        if not {"function", "change", "reason"} <= set(entry) <= {"function", "change", "reason", "kind"} \
                or not str(entry["reason"]).strip() or entry.get("kind", KINDS[0]) not in KINDS:
            raise SystemExit(f"{path}: entry {entry} needs function, change, a non-empty reason and, optionally, "
                             f"a kind out of {', '.join(KINDS)}")
    return [{"kind": KINDS[0], **entry} for entry in entries]


def stale_equivalents(entries: list[dict[str, Any]], root: Path = ROOT) -> list[str]:
    """The explanations that no longer describe the code at `root`: their module or function is
    gone, or a line their mutant removes is no longer in that function (code moved or changed, so
    the mutant is judged afresh). One line each: the function and what is missing."""
    stale = []
    for entry in entries:
        module, _, mangled = entry["function"].rpartition(".")
        path = root / (module.replace(".", "/") + ".py")
        source = path.read_text() if path.is_file() else ""
        node = function_node(source, mangled)
        if node is None:
            stale.append(f"{entry['function']}: no such function in {path.relative_to(root)}")
            continue
        body = {line.strip() for line in source.splitlines()[node.lineno - 1:node.end_lineno]}
        gone = next((line[1:] for line in entry["change"] if line.startswith("-") and line[1:] not in body), None)
        if gone is not None:
            stale.append(f"{entry['function']}: no longer has the line {gone!r}")
    return stale


def verdict(measured: dict[str, Any], equivalents: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts by status, the survivors (with the reason of those only a GPU can kill) and the
    equivalent mutants of one file's measurement, and its score: killed / (mutants - equivalent),
    None when every mutant is equivalent."""
    survivors, equivalent = [], []
    for mutant in measured["not_killed"]:
        entry = next((e for e in equivalents if mutant["status"] == "survived"
                      and e["function"] == function_of(mutant["id"]) and e["change"] == change_lines(mutant["diff"])), None)
        if entry is None:
            survivors.append(mutant)
        elif entry.get("kind") == "gpu-only":
            survivors.append({**mutant, "reason": entry["reason"], "gpu_only": True})
        else:
            equivalent.append({**mutant, "reason": entry["reason"]})
    counts = Counter(m["status"] for m in survivors)
    counts.update(killed=measured["killed"], equivalent=len(equivalent))
    if gpu_only := sum("gpu_only" in m for m in survivors):
        counts["gpu only"] = gpu_only
    scored = measured["mutants"] - len(equivalent)
    return {"counts": dict(sorted(counts.items())), "score": measured["killed"] / scored if scored else None,
            "survivors": survivors, "equivalents": equivalent}


def render(report: dict[str, Any]) -> str:
    """mutation.md: the score table, then each file's surviving and equivalent mutants."""
    out = ["# Mutation testing", "",
           f"Written by `python tools/mutation.py` ({report['tool']}); do not edit. Score = killed / "
           "(mutants - equivalent); equivalent mutants are declared, with a reason, in "
           "`tools/mutation_equivalents.yaml`, as are the survivors that change behaviour only on a CUDA "
           "device (GPU-only: they stay survivors, and count against the score). Goal: a score of at least "
           f"{GOAL:.0%} on every file. `code now` compares each file with its code at the commit measured, "
           f"in the checkout that wrote this report ({report.get('checkout') or 'unknown'}): `same` means the score "
           "holds for that checkout's code.", "",
           "| file | mutants | killed | survived | of which GPU-only | timeout | no tests | equivalent | score | goal met | commit | code now | date | seconds (target) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---:|"]
    for file, entry in report["files"].items():
        c, score = entry["verdict"]["counts"], entry["verdict"]["score"]
        m = entry["measured"]
        out.append(f"| {file} | {m['mutants']} | {c.get('killed', 0)} | {c.get('survived', 0)} | {c.get('gpu only', 0)} | {c.get('timeout', 0)} "
                   f"| {c.get('no tests', 0)} | {c.get('equivalent', 0)} | {'-' if score is None else f'{100 * score:.1f} %'} "
                   f"| {'yes' if score is None or score >= GOAL else 'no'} | {m['commit'][:12]}{'+dirty' if m['commit'].endswith('+dirty') else ''} "
                   f"| {CODE_NOW[entry.get('code_now')]} | {m['date'][:10]} "
                   f"| {m['target_seconds']:.0f} |")
    for file, entry in report["files"].items():
        for title, key in (("Surviving mutants", "survivors"), ("Equivalent mutants", "equivalents")):
            mutants = entry["verdict"][key]
            if mutants:
                out += ["", f"## {title}: {file}", ""]
            for mutant in mutants:
                why = f"{mutant['status']}, only a GPU can kill it: {mutant['reason']}" if mutant.get("gpu_only") else \
                    mutant.get("reason") or mutant["status"]
                out += [f"- `{file}:{mutant['line']}` {mutant['id']} ({why})", "",
                        "  ```diff", *(f"  {line}" for line in change_lines(mutant["diff"])), "  ```"]
    return "\n".join(out) + "\n"


def unchanged_since(file: str, commit: str, root: Path = ROOT) -> bool | None:
    """Whether `file` in the checkout at `root` (uncommitted edits included) is the file at `commit`;
    None when that cannot be told (a measurement of uncommitted code, or a commit git does not know)."""
    if commit.endswith("+dirty"):
        return None
    proc = subprocess.run(["git", "diff", "--quiet", commit, "--", file], cwd=root, capture_output=True)
    return {0: True, 1: False}.get(proc.returncode)


def write_report(measured: dict[str, dict[str, Any]], tool: str, path: Path = RESULTS,
                 equivalents: Path = EQUIVALENTS) -> dict[str, Any]:
    """Merge new measurements into the report at `path` (other files keep theirs), judge every file
    against the equivalents file, and write the JSON and its markdown rendering."""
    old = json.loads(path.read_text())["files"] if path.is_file() else {}
    merged = {**{f: e["measured"] for f, e in old.items()}, **measured}
    declared = load_equivalents(equivalents)
    from hscl_zoo._provenance import code_commit

    report = {"tool": tool, "score": "killed / (mutants - equivalent)", "checkout": code_commit(ROOT, paths=()),
              "files": {f: {"measured": m, "verdict": verdict(m, declared), "code_now": unchanged_since(f, m["commit"])}
                        for f, m in sorted(merged.items())}}
    path.write_text(json.dumps(report, indent=1) + "\n")
    path.with_suffix(".md").write_text(render(report))
    return report


def newer_measurements(others: list[Path], path: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Per file, the newest raw measurement among the reports `others` (other checkouts', e.g.
    worktrees that ran in the background) when it is newer than the report at `path`'s: what to
    merge into it."""
    mine = json.loads(path.read_text())["files"] if path.is_file() else {}
    newest = {file: entry["measured"] for file, entry in mine.items()}
    taken = {}
    for other in others:
        for file, entry in json.loads(other.read_text())["files"].items():
            if file not in newest or entry["measured"]["date"] > newest[file]["date"]:
                newest[file] = taken[file] = entry["measured"]
    return taken


def count(target: str) -> dict[str, int]:
    """Mutants per file of a target, generated as `mutmut run` would, without running any test."""
    from mutmut.mutation.file_mutation import mutate_file_contents

    os.chdir(ROOT)
    return {f: len(mutate_file_contents(f, (ROOT / f).read_text()).mutant_names) for f in target_files(target)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", action="append", choices=sorted(TARGETS), default=[], help="target to run (repeatable)")
    parser.add_argument("--all", action="store_true", help="every target, one after the other")
    parser.add_argument("--count", action="store_true", help="only count the mutants of each file")
    parser.add_argument("--report-only", action="store_true", help="re-judge and re-render the committed report")
    parser.add_argument("--merge", action="append", type=Path, default=[], metavar="REPORT",
                        help="take in the newer measurements of another checkout's mutation.json (repeatable)")
    args = parser.parse_args(argv)
    targets = sorted(TARGETS) if args.all else args.module
    if not targets and not args.report_only and not args.merge:
        parser.error("name a target with --module PATH (or --all, --merge REPORT or --report-only)")
    if args.count:
        for target in targets:
            for file, n in count(target).items():
                print(f"{file}\t{n}")
        return
    measured = newer_measurements(args.merge)
    for target in targets:
        print(f"{target}: running mutmut (log: {workspace_dir(target) / 'mutmut-run.log'})", flush=True)
        measured.update(run_target(target))
    report = write_report(measured, f"mutmut {version('mutmut')}")
    for file, entry in report["files"].items():
        score = entry["verdict"]["score"]
        print(f"{file}\t{entry['verdict']['counts']}\tscore {'-' if score is None else f'{100 * score:.1f} %'}")
    for line in stale_equivalents(load_equivalents()):
        print(f"stale explanation in {EQUIVALENTS.relative_to(ROOT)}: {line}")


if __name__ == "__main__":
    main()
