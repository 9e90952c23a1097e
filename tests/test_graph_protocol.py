"""The two protocols of the graph table as `run_record` runs them, against the steps composed by
hand here: protocol (a) trains once on every graph, protocol (b) once per outer fold on that fold's
training graphs only; and a protocol-(b) record resumed from its finished folds equals one run
without a stop (issue 38's records take an hour each on IMDB-BINARY, and a session's end kills them)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers import load_script
from hscl_zoo.graphs.catalog import load_graph_dataset
from hscl_zoo.graphs.protocol import RecordKey, Variant, run_record
from hscl_zoo.graphs.svm import outer_folds, svm_fold
from hscl_zoo.graphs.training import train_graph_encoder

BUDGET = {"epochs": 1}
FOLDS = 3
SCL = Variant("scl")


@pytest.fixture(scope="module")
def mutag(tu_root):
    """64 of MUTAG's graphs, drawn at random: both classes in every fold, a second per encoder."""
    graphs = load_graph_dataset("tu:MUTAG", tu_root, download=False)
    return graphs.subset(torch.randperm(len(graphs.labels), generator=torch.Generator().manual_seed(0))[:64])


def by_hand(graphs, protocol: str, seed: int) -> list[dict]:
    labels = graphs.labels.numpy()

    def embed(trained_on):
        return train_graph_encoder(trained_on, "scl", seed, **BUDGET).embed(graphs).numpy().astype(np.float64)

    everything = embed(graphs) if protocol == "a" else None
    rows = []
    for fold, (train, test) in enumerate(outer_folds(labels, seed, FOLDS)):
        embeddings = everything if protocol == "a" else embed(graphs.subset(train))
        rows.append({"fold": fold, **svm_fold(embeddings, labels, train, test)})
    return rows


def without_seconds(record: dict) -> dict:
    return {key: value for key, value in record.items() if key != "seconds"}


@pytest.mark.parametrize("protocol", ["a", "b"])
def test_each_protocol_trains_on_the_graphs_it_names(mutag, protocol):
    record = run_record(mutag, RecordKey("MUTAG", protocol, SCL, 1), BUDGET, folds=FOLDS)
    assert record["folds"] == by_hand(mutag, protocol, seed=1)
    assert record["mean_test_accuracy"] == pytest.approx(np.mean([f["test_accuracy"] for f in record["folds"]]))


def test_a_protocol_b_record_resumes_from_its_finished_folds(mutag, tmp_path):
    key = RecordKey("MUTAG", "b", SCL, 0)
    uninterrupted = run_record(mutag, key, BUDGET, folds=FOLDS)
    progress = tmp_path / "seed0.folds"
    assert without_seconds(run_record(mutag, key, BUDGET, folds=FOLDS, progress=progress)) == \
        without_seconds(uninterrupted)
    kept = sorted(p.name for p in progress.iterdir())
    assert kept == [f"fold{k}.json" for k in range(FOLDS)]
    assert all(json.loads((progress / name).read_text())["seconds"] > 0 for name in kept)

    # a stop after fold 1: fold 2 is trained again, folds 0 and 1 are read back as kept
    (progress / "fold2.json").unlink()
    marked = json.loads((progress / "fold0.json").read_text()) | {"test_accuracy": 0.125, "seconds": 1000.0}
    (progress / "fold0.json").write_text(json.dumps(marked))
    resumed = run_record(mutag, key, BUDGET, folds=FOLDS, progress=progress)
    assert resumed["folds"][0]["test_accuracy"] == 0.125 and "seconds" not in resumed["folds"][0]
    assert resumed["folds"][1:] == uninterrupted["folds"][1:]
    assert resumed["seconds"] >= 1000.0


def test_the_table_recipe_resumes_a_record_from_its_kept_folds_and_clears_them(tu_root, tmp_path):
    """recipes/graph_table.py on MUTAG, protocol (b), one record: a fold kept by a killed worker is
    read back, not trained again; once the record lands its folds folder and claim are gone."""
    table = load_script("recipes", "graph_table")
    out = tmp_path / "records"
    kept = out / "MUTAG" / "protocol-b" / "ucl" / "seed0.folds"
    kept.mkdir(parents=True)
    marker = {"fold": 0, "C": 1.0, "inner_accuracy": 0.5, "test_accuracy": 0.125, "seconds": 1.0}
    (kept / "fold0.json").write_text(json.dumps(marker))
    argv = ["--data_dir", str(tu_root), "--out", str(out), "--phase", "b:0:MUTAG", "--epochs", "1", "--limit", "1"]
    assert table.main(argv) == 0
    record = json.loads((out / "MUTAG" / "protocol-b" / "ucl" / "seed0.json").read_text())
    assert record["folds"][0] == {k: v for k, v in marker.items() if k != "seconds"}
    assert [f["fold"] for f in record["folds"]] == list(range(10)) and record["provenance"]["command"].endswith("--limit 1")
    assert sorted(p.name for p in (out / "MUTAG" / "protocol-b" / "ucl").iterdir()) == ["seed0.json"]
