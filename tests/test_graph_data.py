"""The TU reader against the published statistics of the five datasets (tudataset/SOURCES.md,
written here as literals), the IMDB files' duplicate edges, the label mapping, and bad folders:
one line each, nothing written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hscl_zoo.graphs.catalog import load_graph_dataset
from hscl_zoo.graphs.tu import TUFormatError, read_tu
from tu_folders import write_tu

# SOURCES.md, "Measured statistics": graphs, {raw label: count}, average nodes, average undirected edges.
PUBLISHED = {
    "MUTAG": (188, {"-1": 63, "1": 125}, 17.93, 19.79),
    "ENZYMES": (600, {str(c): 100 for c in range(1, 7)}, 32.63, 62.14),
    "PTC_MR": (344, {"-1": 192, "1": 152}, 14.29, 14.69),
    "IMDB-BINARY": (1000, {"0": 500, "1": 500}, 19.77, 96.53),
    "IMDB-MULTI": (1500, {"1": 500, "2": 500, "3": 500}, 13.00, 65.94),
}
# SOURCES.md, "Caveats": lines of DS_A.txt and unique directed edges of the IMDB files.
IMDB_LINES = {"IMDB-BINARY": (386_124, 193_062), "IMDB-MULTI": (395_612, 197_806)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_dataset_has_its_published_statistics(tu_root, name):
    graphs, counts, avg_nodes, avg_edges = PUBLISHED[name]
    data = load_graph_dataset(f"tu:{name}", tu_root)
    assert data.num_graphs == graphs
    assert dict(zip(data.class_names, np.bincount(data.labels.numpy()).tolist())) == counts
    assert round(data.num_nodes / graphs, 2) == avg_nodes
    assert data.edge_index.shape[1] % 2 == 0
    assert round(data.edge_index.shape[1] / 2 / graphs, 2) == avg_edges
    assert int(data.nodes_per_graph().min()) >= 1
    edges = data.edge_index.T.tolist()
    assert len({tuple(e) for e in edges}) == len(edges), "no duplicate directed edge"
    assert {(j, i) for i, j in edges} == {tuple(e) for e in edges}, "every edge in both directions"


@pytest.mark.parametrize("name", sorted(IMDB_LINES))
def test_imdb_lists_every_directed_edge_twice_and_the_reader_keeps_one(tu_root, name):
    lines, unique = IMDB_LINES[name]
    file = tu_root / name / "raw" / f"{name}_A.txt"
    assert sum(1 for _ in file.open()) == lines == 2 * unique
    assert read_tu(tu_root / name).edge_index.shape[1] == unique


def _raw_labels(tu_root: Path, name: str) -> np.ndarray:
    return np.loadtxt(tu_root / name / "raw" / f"{name}_graph_labels.txt", dtype=np.int64)


def test_mutag_minus_one_is_class_zero(tu_root):
    data = read_tu(tu_root / "MUTAG")
    raw = _raw_labels(tu_root, "MUTAG")
    assert data.class_names == ("-1", "1")
    np.testing.assert_array_equal(data.labels.numpy(), np.where(raw == -1, 0, 1))


def test_enzymes_one_to_six_are_classes_zero_to_five(tu_root):
    data = read_tu(tu_root / "ENZYMES" / "raw")
    raw = _raw_labels(tu_root, "ENZYMES")
    assert data.class_names == tuple(str(c) for c in range(1, 7))
    np.testing.assert_array_equal(data.labels.numpy(), raw - 1)


def test_the_reader_takes_the_root_the_dataset_folder_or_its_raw_folder(tu_root):
    by_root = read_tu(tu_root, "PTC_MR")
    for path in (tu_root / "PTC_MR", tu_root / "PTC_MR" / "raw"):
        other = read_tu(path)
        assert other.name == "PTC_MR"
        assert other.edge_index.tolist() == by_root.edge_index.tolist()
    assert load_graph_dataset(f"tu:{tu_root / 'PTC_MR'}").labels.tolist() == by_root.labels.tolist()


# Bad folders: a tiny valid TU dataset (tu_folders.write_tu), then one defect at a time.
BAD_FOLDERS = {
    "missing file": (lambda f: (write_tu(f) / "TOY_graph_labels.txt").unlink(), "lacks TOY_graph_labels.txt"),
    "labels that do not parse": (lambda f: write_tu(f, labels=["1", "two"] + ["1"] * 22), "'two' is not an integer"),
    "a graph with no nodes": (lambda f: write_tu(f, indicator=[1 + n // 3 + (n >= 3) for n in range(72)],
                                                 labels=["1", "2"] * 12 + ["1"]), "graph 2 has no nodes"),
}


@pytest.mark.parametrize("case", sorted(BAD_FOLDERS))
def test_a_bad_folder_is_one_line_naming_the_problem(tmp_path, case):
    make, message = BAD_FOLDERS[case]
    folder = tmp_path / "TOY"
    make(folder)
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(TUFormatError) as error:
        load_graph_dataset(f"tu:{folder}")
    assert message in str(error.value) and "\n" not in str(error.value)
    assert sorted(p.name for p in folder.iterdir()) == before, "the reader writes nothing"


def test_the_toy_folder_itself_reads(tmp_path):
    data = read_tu(write_tu(tmp_path / "TOY"))
    assert (data.num_graphs, data.num_nodes, data.edge_index.shape[1]) == (24, 72, 144)
    assert data.labels.tolist() == [0, 1] * 12
