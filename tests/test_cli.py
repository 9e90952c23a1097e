"""The hscl-zoo command line on real files: a model saved in a temporary folder, PNGs written by the
test, the embedded digits dataset, and every bad input's one-line error.

The console script is declared in pyproject.toml; the shared test environment is not reinstalled
for each branch, so commands run through ``python -m hscl_zoo.cli`` (a fresh interpreter) and
``hscl_zoo.cli.main`` (in-process), which is exactly what the installed script calls.
"""

from __future__ import annotations

import csv
import importlib
import io
import json
import os
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

import hscl_zoo
from hscl_zoo.cli import main
from hscl_zoo.evaluation import evaluate_model
from hscl_zoo.publishing.hub_folder import write_hub_folder
from helpers import smoke_release

REPO = Path(__file__).resolve().parents[1]
COMMANDS = ("list", "info", "eval", "embed", "export", "push", "cards")
TRAINING = {"dataset": "digits", "method": "scl", "hyperparameters": {"temperature": 0.5}, "epochs": 1,
            "global_batch_size": 8, "expected_negatives_per_anchor": 14}


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "hscl_zoo.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A digits-sized encoder (16 px, CIFAR stem, 10 classes) saved as hscl_zoo.load reads it."""
    torch.manual_seed(0)
    model = hscl_zoo.create_model("resnet10t", num_classes=10, image_size=16, mean=[0.3] * 3, std=[0.4] * 3)
    return model.eval().save_pretrained(tmp_path_factory.mktemp("models") / "digits-encoder", training=TRAINING)


