"""The GIN encoder: each layer equals PyTorch Geometric's GINConv, and a graph's embedding does not
depend on the order of its nodes."""

import pytest
import torch

from hscl_zoo.graphs.encoder import GINLayer, GraphEncoder
from hscl_zoo.graphs.features import NodeFeatures
from hscl_zoo.graphs.graphset import GraphSet


def _random_set(seed=0, graphs=5):
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(2, 7, (graphs,), generator=gen)
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
    edges = []
    for g in range(graphs):
        n = int(sizes[g])
        for i in range(n):
            for j in range(i + 1, n):
                if torch.rand((), generator=gen) < 0.5:
                    edges += [(int(ptr[g]) + i, int(ptr[g]) + j), (int(ptr[g]) + j, int(ptr[g]) + i)]
    edges.sort()
    edge_index = torch.tensor(edges, dtype=torch.long).T
    per_graph = torch.bincount(torch.bucketize(edge_index[0], ptr[1:], right=True), minlength=graphs)
    return GraphSet("random", edge_index, ptr, torch.cat([torch.zeros(1, dtype=torch.long), per_graph.cumsum(0)]),
                    torch.arange(graphs) % 2, ("a", "b"), torch.randint(0, 4, (int(ptr[-1]),), generator=gen))


def test_a_gin_layer_equals_pyg_ginconv_with_the_same_mlp():
    geometric = pytest.importorskip("torch_geometric.nn", reason="PyTorch Geometric is the test extra's")
    graphs = _random_set(1)
    x = torch.randn(graphs.num_nodes, 4)
    layer = GINLayer(4, 8)
    reference = geometric.GINConv(layer.mlp, eps=0.0, train_eps=False)
    torch.testing.assert_close(layer(x, graphs.edge_index), reference(x, graphs.edge_index), rtol=1e-6, atol=1e-6)


def test_the_graph_embedding_is_invariant_to_the_order_of_nodes():
    graphs = _random_set(2)
    features = NodeFeatures.fit(graphs)
    encoder = GraphEncoder(features).eval()
    before = encoder.embed(graphs)
    gen = torch.Generator().manual_seed(3)
    order = torch.cat([int(graphs.node_ptr[g]) + torch.randperm(int(n), generator=gen)
                       for g, n in enumerate(graphs.nodes_per_graph())])
    new_id = torch.empty_like(order)
    new_id[order] = torch.arange(order.numel())
    edges = new_id[graphs.edge_index]
    edges = edges[:, torch.argsort(edges[0] * graphs.num_nodes + edges[1])]
    permuted = GraphSet(graphs.name, edges, graphs.node_ptr, graphs.edge_ptr, graphs.labels, graphs.class_names,
                        graphs.node_labels[order])
    after = encoder.embed(permuted)
    assert not torch.equal(permuted.node_labels, graphs.node_labels)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_batching_a_subset_gives_the_embeddings_of_those_graphs():
    graphs = _random_set(4, graphs=7)
    encoder = GraphEncoder(NodeFeatures.fit(graphs)).eval()
    ids = torch.tensor([5, 0, 3])
    torch.testing.assert_close(encoder.embed(graphs.subset(ids)), encoder.embed(graphs)[ids], rtol=1e-5, atol=1e-5)


def test_a_config_round_trip_rebuilds_the_same_architecture():
    graphs = _random_set(5)
    encoder = GraphEncoder(NodeFeatures.fit(graphs), hidden=16, layers=2, class_names=("x", "y"))
    clone = GraphEncoder.from_config(encoder.to_config())
    clone.load_state_dict(encoder.state_dict())
    torch.testing.assert_close(clone.eval().embed(graphs), encoder.eval().embed(graphs))
