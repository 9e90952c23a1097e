"""`GraphSet`: a graph-classification dataset as a few flat tensors, and its mini-batches.

All graphs share one node numbering; graph g owns nodes ``node_ptr[g]:node_ptr[g+1]`` and edges
``edge_ptr[g]:edge_ptr[g+1]`` of `edge_index` (both directions of every undirected edge, no
duplicates, grouped by graph). A batch of any graph ids is then a handful of index operations,
with no Python loop over graphs, so an epoch on these small datasets costs arithmetic only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["GraphSet", "GraphBatch"]


@dataclass(frozen=True)
class GraphBatch:
    """Graphs packed for a GIN: node features, local edge ids, each node's graph, graph labels."""

    x: Tensor
    edge_index: Tensor
    batch: Tensor
    labels: Tensor

    @property
    def num_graphs(self) -> int:
        return int(self.labels.numel())


def _ranges(starts: Tensor, counts: Tensor) -> Tensor:
    """The concatenation of ``arange(s, s + c)`` for every (s, c)."""
    total = int(counts.sum())
    offsets = torch.cumsum(counts, 0) - counts
    return torch.repeat_interleave(starts - offsets, counts) + torch.arange(total, dtype=starts.dtype)


@dataclass(frozen=True)
class GraphSet:
    """Graphs of one dataset. `labels` are 0..C-1; `class_names` are the original label values;
    `node_labels` are the raw TU node labels, or None where the dataset has none."""

    name: str
    edge_index: Tensor
    node_ptr: Tensor
    edge_ptr: Tensor
    labels: Tensor
    class_names: tuple[str, ...]
    node_labels: Tensor | None = None

    @property
    def num_graphs(self) -> int:
        return int(self.labels.numel())

    @property
    def num_nodes(self) -> int:
        return int(self.node_ptr[-1])

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def nodes_per_graph(self) -> Tensor:
        return self.node_ptr[1:] - self.node_ptr[:-1]

    def edges_per_graph(self) -> Tensor:
        return self.edge_ptr[1:] - self.edge_ptr[:-1]

    def degrees(self) -> Tensor:
        """Each node's number of neighbours."""
        return torch.bincount(self.edge_index[0], minlength=self.num_nodes)

    def batch(self, graph_ids: Tensor, x: Tensor) -> GraphBatch:
        """Pack the graphs `graph_ids` (in that order) with node features `x` (one row per node of
        the whole set) into one disconnected graph."""
        graph_ids = torch.as_tensor(graph_ids, dtype=torch.long)
        node_counts = self.node_ptr[graph_ids + 1] - self.node_ptr[graph_ids]
        edge_counts = self.edge_ptr[graph_ids + 1] - self.edge_ptr[graph_ids]
        nodes = _ranges(self.node_ptr[graph_ids], node_counts)
        edges = self.edge_index[:, _ranges(self.edge_ptr[graph_ids], edge_counts)]
        new_start = torch.cumsum(node_counts, 0) - node_counts
        shift = torch.repeat_interleave(new_start - self.node_ptr[graph_ids], edge_counts)
        return GraphBatch(
            x=x[nodes],
            edge_index=edges + shift,
            batch=torch.repeat_interleave(torch.arange(graph_ids.numel()), node_counts),
            labels=self.labels[graph_ids],
        )

    def subset(self, graph_ids: Tensor) -> GraphSet:
        """The graphs `graph_ids` as a set of their own (labels and class names kept as they are)."""
        graph_ids = torch.as_tensor(graph_ids, dtype=torch.long)
        node_counts = self.node_ptr[graph_ids + 1] - self.node_ptr[graph_ids]
        nodes = _ranges(self.node_ptr[graph_ids], node_counts)
        packed = self.batch(graph_ids, torch.zeros(self.num_nodes, 0))
        return GraphSet(
            name=self.name,
            edge_index=packed.edge_index,
            node_ptr=torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(node_counts, 0)]),
            edge_ptr=torch.cat([torch.zeros(1, dtype=torch.long),
                                torch.cumsum(self.edge_ptr[graph_ids + 1] - self.edge_ptr[graph_ids], 0)]),
            labels=self.labels[graph_ids],
            class_names=self.class_names,
            node_labels=None if self.node_labels is None else self.node_labels[nodes],
        )
