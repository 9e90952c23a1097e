"""The GPU sprint (tools/gpu_sprint.sh): its CPU rehearsal runs every step's commands, flags
and paths end to end, so that a lent GPU's minutes go to running them, not to debugging them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from helpers import load_script, missing_data

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu_sprint.sh"
SHARED_DATA = ROOT.parent / "shared" / "data"
CIFAR10 = SHARED_DATA / "cifar10"


def sprint(*args: str, env: dict[str, str], timeout: int = 1500) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable, **env})


@pytest.mark.parametrize("args, message", [
    ((), "name at least one step"),
    (("check", "--fast"), "unknown argument '--fast'"),
    (("train",), "unknown argument 'train'"),  # the hard-coded SCL/H-SCL(beta) training is gone: `next` plans
])
def test_bad_arguments_are_refused_with_one_line(tmp_path, args, message):
    result = sprint(*args, env={"STATE": str(tmp_path / "state")})
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr
    assert not (tmp_path / "state").exists()


def test_missing_data_is_refused_before_anything_is_written(tmp_path):
    result = sprint("--rehearse", "check", env={"STATE": str(tmp_path / "state"), "DATA": str(tmp_path / "nowhere"),
                                                "OUT": str(tmp_path / "out")})
    assert result.returncode == 3 and "no data folder" in result.stderr and "pack" in result.stderr
    assert not (tmp_path / "state").exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_rehearsal_runs_the_check_and_measure_steps_and_packs_their_results(tmp_path):
    if not CIFAR10.is_dir():
        pytest.skip(missing_data(CIFAR10))
    state, out = tmp_path / "state", tmp_path / "out"
    env = {"STATE": str(state), "OUT": str(out), "DATA": str(SHARED_DATA)}  # the threads are the worker's share
    result = sprint("--rehearse", "check", "measure", env=env)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]

    results = state / "results"
    parity = json.loads((results / "parity.json").read_text())  # the CPU against itself: every gap is zero
    assert len(parity["checks"]) == 14 and all(row["ok"] and row["gap"] == 0 for row in parity["checks"])
    resume = json.loads((results / "resume.json").read_text())
    assert resume["ok"] and resume["epochs_in_resumed_log"] == resume["epoch"] == 2
    for name in ("loss", "throughput", "compile", "augment", "loss-memory"):
        assert json.loads((results / f"{name}.json").read_text()), name
    compiled = json.loads((results / "compile.json").read_text())
    assert "compile" in json.dumps(compiled)
    with tarfile.open(out / "check.tgz") as tar:
        assert {"results/parity.json", "results/resume.json", "logs/resume-second.log"} <= set(tar.getnames())

    again = sprint("--rehearse", "check", "measure", env=env, timeout=300)
    assert again.returncode == 0 and again.stdout.count("done before") >= 8, again.stdout[-3000:]


def test_help_prints_the_header_comment_and_nothing_else(tmp_path):
    result = sprint("--help", env={"STATE": str(tmp_path / "state")})
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and lines and all(line.startswith("#") for line in lines)
    assert "--rehearse" in result.stdout and "Exit status" in lines[-1]


def _copy_of_the_checkout(target: Path) -> Path:
    """A git clone of this checkout with its uncommitted changes (outside releases/) applied: the
    sprint's scripts as they are here, over committed releases."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(target)], check=True, timeout=300)
    diff = subprocess.run(["git", "-C", str(ROOT), "diff", "HEAD", "--binary", "--", ".", ":(exclude)releases"],
                          capture_output=True, check=True).stdout
    if diff:
        subprocess.run(["git", "-C", str(target), "apply", "--whitespace=nowarn"], input=diff, check=True)
    return target


def _carried_bytes(checkout: Path) -> tuple[int, list[str]]:
    """What a device call carries of `checkout`: its tracked files present, its untracked files
    git does not ignore, and .gpu/ (named in carry); their bytes and paths."""
    def listed(*args: str) -> list[str]:
        out = subprocess.run(["git", "-C", str(checkout), "ls-files", "-z", *args], capture_output=True, check=True)
        return [name for name in out.stdout.decode().split("\0") if name and (checkout / name).is_file()]
    paths = listed() + listed("--others", "--exclude-standard")
    paths += [p.relative_to(checkout).as_posix() for p in (checkout / ".gpu").rglob("*") if p.is_file()]
    return sum((checkout / name).stat().st_size for name in paths), paths


def test_pack_hides_releases_from_the_call_and_restore_puts_them_back_byte_for_byte(tmp_path):
    if not (SHARED_DATA / "cifar100").is_dir():
        pytest.skip(missing_data(SHARED_DATA / "cifar100"))
    checkout = _copy_of_the_checkout(tmp_path / "checkout")
    plan = load_script("tools", "sprint_plan")
    run = {"PYTHON": sys.executable, "SHARED_DATA": str(SHARED_DATA), "STATE": str(tmp_path / "state")}

    def sprint_in(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(checkout / "tools" / "gpu_sprint.sh"), *args], cwd=checkout,
                              capture_output=True, text=True, timeout=600, env={**os.environ, **run})

    def status() -> str:
        return subprocess.run(["git", "-C", str(checkout), "status", "--porcelain"], capture_output=True, text=True,
                              check=True).stdout

    before, releases = status(), sorted(p.name for p in (checkout / "releases").iterdir())
    assert releases and _carried_bytes(checkout)[0] > 64 * 2**20, "the releases alone are over what a call carries"
    card = checkout / "releases" / releases[0] / "README.md"
    card.write_text(card.read_text() + " ")
    refused = sprint_in("--rehearse", "pack")
    assert refused.returncode == 2 and "releases/ differs from HEAD" in refused.stderr and "commit" in refused.stderr
    assert refused.stderr.strip().count("\n") == 0
    assert (checkout / "releases" / releases[0]).is_dir() and not (checkout / ".releases-hidden").exists()
    subprocess.run(["git", "-C", str(checkout), "checkout", "--", "releases"], check=True)

    packed = sprint_in("--rehearse", "pack")
    assert packed.returncode == 0, packed.stdout[-3000:] + packed.stderr[-3000:]
    assert "bash tools/gpu_sprint.sh restore" in packed.stdout
    size, carried = _carried_bytes(checkout)
    assert size < 64 * 2**20 and not [p for p in carried if p.startswith(("releases/", ".releases-hidden/"))]
    assert any(p.startswith(".gpu/data/") for p in carried)
    assert plan.state_of(checkout) == plan.state_of(ROOT), "the plan reads the hidden releases too"
    again = sprint_in("--rehearse", "pack")  # packing twice hides nothing more and loses nothing
    assert again.returncode == 0 and "hidden already" in again.stdout

    assert sprint_in("restore").returncode == 0
    assert sorted(p.name for p in (checkout / "releases").iterdir()) == releases
    assert status() == before and not (checkout / ".releases-hidden").exists()
    twice = sprint_in("restore")
    assert twice.returncode == 0 and "nothing hidden" in twice.stderr and status() == before
