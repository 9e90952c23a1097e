"""``hscl-zoo train``, ``eval`` and ``embed`` on graphs, through ``hscl_zoo.cli.main``: what a run
writes, that eval and embed of its hub/ agree with it, bad input as one line with nothing
written, and a command line that imports no graph code until a graph command runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from tu_folders import write_tu

from hscl_zoo.cli import main
from hscl_zoo.graphs.saving import load_graph_encoder

ROOT = Path(__file__).resolve().parents[1]


def train_args(folder: Path, output_dir: Path, *extra: str) -> list[str]:
    return ["train", "--dataset", f"tu:{folder}", "--method", "hscl-beta", "--beta", "2", "--epochs", "2",
            "--folds", "3", "--no_progress", "--output_dir", str(output_dir), *extra]


TOY_LABELS = ["2" if g in (0, 10) else "1" if g == 5 else str(1 + g % 2) for g in range(24)]


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """A finished run on a toy TU folder: 24 triangles, the class given by the node labels except
    for three graphs, so that no SVM is right on every fold and the folds' records differ by seed."""
    work = tmp_path_factory.mktemp("toy")
    folder = write_tu(work / "TOY", labels=TOY_LABELS)
    assert main(train_args(folder, work / "run")) == 0
    return folder, work / "run"


def test_a_run_writes_metrics_hub_and_eval_json(toy_run):
    folder, run = toy_run
    assert sorted(p.name for p in run.iterdir()) == ["eval.json", "hub", "metrics.jsonl"]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics] == [1, 2] and all(np.isfinite(m["loss"]) for m in metrics)
    result = json.loads((run / "eval.json").read_text())
    assert (result["dataset"], result["method"], result["hyperparameters"]) == (f"tu:{folder}", "hscl-beta",
                                                                                 {"beta": 2.0})
    assert result["budget"] == {"epochs": 2, "lr": 0.01, "batch_size": 128, "hidden": 32, "layers": 3}
    assert result["final_loss"] == metrics[-1]["loss"] and result["protocol"] == "a"
    accuracies = [f["test_accuracy"] for f in result["svm"]["folds"]]
    assert len(accuracies) == 3 and len(set(accuracies)) > 1
    assert result["svm"]["accuracy_mean"] == pytest.approx(np.mean(accuracies))
    assert result["svm"]["accuracy_std"] == pytest.approx(np.std(accuracies))
    assert result["linear_head"]["folds"] == 3 and result["graphs"] == 24
    encoder = load_graph_encoder(run / "hub")
    assert encoder.class_names == ("1", "2") and encoder.metadata["beta"] == 2.0
    assert encoder.metadata["epochs"] == 2


def test_eval_of_the_hub_repeats_the_runs_svm_and_embed_writes_its_embeddings(toy_run, tmp_path, capsys):
    folder, run = toy_run
    out = tmp_path / "eval.json"
    assert main(["eval", str(run / "hub"), "--dataset", f"tu:{folder}", "--folds", "3", "--out", str(out)]) == 0
    evaluation = json.loads(out.read_text())
    trained = json.loads((run / "eval.json").read_text())
    assert evaluation["svm"] == trained["svm"], "the hub embeds as the trained encoder did, with the seed's folds"
    assert evaluation["linear_cv"]["cv_accuracy"] == trained["linear_head"]["cv_accuracy"]
    assert evaluation["head_accuracy"] == trained["linear_head"]["train_accuracy"]
    assert "SVM accuracy" in capsys.readouterr().out
    assert main(["eval", str(run / "hub"), "--dataset", f"tu:{folder}", "--folds", "3", "--seed", "1",
                 "--out", str(out)]) == 0
    assert json.loads(out.read_text())["svm"]["folds"] != trained["svm"]["folds"], "another seed, other folds"

    table = pq.read_table(tmp_path / "toy.parquet") if main(
        ["embed", f"local-dir:{run / 'hub'}", f"tu:{folder}", "--out", str(tmp_path / "toy.parquet")]) == 0 else None
    assert table.column_names == ["index", "label", "embedding"]
    assert table.column("index").to_pylist() == list(range(24))
    assert table.column("label").to_pylist() == [int(v) - 1 for v in TOY_LABELS]
    embeddings = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    expected = load_graph_encoder(run / "hub").embed(folder).numpy()
    np.testing.assert_array_equal(embeddings, expected)


