"""Packing a GPU call's results for the way back, and unpacking them into the repository.

A device call returns at most `MAX_FILES` files of `MAX_FILE_BYTES` each, `MAX_TOTAL_BYTES` in
all. The sprint (`tools/sprint_next.py`) lands each result in a *view*: a folder laid out as
the repository (``results/gpu-cifar10/runs/ucl-s0.json``, ``releases/NAME/...``), and after each
landing calls `pack`, which rewrites ``$OUT`` from the view: one ``results.tgz`` of every small
file (records, check results, logs, the sprint log) and each weights folder as an uncompressed
tar cut into parts under `MAX_FILE_BYTES`. `unpack` puts them back byte for byte under the
repository root, checking every file against the sha256 the sprint log recorded.

Room (`hide`, `restore`): the committed release weights (releases/) are over what one device call
may carry, and no call reads them, so ``gpu_sprint.sh pack`` moves releases/ into `HIDDEN`, an
ignored folder the call does not carry, and ``gpu_sprint.sh restore`` (or `unpack`, first) moves
them back, byte for byte: a rename, refused before anything moves when releases/ differs from HEAD.

Provenance (`source`): the commit the carried tree is at, the sha256 of ``git diff HEAD`` of that
tree, and the command; a correction to a recorded value is a new field beside it (`correct`),
never an overwrite.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

MAX_FILES = 8
MAX_FILE_BYTES = 16 * 2**20
MAX_TOTAL_BYTES = 64 * 2**20
PART_BYTES = 15 * 2**20
RESULTS = "results.tgz"
HIDDEN = ".releases-hidden"
"""Where `hide` moves releases/ for a device call (an ignored folder the call does not carry: the
weights are over what one call may carry, and no call reads them); `restore` moves them back."""
NOT_RETURNABLE = re.compile(r"[^A-Za-z0-9._-]")
"""A character no returned file's name may hold: a device call brings back only names of letters,
digits, '.', '_' and '-'; a file named otherwise stays on the machine and is lost with it."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _git(root: Path, *args: str) -> bytes:
    """``git ARGS`` in `root`, its stdout; a one-line SystemExit when it fails."""
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True)
    except OSError as error:  # no such folder, no git
        done = subprocess.CompletedProcess(args, 1, b"", str(error).encode())
    if done.returncode != 0:
        raise SystemExit(f"error: git {' '.join(args)} failed in {root} ({done.stderr.decode().strip()}); "
                         "run the sprint's pack step from a git checkout.")
    return done.stdout


NOT_CODE = ":(exclude)releases"
"""The release weights are not the code a measurement names (and are hidden during a call)."""


def source(root: Path) -> dict[str, Any]:
    """The code a call carries: ``git rev-parse HEAD`` of `root`, the sha256 of ``git diff HEAD
    --binary`` (tracked changes outside releases/; 'e3b0c442...' when the tree is its commit) and
    the untracked, not ignored files. Raises a one-line SystemExit outside a git checkout."""
    def git(*args: str) -> bytes:
        return _git(root, *args)
    diff = git("diff", "HEAD", "--binary", "--", ".", NOT_CODE)
    untracked = git("ls-files", "--others", "--exclude-standard", "--", ".", NOT_CODE).decode().split()
    return {"commit": git("rev-parse", "HEAD").decode().strip(), "diff_sha256": hashlib.sha256(diff).hexdigest(),
            "diff_bytes": len(diff), "untracked": untracked}