@pytest.fixture(scope="module")
def pngs(tmp_path_factory) -> Path:
    """Five PNGs of different sizes and modes, two of them in a subfolder, and a text file to skip."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for name, size, mode in (("a.png", (20, 16), "RGB"), ("b.PNG", (16, 16), "L"), ("c.png", (40, 24), "RGBA"),
                             ("sub/d.png", (16, 30), "RGB"), ("sub/e.png", (17, 17), "P")):
        path = root / name
        path.parent.mkdir(exist_ok=True)
        channels = {"RGB": 3, "RGBA": 4}.get(mode, 1)
        pixels = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8).squeeze()
        Image.fromarray(pixels, "L" if mode == "P" else mode).convert(mode).save(path)
    (root / "notes.txt").write_text("not an image")
    return root


# ---- the script itself -----------------------------------------------------------------------


def test_pyproject_declares_the_console_script():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attr = scripts["hscl-zoo"].partition(":")
    assert getattr(importlib.import_module(module), attr) is main


def test_every_subcommand_has_help(capsys):
    for command in COMMANDS:
        with pytest.raises(SystemExit) as done:
            main([command, "--help"])
        assert done.value.code == 0
        assert f"usage: hscl-zoo {command}" in capsys.readouterr().out


def test_module_entry_point_runs_in_a_fresh_interpreter():
    done = _cli("list", "hscl-beta-[cst]*")  # the image datasets: cifar*, stl10, tinyimagenet
    assert done.returncode == 0, done.stderr
    names = [line.split()[0] for line in done.stdout.splitlines()[1:]]
    assert names == ["hscl-beta-cifar10", "hscl-beta-cifar100", "hscl-beta-cifar100.gpu-30ep", "hscl-beta-stl10", "hscl-beta-tinyimagenet"]


def test_list_and_info(capsys):
    assert main(["list"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1 + len(hscl_zoo.list_models())
    assert main(["info", "scl-stl10"]) == 0
    assert capsys.readouterr().out.strip() == str(hscl_zoo.info("scl-stl10"))
    assert main(["list", "nothing-*"]) == 1
    assert "no zoo name matches 'nothing-*'" in capsys.readouterr().err
    assert main(["info", "hscl-beta-cifar11"]) == 1
    assert "Closest names: hscl-beta-cifar10" in capsys.readouterr().err


# ---- embed -----------------------------------------------------------------------------------


def test_embed_a_folder_to_npy_matches_the_model(model_dir, pngs, tmp_path, capsys):
    out = tmp_path / "emb" / "features.npy"
    assert main(["embed", str(model_dir), str(pngs), "--out", str(out), "--batch_size", "2", "--device", "cpu"]) == 0
    assert "embedded 5 images to 512-d features" in capsys.readouterr().out
    features = np.load(out)
    with (tmp_path / "emb" / "features.ids.csv").open() as handle:
        ids = [row["file"] for row in csv.DictReader(handle)]
    assert ids == ["a.png", "b.PNG", "c.png", "sub/d.png", "sub/e.png"]
    assert features.shape == (5, 512) and features.dtype == np.float32

    model = hscl_zoo.load(model_dir)
    with Image.open(pngs / "sub" / "d.png") as image:
        expected = model.encode(model.transform(image.convert("RGB")).unsqueeze(0))[0].detach().numpy()
    np.testing.assert_allclose(features[3], expected, atol=1e-5)


def test_embed_projection_to_parquet(model_dir, pngs, tmp_path):
    out = tmp_path / "proj.parquet"
    assert main(["embed", f"local-dir:{model_dir}", str(pngs), "--out", str(out), "--projection"]) == 0
    table = pq.read_table(out)
    assert table.column_names == ["file", "embedding"]
    embeddings = np.asarray(table.column("embedding").to_pylist(), dtype=np.float32)
    assert embeddings.shape == (5, 128)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)


def test_embed_a_dataset_split_keeps_rows_and_labels(model_dir, tmp_path, digits):
    out = tmp_path / "digits.parquet"
    assert main(["embed", str(model_dir), "digits", "--split", "test", "--out", str(out)]) == 0
    table = pq.read_table(out).to_pydict()
    assert table["row"] == list(range(len(digits.test)))
    assert table["label"] == list(digits.test["label"])
    assert len(table["embedding"][0]) == 512


@pytest.mark.parametrize("images, out, message", [
    ("EMPTY", "x.npy", "holds no image files"),
    ("no-such-folder", "x.npy", "neither a folder nor a dataset name"),
    ("IMAGES", "x.csv", "must end in one of .npy, .parquet"),
])
def test_embed_bad_inputs(model_dir, pngs, tmp_path, capsys, images, out, message):
    (tmp_path / "EMPTY" / "sub").mkdir(parents=True)
    images = {"EMPTY": str(tmp_path / "EMPTY"), "IMAGES": str(pngs)}.get(images, images)
    assert main(["embed", str(model_dir), images, "--out", str(tmp_path / out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hscl-zoo embed: error: ") and message in err
    assert not (tmp_path / out).exists()


def test_embed_names_an_unreadable_image(model_dir, tmp_path, capsys):
    Image.new("RGB", (16, 16)).save(tmp_path / "good.png")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG but not really")
    assert main(["embed", str(model_dir), str(tmp_path), "--out", str(tmp_path / "x.npy")]) == 1
    err = capsys.readouterr().err
    assert "cannot read an image" in err and "broken.png" in err


def test_missing_model_is_a_clear_error(tmp_path, capsys):
    assert main(["embed", str(tmp_path), str(tmp_path), "--out", str(tmp_path / "x.npy")]) == 1
    assert "lacks config.json and model.safetensors" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "nowhere"), "--format", "onnx", "--out", str(tmp_path / "o")]) == 1
    assert "neither a zoo name nor an existing directory" in capsys.readouterr().err
    assert main(["eval", "scl-cifar10", "--dataset", "digits"]) == 1
    assert "no published weights yet" in capsys.readouterr().err


# ---- eval ------------------------------------------------------------------------------------


def test_eval_on_digits_writes_json(model_dir, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["eval", str(model_dir), "--dataset", "digits", "--subset", "100", "--probe_epochs", "2",
                 "--knn_k", "5", "--out", str(out)]) == 0
    assert "digits: linear-probe top-1" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert (result["dataset"], result["subset"], result["model"]) == ("digits", 100, str(model_dir))
    assert result["protocol"]["num_train"] == 100 and result["protocol"]["epochs"] == 2
    assert result["knn_k"] == 5
    direct = evaluate_model(str(model_dir), "digits", subset=100, probe_epochs=2, knn_k=5, progress=False)
    assert {k: result[k] for k in ("top1", "top5", "knn_top1")} == {k: direct[k] for k in ("top1", "top5", "knn_top1")}


@pytest.mark.parametrize("given, full_test", [([], None), (["--full_test"], True), (["--full_test", "true"], True),
                                               (["--full_test", "false"], False), (["--no-full_test"], False)])
def test_eval_reads_full_test_as_train_does(given, full_test):
    """Bare or with true/false, as on hscl-zoo train; absent, the run's own setting (None)."""
    from hscl_zoo.cli import build_parser

    assert build_parser().parse_args(["eval", "MODEL", *given]).full_test is full_test


