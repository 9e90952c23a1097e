"""A run's output folder: what a run writes there, the lock one run holds on it, and removal of
only a run's own files.

Two runs started on one `output_dir` would interleave their checkpoints and metrics, so the main
process holds an exclusive lock (`run.lock`, created with O_EXCL, holding its host and pid) from
before its first write to its exit. A lock left by a killed process is recognised as stale when
its pid no longer runs on this host, and taken over. `--overwrite` deletes only the entries in
`RUN_ENTRIES` and refuses a folder holding anything else, so a mistyped `--output_dir` cannot
delete someone's documents.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import time
from pathlib import Path

__all__ = ["LOCK_FILE", "RUN_ENTRIES", "RunLock", "RunFolderError", "foreign_entries", "remove_run_files"]

LOCK_FILE = "run.lock"
RUN_ENTRIES = frozenset({"config.json", "metrics.jsonl", "checkpoints", "hub", "linear_eval.json",
                         "phase_seconds.json", "hscl_zoo", "eval.json", LOCK_FILE})
"""Everything a run writes into its output_dir (``hscl_zoo``: the Accelerate trackers' logs), and
``eval.json``, where the docs' ``hscl-zoo eval RUN --out RUN/eval.json`` puts the run's evaluation:
it belongs to the run, and ``--overwrite`` removes it with the weights it scored."""
FRESH_SECONDS = 10
"""An unreadable lock file younger than this may be another run's, still being written."""


class RunFolderError(RuntimeError):
    """The output folder cannot be used as asked; the message says why and what to do."""


def foreign_entries(run_dir: Path) -> list[str]:
    """Names in `run_dir` that no run writes (sorted)."""
    if not run_dir.is_dir():
        return []
    return sorted(p.name for p in run_dir.iterdir() if p.name not in RUN_ENTRIES)


def remove_run_files(run_dir: Path) -> None:
    """Delete what a run wrote into `run_dir` (not the lock this process holds); refuse, deleting
    nothing, when the folder holds anything else."""
    foreign = foreign_entries(run_dir)
    if foreign:
        raise RunFolderError(f"--overwrite: {run_dir} holds files no run writes ({', '.join(foreign[:5])}"
                             f"{' ...' if len(foreign) > 5 else ''}); nothing was deleted. Move them out or "
                             "choose another --output_dir.")
    for name in sorted(RUN_ENTRIES - {LOCK_FILE}):
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """The exclusive lock of one run on its output folder (`run.lock` in it).

    `acquire` creates the folder if needed and the lock file atomically; a lock of a live
    process (or of another host, whose processes cannot be checked) raises RunFolderError; a
    lock whose pid is gone on this host is stale and taken over. `release` removes the file if
    it is still this process's."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.owner = {"host": socket.gethostname(), "pid": os.getpid()}
        self.held = False

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is None and time.time() - self.path.stat().st_mtime < FRESH_SECONDS:
                    holder = {"pid": "(starting)", "host": "this host"}
                if holder is not None and (holder.get("host") != self.owner["host"]
                                           or not str(holder["pid"]).isdigit() or _pid_alive(int(holder["pid"]))):
                    raise RunFolderError(
                        f"output_dir {self.path.parent} is in use by process {holder.get('pid')} on "
                        f"{holder.get('host')} ({self.path} exists). Wait for that run to end or choose another "
                        f"--output_dir; if that process is gone, delete {self.path}.") from None
                print(f"note: removing the stale lock {self.path} of process {holder and holder.get('pid')}, which "
                      "no longer runs.", flush=True)
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(self.owner) + "\n")
            self.held = True
            return self
        raise RunFolderError(f"cannot take the lock {self.path}: another run took it at the same time.")

    def _holder(self) -> dict | None:
        """The lock file's owner; None when the file is unreadable (a writer killed mid-write)."""
        try:
            holder = json.loads(self.path.read_text())
            return holder if isinstance(holder, dict) and str(holder.get("pid", "")).isdigit() else None
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        try:
            if self._holder() == self.owner:
                self.path.unlink()
        except OSError as error:
            if error.errno != errno.ENOENT:
                raise

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
