"""Reading a TU graph-classification folder (Morris et al.'s text format) into a `GraphSet`.

A folder holds ``NAME_A.txt`` (one directed edge ``i, j`` per line, 1-based node ids),
``NAME_graph_indicator.txt`` (the graph of each node), ``NAME_graph_labels.txt`` (one label per
graph) and optionally ``NAME_node_labels.txt``. PyTorch Geometric's ``TUDataset(root, name)``
keeps them in ``root/NAME/raw/``; this reader takes that folder, its parent, or the raw folder
itself, and never writes anything. Edges are made symmetric and duplicates dropped (the IMDB
files list every directed edge twice); graph labels are mapped to 0..C-1 in sorted order, and
the original values are kept as class names.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hscl_zoo.graphs.graphset import GraphSet

__all__ = ["TUFormatError", "find_tu_folder", "read_tu"]


class TUFormatError(ValueError):
    """A TU folder that cannot be read as a graph-classification dataset."""


def find_tu_folder(path: str | Path, name: str | None = None) -> tuple[Path, str]:
    """The folder holding ``NAME_A.txt`` and the dataset name, from a dataset folder, its parent
    (PyG's ``root``, with `name`) or its ``raw/`` folder."""
    path = Path(path).expanduser()
    name = name or (path.parent.name if path.name == "raw" else path.name)
    for folder in (path / name / "raw", path / "raw", path):
        if (folder / f"{name}_A.txt").is_file():
            return folder, name
    raise TUFormatError(
        f"no TU dataset {name!r} at {path}: expected {name}_A.txt there or in {path / 'raw'}; "
        f"point at the folder that holds the {name}_*.txt files."
    )


def _integers(file: Path, columns: int) -> np.ndarray:
    text = file.read_text()
    try:
        values = np.array(text.replace(",", " ").split(), dtype=np.int64)
    except ValueError:
        bad = next(line for line in text.splitlines() if not _parses(line))
        raise TUFormatError(f"{file.name}: {bad.strip()!r} is not an integer line; each line holds "
                            f"{columns} integer(s) separated by ','.") from None
    if columns > 1 and values.size % columns:
        raise TUFormatError(f"{file.name}: {values.size} numbers do not form pairs; each line is 'i, j'.")
    return values.reshape(-1, columns) if columns > 1 else values


def _parses(line: str) -> bool:
    try:
        [int(v) for v in line.replace(",", " ").split()]
    except ValueError:
        return False
    return True


def read_tu(path: str | Path, name: str | None = None) -> GraphSet:
    """Read a TU folder; every inconsistency is one `TUFormatError` line, before anything is built."""
    folder, name = find_tu_folder(path, name)
    files = {part: folder / f"{name}_{part}.txt" for part in ("A", "graph_indicator", "graph_labels")}
    for part, file in files.items():
        if not file.is_file():
            raise TUFormatError(f"{folder} lacks {file.name}; a TU dataset needs {name}_A.txt, "
                                f"{name}_graph_indicator.txt and {name}_graph_labels.txt.")
    edges = _integers(files["A"], 2) - 1
    indicator = _integers(files["graph_indicator"], 1) - 1
    raw_labels = _integers(files["graph_labels"], 1)
    num_graphs, num_nodes = raw_labels.size, indicator.size
    if num_nodes == 0 or num_graphs == 0:
        raise TUFormatError(f"{name}: no graphs or no nodes in {folder}.")
    if np.any(np.diff(indicator) < 0):
        raise TUFormatError(f"{files['graph_indicator'].name}: graph ids must be sorted (nodes of a graph are consecutive).")
    if indicator.min() < 0 or indicator.max() >= num_graphs:
        raise TUFormatError(f"{files['graph_indicator'].name}: graph ids run 1..{indicator.max() + 1}, "
                            f"but {files['graph_labels'].name} has {num_graphs} labels.")
    nodes_per_graph = np.bincount(indicator, minlength=num_graphs)
    empty = np.flatnonzero(nodes_per_graph == 0)
    if empty.size:
        raise TUFormatError(f"{name}: graph {empty[0] + 1} has no nodes ({empty.size} empty graph(s)); "
                            "remove it from the graph labels or give it nodes.")
    if edges.size and (edges.min() < 0 or edges.max() >= num_nodes):
        raise TUFormatError(f"{files['A'].name}: node id {int(edges.max()) + 1} outside 1..{num_nodes}.")
    if edges.size and np.any(indicator[edges[:, 0]] != indicator[edges[:, 1]]):
        raise TUFormatError(f"{files['A'].name}: an edge joins two different graphs.")
    node_labels = None
    node_file = folder / f"{name}_node_labels.txt"
    if node_file.is_file():
        node_labels = _integers(node_file, 1)
        if node_labels.size != num_nodes:
            raise TUFormatError(f"{node_file.name}: {node_labels.size} labels for {num_nodes} nodes.")
    classes, labels = np.unique(raw_labels, return_inverse=True)
    both = np.concatenate([edges, edges[:, ::-1]])
    both = both[both[:, 0] != both[:, 1]]
    keys = np.unique(both[:, 0] * num_nodes + both[:, 1])
    unique = np.stack([keys // num_nodes, keys % num_nodes], axis=1)
    edges_per_graph = np.bincount(indicator[unique[:, 0]], minlength=num_graphs)
    return GraphSet(
        name=name,
        edge_index=torch.from_numpy(np.ascontiguousarray(unique.T)),
        node_ptr=torch.from_numpy(np.concatenate([[0], np.cumsum(nodes_per_graph)])),
        edge_ptr=torch.from_numpy(np.concatenate([[0], np.cumsum(edges_per_graph)])),
        labels=torch.from_numpy(labels.astype(np.int64)),
        class_names=tuple(str(c) for c in classes),
        node_labels=None if node_labels is None else torch.from_numpy(node_labels),
    )