def _one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hscl-zoo {command}: error: "), err
    return err[0]


BAD_TRAIN = {
    "missing file": (lambda f: (write_tu(f) / "TOY_A.txt").unlink(), (), "expected TOY_A.txt"),
    "labels that do not parse": (lambda f: write_tu(f, labels=["1", "2"] * 11 + ["1", "x"]), (),
                                 "'x' is not an integer"),
    "a graph with no nodes": (lambda f: write_tu(f, graphs=24, indicator=[1 + n // 3 + (n >= 3) for n in range(72)],
                                                 labels=["1", "2"] * 12 + ["1"]), (), "graph 2 has no nodes"),
    "a class with fewer graphs than folds": (lambda f: write_tu(f, labels=["1"] * 22 + ["2"] * 2), (),
                                             "class 1 has 2 graphs, fewer than the 3 folds"),
    "an option the method does not take": (write_tu, ("--tau_plus", "0.1"), "hscl-beta on graphs does not take"),
    "an unknown dataset": (write_tu, ("--dataset", "tu:NOT-A-DATASET"), "no such folder and no such table entry"),
}


@pytest.mark.parametrize("case", sorted(BAD_TRAIN))
def test_bad_training_input_is_one_line_and_writes_nothing(tmp_path, capsys, case):
    make, extra, message = BAD_TRAIN[case]
    make(tmp_path / "TOY")
    assert main(train_args(tmp_path / "TOY", tmp_path / "run", *extra)) == 1
    assert message in _one_error_line(capsys, "train")
    assert not (tmp_path / "run").exists()


def test_a_non_empty_output_dir_is_refused_before_anything_is_written(tmp_path, capsys):
    folder = write_tu(tmp_path / "TOY")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    assert main(train_args(folder, tmp_path / "run")) == 1
    assert "output_dir" in _one_error_line(capsys, "train") and "notes.txt" in capsys.readouterr().err + "notes.txt"
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("case", ["missing file", "labels that do not parse", "a graph with no nodes",
                                  "a class with fewer graphs than folds"])
def test_eval_and_embed_of_a_bad_folder_are_one_line_and_write_nothing(toy_run, tmp_path, capsys, case):
    make, _, message = BAD_TRAIN[case]
    make(tmp_path / "TOY")
    hub = str(toy_run[1] / "hub")
    assert main(["eval", hub, "--dataset", f"tu:{tmp_path / 'TOY'}", "--folds", "3",
                 "--out", str(tmp_path / "out" / "e.json")]) == 1
    assert message in _one_error_line(capsys, "eval")
    if case != "a class with fewer graphs than folds":
        assert main(["embed", hub, f"tu:{tmp_path / 'TOY'}", "--out", str(tmp_path / "out" / "x.parquet")]) == 1
        assert message in _one_error_line(capsys, "embed")
    assert not (tmp_path / "out").exists()


def test_graph_and_image_arguments_do_not_mix(toy_run, tmp_path, capsys):
    folder, run = toy_run
    hub = str(run / "hub")
    assert main(["eval", hub, "--dataset", "digits"]) == 1
    assert "a graph encoder reads graphs, not 'digits'" in _one_error_line(capsys, "eval")
    assert main(["eval", hub, "--dataset", f"tu:{folder}", "--subset", "10"]) == 1
    assert "--subset apply to image encoders" in _one_error_line(capsys, "eval")
    image_folder = tmp_path / "image-model"
    image_folder.mkdir()
    (image_folder / "config.json").write_text(json.dumps({"model_type": "contrastive-encoder"}))
    assert main(["embed", str(image_folder), f"tu:{folder}", "--out", str(tmp_path / "x.parquet")]) == 1
    assert "is not a graph encoder folder" in _one_error_line(capsys, "embed")
    assert main(["eval", hub, "--out", str(tmp_path / "e.json")]) == 1
    assert "was not trained on a table dataset" in _one_error_line(capsys, "eval")
    assert not any(tmp_path.glob("*.json")) and not (tmp_path / "x.parquet").exists()


def test_the_command_line_imports_no_graph_code_until_a_graph_command_runs():
    """Only the graph dataset table (a dict of names and Table 2's numbers, read by the zoo's
    registry) loads with the command line; no graph code and no torch until a graph command runs."""
    code = ("import sys\nfrom hscl_zoo.cli import main\n"
            "before = sorted(m for m in sys.modules if m.startswith(('hscl_zoo.graphs', 'torch'))\n"
            "                and m not in ('hscl_zoo.graphs', 'hscl_zoo.graphs.catalog'))\n"
            "try:\n    main(['train', '--dataset', 'tu:MUTAG', '--help'])\nexcept SystemExit:\n    pass\n"
            "after = sorted(m.split('.')[0] for m in sys.modules if m.startswith(('torch', 'sklearn')))\n"
            "print(before, after)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert "--beta" in done.stdout and "--output_dir" in done.stdout
    assert done.stdout.rstrip().endswith("[] []"), done.stdout[-300:]


@pytest.mark.slow
def test_train_eval_embed_on_mutag(shared_data, tmp_path):
    """The commands of docs/graphs.md on MUTAG, ten folds, three epochs (about a minute on one CPU)."""
    root = shared_data / "tudataset"
    run = tmp_path / "run"
    assert main(["train", "--dataset", "tu:MUTAG", "--method", "hscl-beta", "--beta", "2", "--epochs", "3",
                 "--data_dir", str(root), "--output_dir", str(run)]) == 0
    result = json.loads((run / "eval.json").read_text())
    assert result["graphs"] == 188 and result["classes"] == ["-1", "1"] and len(result["svm"]["folds"]) == 10
    assert result["svm"]["accuracy_mean"] > 125 / 188, "better than the majority class"
    assert main(["eval", str(run / "hub"), "--data_dir", str(root), "--out", str(tmp_path / "e.json")]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["svm"] == result["svm"]
    assert main(["embed", str(run / "hub"), "tu:MUTAG", "--data_dir", str(root),
                 "--out", str(tmp_path / "m.parquet")]) == 0
    assert pq.read_table(tmp_path / "m.parquet").num_rows == 188


def test_missing_table_graphs_give_one_error_with_both_ways_to_get_them(tmp_path, capsys):
    """The API and the CLI say the same thing when MUTAG is not on disk and cannot be fetched: what is
    missing, where it was looked for, and the two ways to get it. A file where the root folder
    should be makes the download fail whatever the network."""
    from hscl_zoo.graphs.catalog import GraphDataUnavailableError, load_graph_dataset

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    for root, download in ((blocker, True), (tmp_path / "empty", False)):
        with pytest.raises(GraphDataUnavailableError) as err:
            load_graph_dataset("tu:MUTAG", root, download=download)
        message = str(err.value)
        assert message.startswith(f"MUTAG is not in {root / 'MUTAG' / 'raw'} (") and "\n" not in message
        assert "pip install 'hscl-zoo[graphs]'" in message and "tu:/path/to/MUTAG" in message
    assert main(["eval", "hscl-beta-mutag", "--data_dir", str(blocker)]) == 1
    loaded, error = capsys.readouterr().err.splitlines()  # the model it loaded, then one line of error
    assert loaded.startswith("hscl_zoo: loaded hscl-beta-mutag")
    assert error.startswith(f"hscl-zoo eval: error: MUTAG is not in {blocker / 'MUTAG' / 'raw'} (the download failed")
    assert "pip install 'hscl-zoo[graphs]'" in error