def hide(root: Path) -> str:
    """Move `root`/releases to `root`/HIDDEN/releases, so that a device call does not carry it, and
    say how to put it back. Idempotent (hidden already: says so). Refused, nothing moved, when
    releases/ differs from HEAD (a file edited, added or removed) or both folders hold releases."""
    releases, hidden = root / "releases", root / HIDDEN / "releases"
    if not releases.is_dir() or not any(releases.iterdir()):
        return (f"releases/ is hidden already in {HIDDEN}/; " if hidden.is_dir() else "no releases/ to hide; ") + \
            "put it back with: bash tools/gpu_sprint.sh restore"
    if hidden.is_dir():
        raise SystemExit(f"error: both releases/ and {HIDDEN}/releases/ hold releases; run "
                         "'bash tools/gpu_sprint.sh restore' first, then pack.")
    changed = _git(root, "status", "--porcelain", "--untracked-files=all", "--", "releases").decode().splitlines()
    if changed:
        raise SystemExit(f"error: releases/ differs from HEAD ({len(changed)} path(s), e.g. '{changed[0].strip()}'); "
                         "commit or undo it first (git status releases), so that hiding and restoring lose nothing.")
    hidden.parent.mkdir(exist_ok=True)
    releases.rename(hidden)
    return f"moved releases/ to {HIDDEN}/releases/ (ignored, not carried); put it back with: " \
           "bash tools/gpu_sprint.sh restore"


def restore(root: Path) -> list[str]:
    """Move every release folder `hide` moved back under `root`/releases (a rename: byte for byte)
    and return their names; nothing hidden: nothing to do. Refused, nothing moved, when a hidden
    folder's name is in releases/ already (a call brought a release of that name)."""
    hidden = root / HIDDEN / "releases"
    if not hidden.is_dir():
        return []
    names = sorted(p.name for p in hidden.iterdir())
    clash = [name for name in names if (root / "releases" / name).exists()]
    if clash:
        raise SystemExit(f"error: releases/{clash[0]} exists and is hidden in {HIDDEN}/releases/ too; keep one of "
                         "the two, remove the other, then restore again.")
    (root / "releases").mkdir(exist_ok=True)
    for name in names:
        (hidden / name).rename(root / "releases" / name)
    hidden.rmdir()
    if not any((root / HIDDEN).iterdir()):
        (root / HIDDEN).rmdir()
    return names


def correct(record: dict[str, Any], key: str, value: Any, reason: str) -> dict[str, Any]:
    """`record` with a correction of `key` beside its recorded value: ``<key>_corrected`` and
    ``<key>_correction`` (why). The recorded value stays as it was written; a second correction of
    the same key is refused (correct the correction's own field instead)."""
    if key not in record:
        raise KeyError(f"{key!r} is not in the record; a correction sits beside a recorded value.")
    if f"{key}_corrected" in record:
        raise ValueError(f"{key!r} was corrected already; correct '{key}_corrected' instead of overwriting it.")
    if not reason.strip():
        raise ValueError("a correction needs its reason (what was wrong, how the new value is known).")
    return {**record, f"{key}_corrected": value, f"{key}_correction": reason}


def _weights_tar(view: Path, folder: str) -> bytes:
    """An uncompressed tar (bf16 weights do not compress) of `view/folder`, paths from `view`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted((view / folder).rglob("*")):
            if path.is_file():
                tar.add(path, arcname=path.relative_to(view).as_posix(), recursive=False)
    return buffer.getvalue()


def pack(view: Path, out: Path, small: list[str], weights: list[str]) -> list[str]:
    """Rewrite `out` from `view`: ``results.tgz`` holding the files `small` (paths relative to
    `view`) and, in the order given, each folder of `weights` as tar parts named
    ``<folder, each NOT_RETURNABLE character as _>.tar.partNN``. A weights folder whose parts would
    pass the call's limits is left out. Returns the folders left out."""
    out.mkdir(parents=True, exist_ok=True)
    for old in [out / RESULTS, *out.glob("*.tar.part*")]:  # this module's files only: other steps' stay
        old.unlink(missing_ok=True)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(set(small)):
            tar.add(view / name, arcname=name, recursive=False)
    files, total = {RESULTS: buffer.getvalue()}, len(buffer.getvalue())
    if total > MAX_FILE_BYTES:
        raise SystemExit(f"error: {RESULTS} is {total} bytes, over the {MAX_FILE_BYTES} a returned file may be; "
                         "pack fewer logs.")
    left_out = []
    for folder in weights:
        data = _weights_tar(view, folder)
        parts = [data[i:i + PART_BYTES] for i in range(0, len(data), PART_BYTES)]
        if len(files) + len(parts) > MAX_FILES or total + len(data) > MAX_TOTAL_BYTES:
            left_out.append(folder)
            continue
        stem = NOT_RETURNABLE.sub("_", folder.strip("/"))
        for number, part in enumerate(parts):
            files[f"{stem}.tar.part{number:02d}"] = part
        total += len(data)
    for name, data in files.items():
        partial = out / f".{name}.tmp"  # a call cut mid-write leaves no half file under the real name
        partial.write_bytes(data)
        partial.rename(out / name)
    return left_out


