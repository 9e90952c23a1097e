"""A trained graph encoder as a user meets it: PyTorch Geometric's TUDataset, Data and Batch embed
as the TU folder does, the linear head predicts what scikit-learn's pipeline predicts, and a saved
folder loads back to the same encoder (and refuses a broken one)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from hscl_zoo.graphs.encoder import GraphEncoder
from hscl_zoo.graphs.features import NodeFeatures
from hscl_zoo.graphs.heads import fit_linear_head
from hscl_zoo.graphs.saving import load_graph_encoder, save_graph_encoder
from hscl_zoo.graphs.training import train_graph_encoder
from hscl_zoo.graphs.tu import read_tu


@pytest.fixture(scope="module")
def mutag(tu_root):
    return read_tu(tu_root / "MUTAG")


@pytest.fixture(scope="module")
def trained(mutag):
    encoder = train_graph_encoder(mutag, "hscl-beta", 0, epochs=2, loss_kwargs={"beta": 2.0})
    fit_linear_head(encoder, mutag, seed=0, folds=5)
    return encoder


def _pyg_copy(tu_root: Path, name: str, tmp_path: Path):
    """PyG's TUDataset over a copy of the raw files (it writes processed/ beside raw/)."""
    datasets = pytest.importorskip("torch_geometric.datasets", reason="PyTorch Geometric is the test extra's")
    shutil.copytree(tu_root / name / "raw", tmp_path / name / "raw")
    return datasets.TUDataset(str(tmp_path), name)


def test_pyg_dataset_data_and_batch_embed_as_the_tu_folder(trained, tu_root, tmp_path):
    from torch_geometric.data import Batch

    pyg = _pyg_copy(tu_root, "MUTAG", tmp_path)
    assert len(pyg) == 188 and pyg.num_features == trained.node_features.dim
    expected = trained.embed(tu_root / "MUTAG")
    torch.testing.assert_close(trained.embed(pyg), expected, rtol=1e-5, atol=1e-5)
    rows = [3, 0, 150]
    batch = Batch.from_data_list([pyg[i] for i in rows])
    torch.testing.assert_close(trained.embed(batch), expected[rows], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(trained.embed(pyg[7]), expected[7:8], rtol=1e-5, atol=1e-5)
    assert trained.predict(batch).argmax(1).tolist() == trained.predict(tu_root / "MUTAG")[rows].argmax(1).tolist()


def test_pyg_one_hot_labels_starting_at_one_embed_as_the_tu_folder(tu_root, tmp_path):
    """ENZYMES' node labels are 1..3; PyG's column k is label 1 + k."""
    graphs = read_tu(tu_root / "ENZYMES")
    encoder = GraphEncoder(NodeFeatures.fit(graphs)).eval()
    assert encoder.node_features.values == (1, 2, 3)
    pyg = _pyg_copy(tu_root, "ENZYMES", tmp_path)
    torch.testing.assert_close(encoder.embed(pyg), encoder.embed(graphs), rtol=1e-5, atol=1e-5)


def test_pyg_graphs_without_node_labels_embed_by_degree_as_the_tu_folder(tu_root, tmp_path):
    graphs = read_tu(tu_root / "IMDB-BINARY").subset(torch.arange(0, 1000, 25))
    encoder = train_graph_encoder(graphs, "ucl", 0, epochs=1)
    assert encoder.node_features.kind == "degree"
    pyg = _pyg_copy(tu_root, "IMDB-BINARY", tmp_path)[0:1000:25]
    torch.testing.assert_close(encoder.embed(pyg), encoder.embed(graphs), rtol=1e-5, atol=1e-5)


def test_the_linear_head_predicts_what_the_scikit_learn_pipeline_predicts(trained, mutag):
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    x = trained.embed(mutag).double().numpy()
    y = mutag.labels.numpy()
    scaler = StandardScaler().fit(x)
    reference = LogisticRegression(max_iter=2000, random_state=0).fit(scaler.transform(x), y)
    expected = reference.predict_proba(scaler.transform(x))
    np.testing.assert_allclose(trained.predict(mutag).numpy(), expected, atol=1e-4)
    assert trained.class_names == ("-1", "1")


def test_a_saved_folder_loads_back_to_the_same_encoder(trained, mutag, tmp_path):
    folder = save_graph_encoder(trained, tmp_path / "hub")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "graph-gin" and config["metadata"]["beta"] == 2.0
    loaded = load_graph_encoder(folder)
    assert not loaded.training and loaded.class_names == trained.class_names
    for key, value in trained.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    assert torch.equal(loaded.embed(mutag), trained.embed(mutag))
    assert torch.equal(loaded.predict(mutag), trained.predict(mutag))


def test_a_broken_folder_is_refused_in_one_line(trained, tmp_path):
    folder = save_graph_encoder(trained, tmp_path / "hub")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "class_names": []}))
    with pytest.raises(ValueError, match="weights hold a linear head but config.json names no classes"):
        load_graph_encoder(folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="lacks model.safetensors"):
        load_graph_encoder(folder)
