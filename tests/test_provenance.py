"""The commit written into results (benchmarks/provenance.py `git_commit`, the reproduction
records' and the releases' `hscl_zoo._provenance.code_commit`), read from a real temporary git
repository: '+dirty' for every kind of uncommitted change, untracked files included, and not for ignored files."""

import subprocess
from pathlib import Path

import pytest

from hscl_zoo._provenance import code_commit
from helpers import load_script

provenance = load_script("benchmarks", "provenance")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=repo,
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q")
    (tmp_path / "hscl_zoo").mkdir()
    (tmp_path / "hscl_zoo" / "loss.py").write_text("x = 1\n")
    (tmp_path / "README.md").write_text("readme\n")
    (tmp_path / ".gitignore").write_text("runs/\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "first")
    return tmp_path


def test_a_clean_tree_is_its_commit(repo):
    head = git(repo, "rev-parse", "HEAD")
    assert len(head) == 40
    assert provenance.git_commit(repo) == head
    assert code_commit(repo) == head


@pytest.mark.parametrize("change", ["modified", "staged", "deleted", "untracked", "untracked in a new folder"])
def test_every_uncommitted_change_is_dirty(repo, change):
    head = git(repo, "rev-parse", "HEAD")
    code = repo / "hscl_zoo" / "loss.py"
    if change == "modified":
        code.write_text("x = 2\n")
    elif change == "staged":
        code.write_text("x = 2\n")
        git(repo, "add", str(code))
    elif change == "deleted":
        code.unlink()
    elif change == "untracked":
        (repo / "hscl_zoo" / "new.py").write_text("y = 1\n")
    else:
        (repo / "hscl_zoo" / "sub").mkdir()
        (repo / "hscl_zoo" / "sub" / "new.py").write_text("y = 1\n")
    assert provenance.git_commit(repo) == head + "+dirty"
    assert code_commit(repo) == head + "+dirty"


def test_ignored_files_are_clean_and_the_training_code_is_judged_on_its_own_paths(repo):
    head = git(repo, "rev-parse", "HEAD")
    (repo / "runs").mkdir()
    (repo / "runs" / "metrics.jsonl").write_text("{}\n")
    assert provenance.git_commit(repo) == head
    (repo / "notes.txt").write_text("an untracked file outside the training code\n")
    assert provenance.git_commit(repo) == head + "+dirty"
    assert code_commit(repo) == head  # hscl_zoo/ and recipes/ only: the code that trains


def test_outside_a_checkout_there_is_no_commit(tmp_path):
    assert provenance.git_commit(tmp_path) is None
    assert code_commit(tmp_path) is None


def test_the_packed_commit_in_the_environment_wins_over_a_stale_or_missing_checkout(repo, tmp_path_factory, monkeypatch):
    """The GPU sprint's device machine got the tree with a stale .git (the first H100 recorded the
    session's first commit '+dirty'): the commit `gpu_sprint.sh pack` recorded names the code."""
    stale = git(repo, "rev-parse", "HEAD")
    (repo / "hscl_zoo" / "loss.py").write_text("x = 2\n")
    assert code_commit(repo) == stale + "+dirty"
    packed = "c" * 40
    monkeypatch.setenv("HSCL_ZOO_SOURCE_COMMIT", packed)
    assert code_commit(repo) == packed and provenance.git_commit(repo) == packed
    assert code_commit(tmp_path_factory.mktemp("no-git")) == packed
    monkeypatch.setenv("HSCL_ZOO_SOURCE_COMMIT", "")
    assert code_commit(repo) == stale + "+dirty"


def test_command_line_names_the_benchmark_and_its_arguments(monkeypatch):
    """The command a results file records: the benchmark's path from the repository root and the
    arguments it was given, or this process's own when none are passed."""
    script = str(Path(provenance.__file__).parent / "loss_precision.py")
    assert provenance.command_line(script, ["--json", "out.json"]) == "python benchmarks/loss_precision.py --json out.json"
    assert provenance.command_line(script, []) == "python benchmarks/loss_precision.py"
    monkeypatch.setattr("sys.argv", ["loss_precision.py", "--batch", "8"])
    assert provenance.command_line(script, None) == "python benchmarks/loss_precision.py --batch 8"


def test_a_release_names_the_commit_the_sprint_packed(monkeypatch):
    """On a device machine the tree's .git is missing or stale: the release's eval.json takes the
    packed commit, as the run records do (the H100's first CIFAR-100 releases named bddce64, their
    runs 832f613)."""
    head = code_commit(mark_dirty=False)  # what a release's eval.json records
    monkeypatch.setenv("HSCL_ZOO_SOURCE_COMMIT", "f" * 40)
    assert code_commit(mark_dirty=False) == "f" * 40 != head
