"""Transfer as a protocol: ``hscl-zoo eval MODEL --dataset A,B,...`` gives one row per target,
every target read through the model's own preprocessing; image folders made here, and small
subsets of the shared CIFAR-10 and Tiny ImageNet files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import hscl_zoo
from hscl_zoo.cli import main
from hscl_zoo.evaluation import evaluate_model

TRAINING = {"dataset": "digits", "method": "scl", "hyperparameters": {"temperature": 0.5}, "epochs": 1,
            "global_batch_size": 8, "expected_negatives_per_anchor": 14}
FAST = ["--probe_epochs", "2", "--knn_k", "3", "--metrics", "linear,knn,retrieval"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = hscl_zoo.create_model("resnet10t", num_classes=10, image_size=16, mean=[0.3] * 3, std=[0.4] * 3)
    return model.eval().save_pretrained(tmp_path_factory.mktemp("models") / "digits-encoder", training=TRAINING)


def _folder(root: Path, size: tuple[int, int], classes: tuple[str, ...], per_class: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    for index, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            level = 40 + 160 * index // max(1, len(classes) - 1)
            pixels = np.clip(rng.normal(level, 25, (size[1], size[0], 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("transfer")
    return (_folder(base / "wide", (40, 30), ("dark", "light"), 10, seed=0),
            _folder(base / "large", (64, 64), ("a", "b", "c"), 8, seed=1))


def test_several_targets_give_one_row_each(model_dir, folders, tmp_path, capsys):
    wide, large = folders
    out = tmp_path / "transfer.json"
    targets = f"imagefolder:{wide},imagefolder:{large}"
    assert main(["eval", str(model_dir), "--dataset", targets, "--test_fraction", "0.25", *FAST,
                 "--out", str(out)]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if "linear-probe" in line]
    assert len(printed) == 2 and printed[0].startswith(f"imagefolder:{wide}: linear-probe top-1")
    assert printed[1].startswith(f"imagefolder:{large}: linear-probe top-1") and "Recall@1" in printed[1]
    result = json.loads(out.read_text())
    assert (result["model"], result["trained_on"]) == (str(model_dir), "digits")
    assert [row["dataset"] for row in result["rows"]] == targets.split(",")
    assert all(row["transfer"] and row["native_size"] is None for row in result["rows"])
    assert result["protocol"]["preprocessing"]["input_size"] == [3, 16, 16]
    assert result["protocol"]["preprocessing"]["resize"] == "shorter side to 16 (bicubic, antialiased), then centre crop 16x16"
    assert result["protocol"]["metrics"] == ["linear", "knn", "retrieval"]
    heads = [row["protocol"]["head"] for row in result["rows"]]
    assert heads == ["linear 512 -> 2, zero init", "linear 512 -> 3, zero init"]
    assert result["protocol"]["epochs"] == 2 and result["protocol"]["knn"]["k"] == 3
    assert "head" not in result["protocol"] and "num_test" not in result["protocol"]
    assert [row["protocol"]["num_test"] for row in result["rows"]] == [4, 6]  # a quarter of each class, rounded down
    # a row is the single-target evaluation of that dataset
    alone = evaluate_model(str(model_dir), f"imagefolder:{large}", test_fraction=0.25, probe_epochs=2, knn_k=3,
                           metrics=("linear", "knn", "retrieval"), device="cpu", progress=False)
    for key in ("top1", "top5", "knn_top1", "retrieval"):
        assert result["rows"][1][key] == alone[key], key
    # the stated preprocessing is what the model's transform does to a 40 x 30 image
    image = Image.open(next((wide / "dark").iterdir()))
    assert tuple(hscl_zoo.load(str(model_dir)).transform(image).shape) == (3, 16, 16)


def test_the_own_dataset_is_not_a_transfer(model_dir):
    result = evaluate_model(str(model_dir), subset=100, probe_epochs=1, knn_k=3, metrics=("knn",), device="cpu",
                            progress=False)
    assert (result["dataset"], result["transfer"], result["native_size"]) == ("digits", False, 16)
    assert "top1" not in result and "retrieval" not in result and result["metrics"] == ["knn"]


@pytest.mark.parametrize("extra, message", [
    (["--dataset", "digits,"], "has an empty name"),
    (["--dataset", "digits,digits"], "'digits' is listed twice"),
    (["--dataset", "digits,cifar10", "--data_dir", "a,b,c"], "got 2 datasets and 3 data_dirs"),
    (["--metrics", "linear,recall"], "unknown metrics ['recall']"),
    (["--metrics", "knn,audit"], "the audit reads the linear probe's predictions"),
])
def test_bad_targets_fail_before_writing(model_dir, tmp_path, capsys, extra, message):
    out = tmp_path / "never.json"
    assert main(["eval", str(model_dir), *extra, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.slow  # ~40 s here: reads both parquet files whole before subsetting
def test_cifar10_and_tinyimagenet_subsets(model_dir, shared_data, tmp_path):
    out = tmp_path / "shared.json"
    assert main(["eval", str(model_dir), "--dataset", "cifar10,tinyimagenet", "--data_dir",
                 f"{shared_data / 'cifar10'},{shared_data / 'tinyimagenet'}", "--subset", "200", *FAST,
                 "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["dataset"], r["native_size"], r["transfer"]) for r in rows] == [("cifar10", 32, True),
                                                                               ("tinyimagenet", 64, True)]
    assert [r["protocol"]["head"] for r in rows] == ["linear 512 -> 10, zero init", "linear 512 -> 200, zero init"]
    assert [r["train_images"] for r in rows] == [200, 200]
    assert [r["test_split"] for r in rows] == ["test", "valid"]
    assert all(0 <= r["retrieval"]["map_at_r"] <= r["retrieval"]["map"] <= 100 for r in rows)
