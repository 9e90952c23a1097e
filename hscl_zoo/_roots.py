"""Where the project's files outside the package live: the checkout whose ``releases/`` (committed
release folders), ``results/`` (the runs the model cards quote) and ``model_cards/`` the package
reads. One rule for an installed wheel and a checkout alike, never guessed from where the
package's own files are:

1. the folder the caller names (``root=``), else the one the environment variable
   ``HSCL_ZOO_ROOT`` names;
2. else the current directory or the nearest folder above it that is a checkout of hscl_zoo (it
   holds ``hscl_zoo/zoo/released.json``), as git finds its repository;
3. else none: the package reads only what it ships, and a release comes from ``HSCL_ZOO_RELEASES``
   or the Hub (:mod:`hscl_zoo.zoo.releases`).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ROOT_ENV", "checkout", "releases_dir", "results_dir"]

ROOT_ENV = "HSCL_ZOO_ROOT"
MARKER = Path("hscl_zoo", "zoo", "released.json")
"""The file that makes a folder a checkout of hscl_zoo when one is looked for."""


def checkout(root: str | os.PathLike[str] | None = None) -> Path | None:
    """The checkout the package reads releases, results and cards from (the rule above); None when
    nothing names one and the current directory is in none. A named folder that is not a directory
    is a one-line FileNotFoundError."""
    named, source = (root, "root") if root is not None else (os.environ.get(ROOT_ENV), ROOT_ENV)
    if named:
        folder = Path(named).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(f"{source}={named} is not a directory; point it at a checkout of hscl_zoo (the "
                                    "folder holding releases/ and results/) or unset it.")
        return folder
    here = Path.cwd()
    return next((folder for folder in (here, *here.parents) if (folder / MARKER).is_file()), None)


def _inside(name: str, root: str | os.PathLike[str] | None) -> Path | None:
    folder = checkout(root)
    return folder / name if folder is not None and (folder / name).is_dir() else None


def releases_dir(root: str | os.PathLike[str] | None = None) -> Path | None:
    """The checkout's ``releases/``, None when there is no checkout or it has none."""
    return _inside("releases", root)


def results_dir(root: str | os.PathLike[str] | None = None) -> Path | None:
    """The checkout's ``results/``, None when there is no checkout or it has none."""
    return _inside("results", root)
