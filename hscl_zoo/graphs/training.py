"""Training a graph encoder with a method's local-global objective (the paper's Table 2 budget).

Adam at lr 0.01, 200 epochs, batches of 128 graphs reshuffled each epoch from the seed: the
paper's budget, with InfoGraph's batch size. One process, one device; on the small TU datasets an
epoch is a few index operations and matrix products, so it runs on one CPU thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hscl_zoo.graphs.encoder import GraphEncoder
from hscl_zoo.graphs.features import NodeFeatures
from hscl_zoo.graphs.graphset import GraphSet
from hscl_zoo.graphs.objective import build_graph_loss
from hscl_zoo.losses.hardening import LinearThresholdSchedule

__all__ = ["GraphTrainConfig", "train_graph_encoder"]

GraphTrainConfig = dict[str, Any]
DEFAULTS: GraphTrainConfig = {"epochs": 200, "lr": 0.01, "batch_size": 128, "hidden": 32, "layers": 3}
"""The paper's budget (epochs, lr, GIN of 3 layers x 32) and InfoGraph's batch size."""


def train_graph_encoder(graphs: GraphSet, method: str, seed: int, *, epochs: int = 200, lr: float = 0.01,
                        batch_size: int = 128, hidden: int = 32, layers: int = 3,
                        loss_kwargs: dict[str, Any] | None = None,
                        on_epoch: Callable[[int, float], None] | None = None) -> GraphEncoder:
    """Train a GIN on all of `graphs` with `method`'s objective; returns it in eval mode.

    `loss_kwargs` go to `build_graph_loss` (beta, threshold, tau_plus, temperature). `on_epoch`
    gets (epoch, mean loss) after every epoch, for progress bars and logs.
    """
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise ValueError(f"need epochs >= 1, batch_size >= 1 and lr > 0, got {epochs}, {batch_size}, {lr}.")
    loss_kwargs = dict(loss_kwargs or {})
    loss_fn = build_graph_loss(method, **loss_kwargs)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    features = NodeFeatures.fit(graphs)
    metadata = {"method": method, "dataset": graphs.name, "seed": seed, "epochs": epochs, "lr": lr,
                "batch_size": batch_size, **loss_kwargs}
    encoder = GraphEncoder(features, hidden, layers, metadata=metadata)
    optimizer = torch.optim.Adam(encoder.parameters(), lr=lr)
    x = features(graphs)
    schedule = getattr(loss_fn.hardening, "level", None)
    encoder.train()
    for epoch in range(1, epochs + 1):
        if isinstance(schedule, LinearThresholdSchedule):
            schedule.set_epoch(epoch)
        order = torch.randperm(graphs.num_graphs, generator=generator)
        total = 0.0
        for ids in order.split(batch_size):
            batch = graphs.batch(ids, x)
            graph_proj, node_proj = encoder.project(batch)
            loss = loss_fn(graph_proj, node_proj, batch.batch, batch.labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(ids)
        if on_epoch is not None:
            on_epoch(epoch, total / graphs.num_graphs)
    return encoder.eval()
