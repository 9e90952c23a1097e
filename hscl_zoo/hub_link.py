"""The encoder's way to its files and the Hub, below both the encoder and the zoo.

`ContrastiveEncoder.from_pretrained`, `save_pretrained` and `push_to_hub` are spellings of
``hscl_zoo.load``, ``hscl_zoo.save_pretrained`` and ``hscl_zoo.push_to_hub``. Those live in the
zoo (:mod:`hscl_zoo.zoo.hub`, :mod:`hscl_zoo.zoo.saving`), which builds and saves encoders and
so imports the encoder's module: the encoder cannot import them back. It asks this module for
them by name instead (`zoo_function`), and the package root, the top layer, hands this module
its lazy lookup of public names when it is imported (`connect`). Python imports the root before
any of its modules, so the lookup is in place before an encoder exists. docs/architecture.md
states the layers.

`CONFIG_LIBRARY_NAME`, the marker of an encoder's config.json, is here for the same reason: the
encoder writes it and the config schema (:mod:`hscl_zoo.zoo.schema`) checks it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["CONFIG_LIBRARY_NAME", "ZOO_FUNCTIONS", "connect", "zoo_function"]

CONFIG_LIBRARY_NAME = "hscl_zoo"
"""Marks a config.json as an hscl_zoo encoder (as opposed to a plain timm checkpoint)."""

ZOO_FUNCTIONS = ("load", "push_to_hub", "save_pretrained")
"""The public functions of the zoo that the encoder's methods call."""

_lookup: Callable[[str], Any] | None = None


def connect(lookup: Callable[[str], Any]) -> None:
    """Set how `zoo_function` finds a public function by name (the package root's lazy lookup)."""
    global _lookup
    _lookup = lookup


def zoo_function(name: str) -> Callable[..., Any]:
    """The zoo's public function ``name`` (one of `ZOO_FUNCTIONS`), imported on first use."""
    if name not in ZOO_FUNCTIONS:
        raise ValueError(f"{name!r} is not one of the zoo functions an encoder calls: {', '.join(ZOO_FUNCTIONS)}.")
    return _lookup(name)
