"""Where a published zoo entry's files come from: sources tried in order, every file's sha256
checked against the registry's pins before anything is read.

1. a local release folder ``<root>/<name>/``: the folder ``HSCL_ZOO_RELEASES`` names (a mirror a
   lab keeps on shared storage), then the checkout's ``releases/`` (absent from the wheel);
2. the Hub cache (``HF_HUB_CACHE`` or ``cache_dir``), at the pinned revision or else ``main``;
3. the Hub repo at the pinned revision, when the entry has one and the network is allowed.

A source is taken whole or not at all: files are never mixed across sources. A copy whose
checksum differs is refused even when a later source holds a good one; the later source is then
used, and a ``ReleaseFallbackWarning`` says which copy was refused and where the files came from.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import hf_hub_download, try_to_load_from_cache
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

from hscl_zoo._files import sha256_file
from hscl_zoo._roots import ROOT_ENV, releases_dir
from hscl_zoo._version import __version__
from hscl_zoo.zoo.pins import FilePin
from hscl_zoo.zoo.registry import ZooEntry

__all__ = ["RELEASES_ENV", "NotCachedError", "ChecksumMismatchError", "ReleaseFallbackWarning", "Fetched",
           "release_roots", "pin_folder", "check_pins", "fetch_release"]

RELEASES_ENV = "HSCL_ZOO_RELEASES"


class NotCachedError(FileNotFoundError):
    """The Hub cannot be reached (or offline mode is on) and the file is not in the cache."""


class ChecksumMismatchError(ValueError):
    """A weights file whose sha256 differs from the one the registry pins."""


class ReleaseFallbackWarning(UserWarning):
    """A source held a copy of a release whose checksum differs from its pin; a later one was used."""


@dataclass(frozen=True)
class Fetched:
    """A release's files, each verified: ``files`` maps file names to paths, ``source`` says where."""

    files: dict[str, Path]
    source: str


def release_roots() -> list[Path]:
    """The local folders holding release folders, in the order they are tried: the mirror
    ``HSCL_ZOO_RELEASES`` names, then the ``releases/`` of the checkout :mod:`hscl_zoo._roots` finds
    (``HSCL_ZOO_ROOT``, else the current directory's)."""
    roots = []
    named = os.environ.get(RELEASES_ENV)
    if named:
        root = Path(named).expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"{RELEASES_ENV}={named} is not a directory; point it at a folder of release "
                                    "folders (<name>/config.json, ...) or unset it.")
        roots.append(root)
    committed = releases_dir()
    if committed is not None:
        roots.append(committed)
    return roots


def pin_folder(folder: str | os.PathLike[str]) -> dict[str, FilePin]:
    """The pins of every file of a release folder (name -> sha256 and size), as the registry holds them."""
    folder = Path(folder)
    entries = sorted(folder.iterdir())
    nested = [p.name for p in entries if not p.is_file()]
    if nested:
        raise ValueError(f"{folder} holds {nested[0]}, which is not a file; a release folder holds files only.")
    return {p.name: FilePin(sha256_file(p), p.stat().st_size) for p in entries}


def pinned_by(entry: ZooEntry) -> str:
    """How a refusal names the pins: the registry entry, and the Hub revision it pins if any."""
    return f"the registry entry {entry.name}" + (f" ({entry.hub_repo}@{entry.revision})" if entry.revision else "")


def check_pins(entry: ZooEntry, paths: dict[str, Path], fix: str) -> str | None:
    """None when every file of `paths` (file name -> path) matches the sha256 the entry pins for
    it, else the refusal: one sentence per file that differs or that the entry does not pin."""
    refusals = []
    for name, path in paths.items():
        pin = entry.files.get(name)
        actual = sha256_file(path)
        if pin is None or actual != pin.sha256:
            refusals.append(f"Refusing {path}: its sha256 is {actual}, but {pinned_by(entry)} pins "
                            f"{pin.sha256 if pin else 'no such file'}. {fix}")
    return " ".join(refusals) or None


def _local(entry: ZooEntry, root: Path) -> dict[str, Path] | str:
    folder = root / entry.name
    if not folder.is_dir():
        return f"no {folder}"
    inside = folder.resolve()
    paths = {}
    for name in entry.files:
        path = folder / name
        if not path.is_file() or not path.resolve().is_relative_to(inside):
            return f"{folder} lacks {name}"
        paths[name] = path
    return paths


def _cached(entry: ZooEntry, cache_dir: str | os.PathLike[str] | None) -> dict[str, Path] | str:
    revision = entry.revision or "main"
    paths = {}
    for name in entry.files:
        found = try_to_load_from_cache(entry.hub_repo, name, cache_dir=cache_dir, revision=revision)
        if not isinstance(found, str):
            return f"the Hub cache lacks {entry.hub_repo}@{revision}/{name}"
        paths[name] = Path(found)
    return paths


def _downloaded(entry: ZooEntry, cache_dir: str | os.PathLike[str] | None) -> dict[str, Path] | str:
    try:
        return {name: Path(hf_hub_download(entry.hub_repo, name, revision=entry.revision, cache_dir=cache_dir,
                                           library_name="hscl_zoo", library_version=__version__))
                for name in entry.files}
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as err:
        return f"the Hub did not serve {entry.hub_repo}@{entry.revision} ({type(err).__name__})"


def fetch_release(entry: ZooEntry, *, offline: bool, cache_dir: str | os.PathLike[str] | None = None) -> Fetched:
    """The verified files of a published entry, from the first source whose every file matches
    its pin. Raises ``ChecksumMismatchError`` when copies were found but none matched, and
    ``NotCachedError`` when no source holds the files."""
    sources = [(f"the release folder {root / entry.name}", lambda root=root: _local(entry, root),
                "The mirror's copy is corrupt or was replaced; copy the release folder again.")
               for root in release_roots()]
    sources.append((f"the Hub cache ({entry.hub_repo})", lambda: _cached(entry, cache_dir),
                    "The cached file is corrupt or was replaced; delete it (and the blob it links to) and load "
                    "again with network access."))
    if entry.revision is not None and not offline:
        sources.append((f"the Hub ({entry.hub_repo}@{entry.revision})", lambda: _downloaded(entry, cache_dir),
                        "The Hub's file differs from the pinned one; report it."))
    refusals, absent = [], []
    for where, locate, fix in sources:
        found = locate()
        if isinstance(found, str):
            absent.append(found)
            continue
        refusal = check_pins(entry, found, fix)
        if refusal is not None:
            refusals.append(refusal)
            continue
        if refusals:
            warnings.warn(f"{' '.join(refusals)} Loaded {entry.name} from {where} instead, every checksum verified.",
                          ReleaseFallbackWarning, stacklevel=3)
        return Fetched(found, where)
    if refusals:
        raise ChecksumMismatchError(" ".join(refusals))
    hub = (f"run it once with network access to fetch {entry.hub_repo}@{entry.revision}" if entry.revision
           else f"{entry.name} is not on the Hub yet: run from a checkout that has releases/{entry.name} (or set "
                f"{ROOT_ENV} to it), or set {RELEASES_ENV} to a folder holding a copy")
    raise NotCachedError(f"Cannot load {entry.name}: no source holds its files ({'; '.join(absent)}"
                         f"{'; offline' if offline and entry.revision else ''}); {hub}.")
