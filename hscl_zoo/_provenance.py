"""Where a record came from: the commit of the code, the CPU's name, the time. One helper each,
for the run records, the releases' eval.json, ``benchmarks/provenance.py`` and ``tools/``."""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from hscl_zoo._roots import checkout

__all__ = ["SOURCE_COMMIT_ENV", "code_commit", "cpu_model", "utc_now"]

SOURCE_COMMIT_ENV = "HSCL_ZOO_SOURCE_COMMIT"


def code_commit(root: str | os.PathLike[str] | None = None, paths: Sequence[str] = ("hscl_zoo", "recipes"), *,
                mark_dirty: bool = True) -> str | None:
    """The git commit checked out at `root` (by default the checkout `hscl_zoo._roots.checkout`
    names; None outside a git checkout), with a '+dirty' suffix when `mark_dirty` and anything
    under `paths` (every path when empty) differs from it: modified, staged, deleted or untracked
    files alike, ignored ones not.

    The environment variable HSCL_ZOO_SOURCE_COMMIT, when set, is the answer instead: a copy of a
    checkout whose .git is missing or stale (the tree the GPU sprint sends to a device machine,
    `tools/gpu_sprint.sh`, which sets it to the commit it packed) names its code that way."""
    if source := os.environ.get(SOURCE_COMMIT_ENV):
        return source
    folder = checkout() if root is None else Path(root)
    if folder is None:
        return None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, check=True,
                                timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", *paths], cwd=folder,
                               capture_output=True, text=True, check=True, timeout=60) if mark_dirty else None
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None
    return commit.stdout.strip() + ("+dirty" if dirty is not None and dirty.stdout.strip() else "")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def utc_now() -> str:
    """The time now in UTC, ISO 8601 to the second, as results files record it."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
