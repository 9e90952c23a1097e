"""The graph encoder of InfoGraph (Sun et al. 2020), as the paper's Table 2 uses it.

A GIN (Xu et al. 2019) of `layers` layers of width `hidden`: each layer sums a node's neighbours
with the node itself, applies a two-layer MLP, a ReLU and batch norm. A node's local embedding is
its outputs of all layers concatenated, and a graph's embedding is the per-layer sums over its
nodes, concatenated (``layers * hidden`` dimensions: 96 for the paper's 3 x 32). The objective
compares them through two projection heads (InfoGraph's feed-forward blocks with a linear
shortcut); the SVM and the linear head read the graph embedding itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hscl_zoo.graphs.features import NodeFeatures
from hscl_zoo.graphs.graphset import GraphBatch, GraphSet

__all__ = ["GINLayer", "ProjectionHead", "GraphEncoder", "MODEL_TYPE"]

MODEL_TYPE = "graph-gin"
"""The ``model_type`` in a saved graph encoder's config.json."""


class GINLayer(nn.Module):
    """h'_i = MLP(h_i + sum of h_j over the neighbours j of i) (GIN with epsilon = 0)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(in_dim, out_dim), nn.ReLU(), nn.Linear(out_dim, out_dim))

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        neighbours = torch.zeros_like(x).index_add_(0, edge_index[1], x[edge_index[0]])
        return self.mlp(x + neighbours)


class ProjectionHead(nn.Module):
    """Three Linear-ReLU blocks plus a linear shortcut (InfoGraph's ``FF``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim), nn.ReLU(),
                                   nn.Linear(dim, dim), nn.ReLU())
        self.shortcut = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x) + self.shortcut(x)


class GraphEncoder(nn.Module):
    """GIN encoder with its two projection heads and an optional linear head over graph embeddings.

    Args:
        node_features: how node features are made (fixed on the training graphs).
        hidden: width of each GIN layer (the paper's "representation dimension", 32).
        layers: number of GIN layers (3).
        class_names: the classes of the linear head, if it has one.
        metadata: what trained it (method, dataset, hyperparameters), kept in the config.
    """

    def __init__(self, node_features: NodeFeatures, hidden: int = 32, layers: int = 3,
                 class_names: tuple[str, ...] = (), metadata: dict[str, Any] | None = None) -> None:
        super().__init__()
        if hidden < 1 or layers < 1:
            raise ValueError(f"a GIN needs hidden >= 1 and layers >= 1, got hidden={hidden}, layers={layers}.")
        self.node_features = node_features
        self.hidden, self.layers = int(hidden), int(layers)
        self.class_names = tuple(class_names)
        self.metadata = dict(metadata or {})
        dims = [node_features.dim] + [self.hidden] * self.layers
        self.convs = nn.ModuleList(GINLayer(dims[i], dims[i + 1]) for i in range(self.layers))
        self.norms = nn.ModuleList(nn.BatchNorm1d(self.hidden) for _ in range(self.layers))
        self.local_head = ProjectionHead(self.embed_dim)
        self.global_head = ProjectionHead(self.embed_dim)
        self.head = nn.Linear(self.embed_dim, len(self.class_names)) if self.class_names else None
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)

    @property
    def embed_dim(self) -> int:
        return self.hidden * self.layers

    def forward(self, batch: GraphBatch) -> tuple[Tensor, Tensor]:
        """(graph embeddings (G, embed_dim), node embeddings (N, embed_dim))."""
        x, per_layer = batch.x, []
        for conv, norm in zip(self.convs, self.norms):
            x = norm(torch.relu(conv(x, batch.edge_index)))
            per_layer.append(x)
        nodes = torch.cat(per_layer, dim=1)
        graphs = torch.zeros(batch.num_graphs, nodes.shape[1], dtype=nodes.dtype).index_add_(0, batch.batch, nodes)
        return graphs, nodes

    def project(self, batch: GraphBatch) -> tuple[Tensor, Tensor]:
        """The objective's inputs: (projected graph embeddings, projected node embeddings)."""
        graphs, nodes = self(batch)
        return self.global_head(graphs), self.local_head(nodes)

    @torch.no_grad()
    def embed(self, graphs: Any, batch_size: int = 512) -> Tensor:
        """Graph embeddings (G, embed_dim) in eval mode, of a `GraphSet`, a PyTorch Geometric
        ``Data``/``Batch``/dataset, or a TU folder path."""
        graphs = as_graphset(graphs, self.node_features)
        x = self.node_features(graphs)
        was_training = self.training
        self.eval()
        try:
            ids = torch.arange(graphs.num_graphs)
            return torch.cat([self(graphs.batch(chunk, x))[0] for chunk in ids.split(batch_size)])
        finally:
            self.train(was_training)

    @torch.no_grad()
    def predict(self, graphs: Any) -> Tensor:
        """Class probabilities (G, num_classes) from the linear head."""
        if self.head is None:
            raise ValueError("this graph encoder has no linear head; fit one with hscl_zoo.graphs.heads.fit_linear_head.")
        return torch.softmax(self.head(self.embed(graphs)), dim=1)

    def to_config(self) -> dict[str, Any]:
        return {"model_type": MODEL_TYPE, "node_features": self.node_features.to_config(), "hidden": self.hidden,
                "layers": self.layers, "class_names": list(self.class_names), "metadata": self.metadata}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> GraphEncoder:
        if config.get("model_type") != MODEL_TYPE:
            raise ValueError(f"not a graph encoder config: model_type is {config.get('model_type')!r}, not {MODEL_TYPE!r}.")
        return cls(NodeFeatures.from_config(config["node_features"]), int(config["hidden"]), int(config["layers"]),
                   tuple(config.get("class_names", ())), config.get("metadata"))


def as_graphset(graphs: Any, node_features: NodeFeatures) -> GraphSet:
    """A `GraphSet` from a `GraphSet`, a TU folder path, or PyTorch Geometric data.

    PyG node features are read back as node labels when the encoder one-hots labels: column k of
    ``x`` is label ``values[0] + k``, as ``TUDataset`` builds them.
    """
    if isinstance(graphs, GraphSet):
        return graphs
    if isinstance(graphs, (str, Path)):
        from hscl_zoo.graphs.tu import read_tu

        return read_tu(graphs)
    from hscl_zoo.graphs.pyg import graphset_from_pyg

    return graphset_from_pyg(graphs, node_features)
