"""The graph dataset table: the five TU datasets of the paper's Table 2, and where their files are.

A spec names the TU dataset, its display name and the paper's Table 2 accuracy (%) per method.
``tu:NAME`` reads a table entry from ``--data_dir`` (a folder holding ``NAME/raw/``, the layout of
PyTorch Geometric's ``TUDataset``), or downloads it there with PyTorch Geometric when it is
missing; ``tu:/path/NAME`` reads your own TU folder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from hscl_zoo._table import NamedTable

__all__ = ["GraphDatasetSpec", "GRAPH_DATASETS", "register_graph_dataset", "is_graph_dataset", "graph_data_root",
           "load_graph_dataset", "find_graph_dataset", "GraphDataUnavailableError", "TABLE_2_METHODS"]


@dataclass(frozen=True)
class GraphDatasetSpec:
    """One TU graph-classification dataset.

    Attributes:
        name: the table key, lower case (``"mutag"``); ``tu:MUTAG`` and ``tu:mutag`` both find it.
        tu_name: the TU name, which is also its file prefix (``"MUTAG"``).
        display: the name in the paper's Table 2 (``"PTC"`` for PTC_MR).
        num_graphs, num_classes: published sizes, checked when the files are read.
        paper_accuracy: Table 2, SVM accuracy % per method name.
    """

    name: str
    tu_name: str
    display: str
    num_graphs: int
    num_classes: int
    paper_accuracy: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "paper_accuracy", MappingProxyType(dict(self.paper_accuracy)))


GRAPH_DATASETS: NamedTable[GraphDatasetSpec] = NamedTable("graph dataset", GraphDatasetSpec)
"""Every registered graph dataset by name (read-only; see `register_graph_dataset`)."""

TABLE_2_METHODS = ("ucl", "hucl", "scl", "hscl-beta")
"""The methods of the paper's Table 2, in its row order."""


def register_graph_dataset(spec: GraphDatasetSpec, *, replace: bool = False) -> GraphDatasetSpec:
    """Add a graph dataset to the table."""
    return GRAPH_DATASETS.register(spec, replace=replace)


# Table 2 of the paper (accuracy %): UCL, H-UCL, SCL, H-SCL(beta) per dataset.
_TABLE_2 = (
    ("mutag", "MUTAG", "MUTAG", 188, 2, (86.8, 87.2, 86.9, 87.2)),
    ("enzymes", "ENZYMES", "ENZYMES", 600, 6, (50.4, 50.4, 50.4, 50.7)),
    ("ptc-mr", "PTC_MR", "PTC", 344, 2, (55.3, 57.3, 55.8, 57.7)),
    ("imdb-binary", "IMDB-BINARY", "IMDB-B", 1000, 2, (72.2, 72.8, 72.4, 73.0)),
    ("imdb-multi", "IMDB-MULTI", "IMDB-M", 1500, 3, (49.6, 49.6, 49.9, 50.1)),
)
for _name, _tu, _display, _graphs, _classes, _accuracy in _TABLE_2:
    register_graph_dataset(GraphDatasetSpec(_name, _tu, _display, _graphs, _classes,
                                            dict(zip(TABLE_2_METHODS, _accuracy))))


def is_graph_dataset(dataset: str) -> bool:
    """Whether a ``--dataset`` value names graphs (``tu:NAME`` or ``tu:/path/NAME``)."""
    return isinstance(dataset, str) and dataset.startswith("tu:")


def find_graph_dataset(key: str) -> GraphDatasetSpec | None:
    """The table entry a name gives (``tu:MUTAG``, ``MUTAG`` or ``mutag``), None for any other."""
    key = key.removeprefix("tu:").lower()
    return next((s for s in GRAPH_DATASETS.values() if key in (s.name, s.tu_name.lower())), None)