def test_eval_refuses_a_full_test_that_is_not_true_or_false(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "MODEL", "--full_test", "maybe"])
    assert "argument --full_test: 'maybe' is not true or false" in capsys.readouterr().err


def test_eval_unknown_dataset(model_dir, capsys):
    assert main(["eval", str(model_dir), "--dataset", "mnist"]) == 1
    assert "unknown dataset 'mnist'; known datasets:" in capsys.readouterr().err


# ---- export ----------------------------------------------------------------------------------


def test_export_torchscript_through_the_module_entry_point(model_dir, tmp_path):
    done = _cli("export", str(model_dir), "--format", "torchscript", "--output", "logits", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logits.pt", "preprocess.json"]
    model = hscl_zoo.load(model_dir)
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated upstream
        got = torch.jit.load(str(tmp_path / "logits.pt"))(images)
        torch.testing.assert_close(got, model(images), atol=1e-5, rtol=0)


def test_export_timm_of_a_cifar_stem_model_prints_the_lines_that_open_it(model_dir, tmp_path, capsys):
    assert main(["export", str(model_dir), "--format", "timm", "--out", str(tmp_path / "t")]) == 0
    code = capsys.readouterr().out.split("open it in Python with:\n", 1)[1]
    assert code.startswith("import timm, hscl_zoo.timm_models  # registers resnet10t_cifar in timm\n")
    check = code + "\nprint(model.num_classes, type(model.maxpool).__name__, tuple(model.conv1[0].stride))"
    done = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["10", "Identity", "(1,", "1)"]


def test_export_bad_arguments(model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["export", str(model_dir), "--format", "tflite", "--out", str(tmp_path)])
    assert done.value.code == 2
    assert "invalid choice: 'tflite'" in capsys.readouterr().err
    assert main(["export", str(model_dir), "--format", "timm", "--output", "projection", "--out", str(tmp_path)]) == 1
    assert "--output applies to onnx and torchscript" in capsys.readouterr().err


# ---- push and cards --------------------------------------------------------------------------


def test_push_dry_run_rebuilds_and_checks_the_folder(model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    write_hub_folder(hscl_zoo.load(model_dir), run / "hub", training=TRAINING,
                     evaluation={"top1": 51.25, "top5": 90.0, "knn_top1": 48.5})
    (run / "hub" / "README.md").unlink()
    assert main(["push", str(run), "--repo-id", "someone/scl-digits", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "README.md, config.json, metrics.json, model.safetensors" in out and "nothing uploaded" in out
    assert "someone/scl-digits" in (run / "hub" / "README.md").read_text()


def test_push_bad_inputs(model_dir, tmp_path, capsys):
    assert main(["push", str(tmp_path), "--repo-id", "someone/x", "--dry-run"]) == 1
    assert "has no finished model" in capsys.readouterr().err
    assert main(["push", str(model_dir), "--repo-id", "no id", "--dry-run"]) == 1
    assert "does not name a Hub repo" in capsys.readouterr().err
    assert main(["push", str(model_dir), "--repo-id", "someone/x", "--dry-run"]) == 1
    assert "metrics.json is missing" in capsys.readouterr().err


def test_cards_write_then_check(tmp_path, capsys):
    assert main(["cards", "--check", "--out", str(REPO / "model_cards")]) == 0
    assert main(["cards", "--out", str(tmp_path)]) == 0
    assert main(["cards", "--check", "--out", str(tmp_path)]) == 0
    card = sorted(tmp_path.glob("*.md"))[0]
    card.write_text(card.read_text() + "edited\n")
    assert main(["cards", "--check", "--out", str(tmp_path)]) == 1
    assert f"out of date: {card}" in capsys.readouterr().err



RELEASED = json.loads((Path(hscl_zoo.__file__).parent / "zoo" / "released.json").read_text())


def test_list_gives_each_names_own_score_before_the_papers_in_every_format(capsys):
    """`hscl-zoo list` shows what loading a name gives: the score measured on those weights (read
    here from released.json itself), then the paper's; a bare name served by a tag carries the
    tag's score, one with only a CPU smoke test carries none."""
    with smoke_release("hscl-beta-cifar10.cpu-9", 26.0):
        assert main(["list", "--format", "csv"]) == 0
        rows = {row["name"]: row for row in csv.DictReader(io.StringIO(capsys.readouterr().out))}
        assert list(rows) == hscl_zoo.list_models()
    assert rows["hscl-beta-cifar10.cpu-9"]["status"] == "smoke test" and float(rows["hscl-beta-cifar10.cpu-9"]["score"]) == 26.0
    assert float(rows["hscl-beta-cifar100"]["score"]) == RELEASED["hscl-beta-cifar100.gpu-30ep"]["metrics"]["top1"]
    assert rows["hscl-beta-cifar100"]["loads"] == "hscl-beta-cifar100.gpu-30ep"
    assert float(rows["hscl-beta-cifar100"]["paper"]) == 75.11  # Table 1, H-SCL(beta) on CIFAR-100
    assert float(rows["scl-mutag"]["score"]) == RELEASED["scl-mutag"]["metrics"]["svm_accuracy"]
    assert float(rows["scl-mutag"]["linear_cv_accuracy"]) == RELEASED["scl-mutag"]["metrics"]["linear_cv_accuracy"]
    assert rows["hscl-beta-cifar10"]["score"] == "" and rows["hscl-beta-cifar10"]["status"] == "not published"
    for name, release in RELEASED.items():
        metric = "svm_accuracy" if "svm_accuracy" in release["metrics"] else "top1"
        assert float(rows[name]["score"]) == release["metrics"][metric], name

    assert main(["list", "*-mutag", "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in listed] == hscl_zoo.list_models("*-mutag")
    assert all(row["score"] == float(rows[row["name"]]["score"]) for row in listed)

    assert main(["list", "hscl-beta-cifar100"]) == 0
    header, line = capsys.readouterr().out.splitlines()
    assert header.split()[:5] == ["name", "dataset", "method", "score", "%"]
    assert line.split()[3:5] == ["56.97", "75.11"] and "loads hscl-beta-cifar100.gpu-30ep" in line


def test_info_shows_the_loaded_weights_and_their_scores_before_the_paper(capsys):
    assert main(["info", "hscl-beta-cifar100"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["loads:", "hscl-beta-cifar100.gpu-30ep", "(its", "best", "published", "tag)"]
    assert lines[2].startswith("  scores:      top1=56.97") and lines[4].startswith("  paper top-1: 75.11")
    assert "  backbone:    resnet18" in lines  # the weights' backbone, not the paper's ResNet-50
    with smoke_release("hscl-beta-cifar10.cpu-9", 26.0):
        assert main(["info", "hscl-beta-cifar10"]) == 0
    text = capsys.readouterr().out
    assert "scores:" not in text and "tags:        hscl-beta-cifar10.cpu-9" in text
