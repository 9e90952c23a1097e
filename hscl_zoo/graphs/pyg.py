"""PyTorch Geometric's graphs as a `GraphSet`: a ``Data``, a ``Batch`` or a list/dataset of ``Data``.

Edges are read from ``edge_index`` (made symmetric, duplicates dropped, as the TU reader does),
labels from ``y`` when present. Node features that one-hot TU node labels are read back into
labels: column k of ``x`` is the label ``values[0] + k``, the layout of ``TUDataset``'s ``x``.
"""

from __future__ import annotations

from typing import Any

import torch

from hscl_zoo.graphs.features import NodeFeatures
from hscl_zoo.graphs.graphset import GraphSet

__all__ = ["graphset_from_pyg"]


def graphset_from_pyg(data: Any, node_features: NodeFeatures) -> GraphSet:
    """Convert PyG graphs for an encoder whose node features are `node_features`."""
    try:
        from torch_geometric.data import Batch, Data
    except ImportError:
        raise ValueError("PyTorch Geometric graphs need PyTorch Geometric: pip install 'hscl-zoo[graphs]'.") from None
    if isinstance(data, Data) and not isinstance(data, Batch):
        data = Batch.from_data_list([data])
    elif not isinstance(data, Batch):
        try:
            data = Batch.from_data_list(list(data))
        except Exception:
            raise ValueError(f"expected a GraphSet, a TU folder, or PyTorch Geometric Data/Batch/list of Data; "
                             f"got {type(data).__name__}.") from None
    num_nodes = int(data.num_nodes)
    batch = data.batch if data.batch is not None else torch.zeros(num_nodes, dtype=torch.long)
    if batch.numel() and bool((batch[1:] < batch[:-1]).any()):
        raise ValueError("the nodes of each graph must be consecutive, as PyG's Batch lays them out.")
    graphs = int(data.num_graphs)
    nodes_per_graph = torch.bincount(batch, minlength=graphs)
    if bool((nodes_per_graph == 0).any()):
        raise ValueError(f"graph {int((nodes_per_graph == 0).nonzero()[0])} has no nodes; every graph needs one.")
    edges = data.edge_index.long()
    both = torch.cat([edges, edges.flip(0)], dim=1)
    both = both[:, both[0] != both[1]]
    keys = torch.unique(both[0] * num_nodes + both[1])
    edge_index = torch.stack([keys // num_nodes, keys % num_nodes])
    edges_per_graph = torch.bincount(batch[edge_index[0]], minlength=graphs)
    node_labels = None
    if node_features.kind == "labels":
        x = getattr(data, "x", None)
        if x is None or x.shape[1] != node_features.dim:
            raise ValueError(f"this encoder one-hots {node_features.dim} node labels; the graphs' x has "
                             f"{None if x is None else x.shape[1]} columns. Pass graphs with the same node features.")
        node_labels = x.argmax(dim=1) + node_features.values[0]
    y = getattr(data, "y", None)
    labels = y.long().view(-1) if y is not None and y.numel() == graphs else torch.zeros(graphs, dtype=torch.long)
    zero = torch.zeros(1, dtype=torch.long)
    return GraphSet("pyg", edge_index, torch.cat([zero, nodes_per_graph.cumsum(0)]),
                    torch.cat([zero, edges_per_graph.cumsum(0)]), labels,
                    tuple(str(c) for c in range(int(labels.max()) + 1)), node_labels)