def unpack(out: Path, root: Path, log: str | None = None) -> list[str]:
    """Extract a call's files (`out`: results.tgz and the weights parts) under `root`, byte for
    byte, and return the paths written. With `log` (the sprint log's path inside the pack), every
    file it lists is checked against its recorded sha256."""
    written: list[str] = []

    def extract(tar: tarfile.TarFile) -> None:
        for member in tar.getmembers():
            target = (root / member.name).resolve()
            if not member.isfile() or root.resolve() not in target.parents:
                raise SystemExit(f"error: {member.name!r} in the pack is not a file under the repository; not unpacked.")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(member).read())
            written.append(member.name)

    with tarfile.open(out / RESULTS) as tar:
        extract(tar)
    stems = sorted({p.name.rsplit(".tar.part", 1)[0] for p in out.glob("*.tar.part*")})
    for stem in stems:
        data = b"".join(p.read_bytes() for p in sorted(out.glob(f"{stem}.tar.part*")))
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            extract(tar)
    if log is not None:
        recorded = {path: digest for part in json.loads((root / log).read_text())["parts"]
                    for path, digest in part.get("files", {}).items()}
        bad = [path for path, digest in recorded.items() if path in written and sha256(root / path) != digest]
        if bad:
            raise SystemExit(f"error: {bad} differ from the sha256 the sprint log recorded; the pack is damaged.")
    return written


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="Unpack a GPU call's files into the repository, hashes checked (the "
                                "hidden releases restored first); hide or restore releases/ around a call.")
    p.add_argument("command", choices=["unpack", "hide", "restore"])
    p.add_argument("out", type=Path, nargs="?", help="unpack: the folder the device call returned (results.tgz and "
                   "tar parts)")
    p.add_argument("--into", type=Path, default=Path(__file__).resolve().parents[1], help="default: this checkout")
    args = p.parse_args(argv)
    if args.command == "hide":
        print(hide(args.into))
        return 0
    if args.command == "unpack":
        if args.out is None or not (args.out / RESULTS).is_file():
            raise SystemExit(f"error: {args.out} holds no {RESULTS}; give the folder a 'gpu_sprint.sh next' call "
                             "returned: sprint_pack.py unpack OUT.")
        with tarfile.open(args.out / RESULTS) as tar:
            logs = [n for n in tar.getnames() if re.match(r"benchmarks/results/(gpu_sprint|rehearsal)_\w+\.json$", n)]
        if len(logs) != 1:
            raise SystemExit(f"error: {args.out / RESULTS} holds {len(logs)} sprint logs, not one; it is not one "
                             "call's pack.")
    restored = restore(args.into)
    if restored:
        print(f"restored releases/ from {HIDDEN}/ ({len(restored)} release folders)", file=sys.stderr)
    elif args.command == "restore":
        print(f"nothing hidden in {HIDDEN}/: releases/ is in place", file=sys.stderr)
    if args.command == "restore":
        return 0
    for path in unpack(args.out, args.into, log=logs[0]):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
