"""A release's pins: `FilePin` (a file's sha256 and size) and the rules a zoo entry's files,
revision and metrics follow, checked when the entry is made (``hscl_zoo.zoo.registry.ZooEntry``),
so that a malformed record of ``released.json`` is refused at import with its name and the fix."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

__all__ = ["FilePin", "checked_pins"]

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_FILE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class FilePin(NamedTuple):
    """One file of a release: its sha256 (hex) and size in bytes."""

    sha256: str
    size: int


def checked_pins(name: str, files: Mapping[str, Any], revision: str | None, metrics: Mapping[str, Any]
                 ) -> tuple[Mapping[str, FilePin], Mapping[str, float]]:
    """The entry `name`'s files (name -> `FilePin`) and metrics, read-only; a ValueError naming the
    field and what it must be when a file name, a sha256, a size, the revision (a full commit, only
    with files) or a metric (a number, only with files) is malformed, or no weights are pinned."""
    for file, pin in files.items():
        if not _FILE_RE.match(file) or not isinstance(pin, tuple) or len(pin) != 2 \
                or not _SHA256_RE.match(str(pin[0])) or isinstance(pin[1], bool) or not isinstance(pin[1], int):
            raise ValueError(f"{name}: files must map plain file names to (sha256, size) with 64 lowercase "
                             f"hex digits and an int; got {file!r}: {pin!r}.")
    pins = MappingProxyType({k: FilePin(*v) for k, v in files.items()})
    if pins and not any(file.endswith(".safetensors") for file in pins):
        raise ValueError(f"{name}: a release pins its weights; files names no .safetensors file.")
    if revision is not None and not pins:
        raise ValueError(f"{name}: a revision pins files; give files (name -> sha256, size) with it.")
    if revision is not None and not _COMMIT_RE.match(revision):
        raise ValueError(f"{name}: revision must pin a full 40-hex commit, got {revision!r}.")
    if metrics and not pins:
        raise ValueError(f"{name}: metrics without published weights; pin the release's files first.")
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name}: metric {key!r} must be a number, got {value!r}.")
    return pins, MappingProxyType(dict(metrics))
