"""Node features: what a GIN sees at each node, fixed by the training set and saved with the encoder.

Datasets with node labels (MUTAG, PTC_MR, ENZYMES) get the one-hot code of the label, as PyTorch
Geometric's ``TUDataset`` builds by default (ENZYMES' 18 continuous attributes are left out, as
there). Datasets without node labels (IMDB-BINARY, IMDB-MULTI) get the one-hot code of the node's
degree up to the largest degree of the training set, as InfoGraph's and HCL's graph code do
(``OneHotDegree(max_degree)``); a larger degree in new graphs is clipped to the last column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from hscl_zoo.graphs.graphset import GraphSet

__all__ = ["NodeFeatures"]


@dataclass(frozen=True)
class NodeFeatures:
    """One-hot node features: of the TU node label (``kind="labels"``, the label values in
    `values`) or of the degree (``kind="degree"``, degrees 0..`max_degree`)."""

    kind: str
    values: tuple[int, ...] = ()
    max_degree: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("labels", "degree"):
            raise ValueError(f"node features are 'labels' or 'degree', got {self.kind!r}.")

    @classmethod
    def fit(cls, graphs: GraphSet) -> NodeFeatures:
        """The features a set's own graphs define: its node labels when it has them, else degrees."""
        if graphs.node_labels is not None:
            return cls("labels", values=tuple(int(v) for v in torch.unique(graphs.node_labels)))
        return cls("degree", max_degree=int(graphs.degrees().max()))

    @property
    def dim(self) -> int:
        return len(self.values) if self.kind == "labels" else self.max_degree + 1

    def __call__(self, graphs: GraphSet) -> Tensor:
        """The (num_nodes, dim) float32 feature matrix of `graphs`."""
        if self.kind == "degree":
            index = graphs.degrees().clamp_max(self.max_degree)
            return torch.nn.functional.one_hot(index, self.dim).float()
        if graphs.node_labels is None:
            raise ValueError(f"{graphs.name} has no node labels, but these features one-hot node labels; "
                             f"give the graphs a {graphs.name}_node_labels.txt.")
        values = torch.tensor(self.values)
        position = torch.searchsorted(values, graphs.node_labels)
        known = (position < len(values)) & (values[position.clamp_max(len(values) - 1)] == graphs.node_labels)
        x = torch.zeros(graphs.num_nodes, self.dim)
        x[known.nonzero().squeeze(1), position[known]] = 1.0
        return x

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "values": list(self.values), "max_degree": self.max_degree}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> NodeFeatures:
        return cls(config["kind"], tuple(config.get("values", ())), int(config.get("max_degree", 0)))
