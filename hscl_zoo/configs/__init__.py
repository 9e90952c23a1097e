"""The paper's recipe configs, shipped inside the package: ``<zoo name>.yaml`` per zoo entry.

``--config`` (``hscl-zoo train``, ``recipes/pretrain.py``) takes one of these names or a path to
a YAML file of your own; `resolve_config` decides which. The files are read through
``importlib.resources``, so they work from a wheel as from a clone. Only the standard library is
imported here: ``hscl-zoo info`` and the registry name configs without loading torch.
"""

from __future__ import annotations

import difflib
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

__all__ = ["CONFIG_SUFFIX", "config_names", "config_file", "is_config_name", "read_config_text"]

CONFIG_SUFFIX = ".yaml"


def _folder() -> Traversable:
    return resources.files(__name__)


def config_names() -> list[str]:
    """The names of the shipped configs (the zoo names of the paper's grid), sorted."""
    return sorted(item.name.removesuffix(CONFIG_SUFFIX) for item in _folder().iterdir()
                  if item.name.endswith(CONFIG_SUFFIX))


def is_config_name(name: str) -> bool:
    """Whether ``name`` names a shipped config (and not a file path)."""
    return isinstance(name, str) and name in config_names()


def config_file(name: str) -> Traversable:
    """The shipped config ``name``; a ValueError lists the closest names when there is none."""
    if not is_config_name(name):
        close = difflib.get_close_matches(str(name), config_names(), n=3, cutoff=0.5)
        hint = f" Closest: {', '.join(close)}." if close else ""
        raise ValueError(f"no shipped config {name!r} and no such file.{hint} Give a zoo name "
                         "('hscl-zoo list' shows them) or the path of a YAML file.")
    return _folder() / f"{name}{CONFIG_SUFFIX}"


def read_config_text(name_or_path: str | Path) -> tuple[str, str]:
    """The YAML text of ``--config``: an existing file if it is a path to one, else the shipped
    config of that name. Returns (text, what to call it in messages)."""
    path = Path(name_or_path)
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8"), str(path)
        except UnicodeDecodeError:
            raise ValueError(f"{path} is not valid YAML: it is not UTF-8 text; save it as UTF-8.") from None
    return config_file(str(name_or_path)).read_text(encoding="utf-8"), f"config {name_or_path}"
