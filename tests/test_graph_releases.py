"""Graph encoders as zoo releases (issues 38 and 39): a short MUTAG run released, loaded back by
name from a mirror, its files and numbers checked against the run and against sklearn fitted by
hand; names that say the wrong thing, files that are not the run's encoder and a precision a
graph release does not take are refused before anything is written; beta for a release is
chosen on training folds only, checked on records built by hand."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import hscl_zoo
from hscl_zoo.cli import main
from hscl_zoo.graphs.cards import render_graph_card
from hscl_zoo.graphs.catalog import load_graph_dataset
from hscl_zoo.graphs.encoder import GraphEncoder
from hscl_zoo.graphs.protocol import GRAPH_VARIANTS
from hscl_zoo.graphs.release import build_graph_release
from hscl_zoo.graphs.saving import load_graph_encoder
from hscl_zoo.graphs.summary import release_variant
from hscl_zoo.publishing.release import ReleaseRefused, register_release
from hscl_zoo.zoo import registry
from hscl_zoo.zoo.releases import RELEASES_ENV

NAME = "hscl-beta-mutag.test-3ep"


@pytest.fixture(scope="module")
def short_run(tu_root, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("graph-run") / "run"
    assert main(["train", "--dataset", "tu:MUTAG", "--method", "hscl-beta", "--beta", "2", "--epochs", "3",
                 "--data_dir", str(tu_root), "--no_progress", "--output_dir", str(run)]) == 0
    return run


@pytest.fixture(scope="module")
def release(short_run, tu_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("graph-releases") / NAME
    return build_graph_release(short_run, NAME, data_dir=tu_root, out=out, selection="beta fixed at 2 for a test")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_release_holds_the_runs_float32_encoder_and_the_evaluation_of_its_own_files(release, short_run) -> None:
    folder = release.folder
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "eval.json", "model.safetensors"]
    assert (folder / "model.safetensors").read_bytes() == (short_run / "hub" / "model.safetensors").read_bytes()
    assert {k: v["sha256"] for k, v in release.entry["files"].items()} == \
        {p.name: _sha256(p) for p in folder.iterdir()}
    run = json.loads((short_run / "eval.json").read_text())
    evaluation = json.loads((folder / "eval.json").read_text())
    assert [f["test_accuracy"] for f in evaluation["svm"]["folds"]] == [f["test_accuracy"] for f in run["svm"]["folds"]]
    by_hand = 100 * sum(f["test_accuracy"] for f in evaluation["svm"]["folds"]) / 10
    assert release.entry["metrics"] == {"svm_accuracy": round(by_hand, 2),
                                        "linear_cv_accuracy": round(100 * run["linear_head"]["cv_accuracy"], 2)}
    assert evaluation["train_command"].startswith("hscl-zoo train --dataset tu:MUTAG --method hscl-beta --beta 2 ")
    assert "--epochs 3" in evaluation["train_command"] and "beta fixed at 2 for a test" in evaluation["budget"]
    card = (folder / "README.md").read_text()
    assert f"| this model: SVM accuracy, 10-fold cross-validation of the frozen embeddings (seed 0's folds) | " \
           f"{by_hand:.2f} |" in card
    assert "| the paper's Table 2 (MUTAG, H-SCL(β)) | 87.2 |" in card and "hscl_zoo.load(\"hscl-beta-mutag.test-3ep\")" in card


def test_registered_it_loads_by_name_and_predicts_what_eval_json_says(release, short_run, tu_root,
                                                                      monkeypatch, capsys) -> None:
    monkeypatch.setenv(RELEASES_ENV, str(release.folder.parent))
    monkeypatch.setitem(registry._RELEASES, NAME, release.entry)
    registry.register_model(registry.release_entry(NAME, json.loads(json.dumps(release.entry))))
    try:
        model = hscl_zoo.load(NAME)
        assert isinstance(model, GraphEncoder)
        graphs = load_graph_dataset("tu:MUTAG", tu_root)
        assert torch.equal(model.embed(graphs), load_graph_encoder(short_run / "hub").embed(graphs))
        predicted = model.predict(tu_root / "MUTAG").argmax(1).tolist()
        right = sum(int(p == y) for p, y in zip(predicted, graphs.labels.tolist()))
        assert right / len(predicted) == release.evaluation["head_accuracy"]
        entry = registry.info(NAME)
        assert entry.modality == "graph" and entry.hyperparameters == {"beta": 2.0} and "beta = 2" in entry.summary()
        assert main(["list", "hscl-beta-mutag*", "--published"]) == 0
        assert NAME in capsys.readouterr().out
    finally:
        registry._ENTRIES.remove(NAME)


def test_its_folds_come_back_from_sklearn_fitted_by_hand_on_the_released_embeddings(release, tu_root) -> None:
    from sklearn.model_selection import StratifiedKFold
    from sklearn.svm import SVC

    graphs = load_graph_dataset("tu:MUTAG", tu_root)
    x = load_graph_encoder(release.folder).embed(graphs).double().numpy()
    y = graphs.labels.numpy()
    splits = StratifiedKFold(n_splits=10, shuffle=True, random_state=0).split(np.zeros((len(y), 1)), y)
    for (train, test), fold in zip(splits, release.evaluation["svm"]["folds"]):
        assert SVC(C=fold["C"]).fit(x[train], y[train]).score(x[test], y[test]) == fold["test_accuracy"]


def test_a_name_must_say_what_was_trained_and_at_which_budget(short_run, tu_root, tmp_path) -> None:
    out = tmp_path / "release"
    with pytest.raises(ValueError, match="not at Table 2's budget .* name it hscl-beta-mutag.TAG"):
        build_graph_release(short_run, "hscl-beta-mutag", data_dir=tu_root, out=out)
    with pytest.raises(ValueError, match="trained hscl-beta on MUTAG, so its zoo name is 'hscl-beta-mutag'"):
        build_graph_release(short_run, "scl-mutag.test", data_dir=tu_root, out=out)
    assert not out.exists()


def test_files_that_are_not_the_runs_encoder_are_refused_and_nothing_is_written(short_run, tu_root, tmp_path) -> None:
    run = tmp_path / "run"
    shutil.copytree(short_run, run)
    weights = load_file(run / "hub" / "model.safetensors")
    weights["head.weight"] = torch.zeros_like(weights["head.weight"])
    save_file(weights, run / "hub" / "model.safetensors")
    out = tmp_path / "releases" / NAME
    with pytest.raises(ReleaseRefused, match=r"head accuracy is .* the run's was .* \(at most 0.2 points apart\)"):
        build_graph_release(run, NAME, data_dir=tu_root, out=out)
    assert not out.exists()


def test_the_command_line_keeps_a_graph_release_in_float32(short_run, tmp_path, capsys) -> None:
    out = tmp_path / "release"
    assert main(["release", str(short_run), "--name", NAME, "--dtype", "bf16", "--out", str(out)]) != 0
    assert "a graph encoder (a few hundred KB) is released in float32" in capsys.readouterr().err
    assert not out.exists()


def _record(dataset: str, variant: str, seed: int, inner: list[float]) -> dict:
    method = next(v.method for v in GRAPH_VARIANTS if v.name == variant)
    return {"dataset": dataset, "protocol": "a", "variant": variant, "method": method, "seed": seed,
            "folds": [{"fold": k, "inner_accuracy": a, "test_accuracy": 1.0 - a} for k, a in enumerate(inner)]}


def test_beta_for_a_release_is_the_best_mean_inner_accuracy_over_the_seeds_all_betas_share() -> None:
    records = [
        _record("MUTAG", "hscl-beta-b1", 0, [0.80, 0.70]), _record("MUTAG", "hscl-beta-b1", 1, [0.90, 0.60]),
        _record("MUTAG", "hscl-beta-b2", 0, [0.70, 0.90]), _record("MUTAG", "hscl-beta-b2", 1, [0.80, 0.70]),
        _record("MUTAG", "hscl-beta-b10", 0, [0.60, 0.60]), _record("MUTAG", "hscl-beta-b10", 1, [0.60, 0.60]),
        _record("MUTAG", "hscl-beta-b10", 2, [1.00, 1.00]),  # seed 2 has no b1 or b2: not counted
    ]
    # means over the four folds of seeds 0 and 1: b1 0.75, b2 0.775, b10 0.60; the test accuracies favour b10
    variant, phrase = release_variant(records, "hscl-beta")
    assert variant.name == "hscl-beta-b2"
    assert "over the 4 folds of protocol (a)'s seeds 0, 1 (1: 75.00 %, 2: 77.50 %, 10: 60.00 %)" in phrase
    tied = [r for r in records if r["variant"] != "hscl-beta-b2"] + [
        _record("MUTAG", "hscl-beta-b2", 0, [0.80, 0.70]), _record("MUTAG", "hscl-beta-b2", 1, [0.90, 0.60])]
    assert release_variant(tied, "hscl-beta")[0].name == "hscl-beta-b1"  # a tie goes to the first beta
    assert release_variant(records, "scl") == (next(v for v in GRAPH_VARIANTS if v.method == "scl"), "")
    with pytest.raises(ValueError, match="no seed has protocol-\\(a\\) records of every hucl variant"):
        release_variant(records, "hucl")


def test_a_registered_record_is_sorted_in_and_builds_the_entry(tmp_path, release) -> None:
    released = tmp_path / "released.json"
    released.write_text(json.dumps({"zz-last.tag": {"x": 1}}))
    register_release(NAME, release.entry, released)
    records = json.loads(released.read_text())
    assert list(records) == [NAME, "zz-last.tag"] and records[NAME] == release.entry
    entry = registry.release_entry(NAME, records[NAME])
    assert (entry.dataset, entry.tag, entry.paper_top1, entry.published) == ("mutag", "test-3ep", 87.2, True)


def test_an_unpublished_graph_entry_says_how_to_train_it() -> None:
    entry = registry.graph_paper_entry("ucl", "imdb-multi")  # as the grid declares it, before any release
    card = render_graph_card(entry)
    assert "Not published yet" in card and "model-index" not in card
    assert "`hscl-zoo train --dataset tu:IMDB-MULTI --method ucl --seed 0 --output_dir DIR`" in card
    assert "| the paper's Table 2 (IMDB-M, UCL) | 49.6 |" in card