def graph_data_root(data_dir: str | os.PathLike | None = None) -> Path:
    """Where ``tu:NAME`` looks: `data_dir`, else ``$HSCL_ZOO_TU_ROOT``, else ``~/.cache/hscl_zoo/tudataset``."""
    if data_dir:
        return Path(data_dir).expanduser()
    return Path(os.environ.get("HSCL_ZOO_TU_ROOT", "~/.cache/hscl_zoo/tudataset")).expanduser()


def load_graph_dataset(dataset: str, data_dir: str | os.PathLike | None = None, *, download: bool = True):
    """Read ``tu:NAME`` (a table entry, under `graph_data_root`) or ``tu:/path/NAME`` (a folder).

    A table entry missing from the root is downloaded there with PyTorch Geometric's
    ``TUDataset`` when `download` is set; its size and class count are checked against the table.
    """
    from hscl_zoo.graphs.tu import TUFormatError, read_tu

    if not is_graph_dataset(dataset):
        raise ValueError(f"a graph dataset is written tu:NAME or tu:/path/to/NAME, got {dataset!r}.")
    key = dataset[3:]
    spec = find_graph_dataset(key) if "/" not in key and os.sep not in key else None
    if spec is None:
        if not Path(key).expanduser().exists():
            known = ", ".join(s.tu_name for s in GRAPH_DATASETS.values())
            raise ValueError(f"{dataset}: no such folder and no such table entry; the table has {known}, "
                             "and tu:/path/NAME reads your own TU folder.")
        return read_tu(key)
    root = graph_data_root(data_dir)
    try:
        graphs = read_tu(root, spec.tu_name)
    except TUFormatError:
        if _on_disk(root, spec.tu_name):
            raise  # the files are there but malformed: read_tu's message says which
        if not download:
            raise _unavailable(spec, root, "downloading is off") from None
        _download(root, spec)
        graphs = read_tu(root, spec.tu_name)
    if (graphs.num_graphs, graphs.num_classes) != (spec.num_graphs, spec.num_classes):
        raise ValueError(f"{dataset} at {root}: {graphs.num_graphs} graphs in {graphs.num_classes} classes, but "
                         f"{spec.display} has {spec.num_graphs} in {spec.num_classes}; the files are not {spec.tu_name}.")
    return graphs


class GraphDataUnavailableError(ValueError):
    """A graph dataset of the table is not on disk and could not be downloaded: the one error the
    API (``load_graph_dataset``, ``GraphEncoder.embed``) and every ``hscl-zoo`` command give."""


def _on_disk(root: Path, tu_name: str) -> bool:
    from hscl_zoo.graphs.tu import TUFormatError, find_tu_folder

    try:
        find_tu_folder(root, tu_name)
    except TUFormatError:
        return False
    return True


def _unavailable(spec: GraphDatasetSpec, root: Path, reason: str) -> GraphDataUnavailableError:
    """What is missing, where it was looked for, and the two ways to get it."""
    return GraphDataUnavailableError(
        f"{spec.tu_name} is not in {root / spec.tu_name / 'raw'} ({reason}); get it either way: "
        f"pip install 'hscl-zoo[graphs]' and run again with the network, which downloads it there, or put the TU "
        f"files ({spec.tu_name}_A.txt, {spec.tu_name}_graph_indicator.txt, ...) in a folder and name it as "
        f"tu:/path/to/{spec.tu_name} (or set --data_dir / $HSCL_ZOO_TU_ROOT to the folder above it).")


def _download(root: Path, spec: GraphDatasetSpec) -> None:
    try:
        from torch_geometric.datasets import TUDataset
    except ImportError:
        raise _unavailable(spec, root, "downloading it needs PyTorch Geometric, which is not installed") from None
    try:
        TUDataset(str(root), spec.tu_name)
    except Exception as error:  # network errors come in many types; all mean the same to the user
        raise _unavailable(spec, root, f"the download failed: {type(error).__name__}: {' '.join(str(error).split())}") from None
