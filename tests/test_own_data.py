"""Your own data (issue 15 §1): image folders, parquet folders and Hub-style tables as datasets, trained
through `hscl-zoo train` and `accelerate launch`, then embedded and evaluated; every bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from hscl_zoo.cli import main
from hscl_zoo.data import DATASETS, UNLABELLED, load_splits, register_dataset, source_spec
from hscl_zoo.data.sources import cache_dir

ROOT = Path(__file__).resolve().parents[1]
ACCELERATE = Path(sys.executable).with_name("accelerate")
CLASSES = ("cat", "dog", "fish")
FORMATS = (("RGB", ".png"), ("L", ".jpg"), ("RGBA", ".png"), ("P", ".png"), ("CMYK", ".jpg"), ("LA", ".png"))
TINY_RUN = ["--backbone", "resnet18", "--stem", "small", "--image_size", "16", "--epochs", "1", "--batch_size", "8",
            "--probe_epochs", "2", "--knn_k", "3", "--diagnostics", "false"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}


def write_images(folder: Path, count: int, seed: int) -> list[Path]:
    """``count`` random images of mixed sizes, modes and formats (PNG and JPEG)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        mode, ext = FORMATS[i % len(FORMATS)]
        width, height = 18 + 5 * i, 22 + 3 * (i % 3)
        rgb = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")
        image = rgb.convert(mode) if mode != "P" else rgb.quantize(16)
        path = folder / f"img{i}{ext}"
        image.save(path)
        paths.append(path)
    return paths


@pytest.fixture(autouse=True)
def stats_cache(tmp_path, monkeypatch) -> Path:
    """Measured statistics go to a fresh cache per test (never the user's)."""
    monkeypatch.setenv("HSCL_ZOO_CACHE", str(tmp_path / ".cache"))
    return tmp_path / ".cache"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pets")
    for index, name in enumerate(CLASSES):
        write_images(root / name, 6, seed=index)
    return root


def rgb_pixels(paths: list[str]) -> np.ndarray:
    return np.concatenate([np.asarray(Image.open(p).convert("RGB"), dtype=np.float64).reshape(-1, 3) / 255
                           for p in paths])


def test_image_folder_classes_rgb_split_and_measured_statistics(folder, capsys):
    data = load_splits(f"imagefolder:{folder}", seed=3)
    assert data.class_names == list(CLASSES) and data.unlabelled == 0
    assert (len(data.train), len(data.test)) == (15, 3)
    assert sorted(data.test["label"]) == [0, 1, 2]
    train_files = [row["path"] for row in data.train.cast_column("image", datasets.Image(decode=False))["image"]]
    test_files = [row["path"] for row in data.test.cast_column("image", datasets.Image(decode=False))["image"]]
    assert not set(train_files) & set(test_files)
    assert all(Path(f).parent.name == CLASSES[y] for f, y in zip(train_files, data.train["label"]))
    assert {data.train[i]["image"].mode for i in range(len(data.train))} == {"RGB"}
    pixels = rgb_pixels(train_files)
    np.testing.assert_allclose(data.spec.mean, pixels.mean(axis=0), atol=1e-4)
    np.testing.assert_allclose(data.spec.std, pixels.std(axis=0), atol=1e-4)
    sides = [min(Image.open(f).size) for f in train_files]
    assert data.spec.image_size == int(np.median(sides))
    assert f"image size {data.spec.image_size} px" in capsys.readouterr().out
    again = load_splits(f"imagefolder:{folder}", seed=3)
    assert again.test["label"] == data.test["label"] and again.spec.mean == data.spec.mean
    other = load_splits(f"imagefolder:{folder}", seed=4, test_fraction=0.5)
    assert len(other.test) == 9


def test_statistics_are_cached_per_fingerprint(tmp_path, stats_cache):
    root = tmp_path / "data"
    for index, name in enumerate(CLASSES[:2]):
        write_images(root / name, 3, seed=index)
    first = load_splits(f"imagefolder:{root}")
    load_splits(f"imagefolder:{root}")
    assert len(list(cache_dir().glob("*.json"))) == 1 and cache_dir().parent == stats_cache
    Image.new("RGB", (30, 30), (255, 255, 255)).save(root / "cat" / "img0.png")
    changed = load_splits(f"imagefolder:{root}")
    assert len(list(cache_dir().glob("*.json"))) == 2 and changed.spec.mean != first.spec.mean


def test_train_and_test_folders_are_the_splits(tmp_path):
    for index, name in enumerate(CLASSES):
        write_images(tmp_path / "train" / name, 3, seed=index)
    for index, name in enumerate(CLASSES[1:]):
        write_images(tmp_path / "val" / name, 2, seed=10 + index)
    data = load_splits(f"imagefolder:{tmp_path}")
    assert (len(data.train), len(data.test), data.spec.test_split) == (9, 4, "val")
    assert sorted(set(data.test["label"])) == [1, 2]
    write_images(tmp_path / "val" / "bird", 1, seed=20)
    with pytest.raises(ValueError, match=r"class folders that .* lacks: \['bird'\]"):
        load_splits(f"imagefolder:{tmp_path}")


def test_unlabelled_folder_beside_classes_is_training_only(tmp_path):
    for index, name in enumerate(CLASSES):
        write_images(tmp_path / name, 4, seed=index)
    write_images(tmp_path / "unlabelled", 5, seed=9)
    data = load_splits(f"imagefolder:{tmp_path}")
    assert data.class_names == list(CLASSES) and data.unlabelled == 5
    assert list(data.train["label"]).count(UNLABELLED) == 5 and UNLABELLED not in data.test["label"]
    assert len(data.labelled().train) == len(data.train) - 5


def test_register_an_image_folder_by_name(folder):
    register_dataset(source_spec(f"imagefolder:{folder}", name="my-pets"))
    try:
        data = load_splits("my-pets", subset=6)
        assert data.spec.name == "my-pets" and data.class_names == list(CLASSES)
        assert sorted(data.train["label"]) == [0, 0, 1, 1, 2, 2]
    finally:
        DATASETS.remove("my-pets")


def write_parquet(folder: Path, split: str, images: list[Path], labels: list, label_feature) -> None:
    features = datasets.Features({"photo": datasets.Image(), "species": label_feature})
    table = datasets.Dataset.from_dict({"photo": [str(p) for p in images], "species": labels}, features=features)
    folder.mkdir(parents=True, exist_ok=True)
    table.to_parquet(str(folder / f"{split}-00000-of-00001.parquet"))


@pytest.fixture
def parquet_folder(tmp_path) -> Path:
    images = write_images(tmp_path / "raw", 12, seed=5)
    names = ["owl", "bat", "emu"]
    out = tmp_path / "tables"
    write_parquet(out, "train", images[:9], [names[i % 3] for i in range(9)], datasets.Value("string"))
    write_parquet(out, "test", images[9:], names, datasets.Value("string"))
    return out


def test_parquet_folder_with_custom_columns(parquet_folder, capsys):
    data = load_splits(f"parquet:{parquet_folder}", image_column="photo", label_column="species")
    assert data.class_names == ["bat", "emu", "owl"]
    assert (len(data.train), len(data.test)) == (9, 3) and data.test["label"] == [2, 0, 1]
    assert data.train[0]["image"].mode == "RGB"
    guessed = load_splits(f"parquet:{parquet_folder}")
    out = capsys.readouterr().out
    assert "image_column='photo'" in out and "label_column=None" in out
    assert guessed.class_names == [] and guessed.unlabelled == 9
    hub_copy = load_splits("hf:someone/birds", data_dir=parquet_folder, label_column="species", test_split="test")
    assert hub_copy.class_names == data.class_names and hub_copy.test["label"] == data.test["label"]


def test_parquet_table_whose_columns_are_already_image_and_label(tmp_path):
    """Many Hub datasets name their columns `image` and `label`, the names the library gives them."""
    images = write_images(tmp_path / "raw", 6, seed=2)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    table = datasets.Dataset.from_dict({"image": [str(p) for p in images], "label": [0, 1, 1, 0, 1, 0]}, features=features)
    (tmp_path / "t").mkdir()
    table.to_parquet(str(tmp_path / "t" / "train-00000-of-00001.parquet"))
    data = load_splits(f"parquet:{tmp_path / 't'}", test_fraction=0.5)
    assert data.class_names == ["a", "b"] and len(data.train) + len(data.test) == 6
    assert sorted(list(data.train["label"]) + list(data.test["label"])) == [0, 0, 0, 1, 1, 1]
    images_only = datasets.Dataset.from_dict({"image": [str(p) for p in images]}, features=datasets.Features({"image": datasets.Image()}))
    (tmp_path / "u").mkdir()
    images_only.to_parquet(str(tmp_path / "u" / "train-00000-of-00001.parquet"))
    unlabelled = load_splits(f"parquet:{tmp_path / 'u'}")
    assert unlabelled.unlabelled == len(unlabelled.train) == 6


def test_parquet_integer_labels_and_their_range(tmp_path):
    images = write_images(tmp_path / "raw", 6, seed=1)
    write_parquet(tmp_path / "ok", "train", images, [0, 1, 2, 0, 1, 2], datasets.Value("int64"))
    data = load_splits(f"parquet:{tmp_path / 'ok'}", label_column="species", test_fraction=0.5)
    assert data.class_names == ["0", "1", "2"] and len(data.test) == 3
    write_parquet(tmp_path / "gap", "train", images, [0, 1, 5, 0, 1, 5], datasets.Value("int64"))
    with pytest.raises(ValueError, match=r"no rows for class\(es\) \[2, 3, 4\]"):
        load_splits(f"parquet:{tmp_path / 'gap'}", label_column="species")
    write_parquet(tmp_path / "neg", "train", images, [0, 1, -3, 0, 1, 1], datasets.Value("int64"))
    with pytest.raises(ValueError, match="out of range, e.g. -3"):
        load_splits(f"parquet:{tmp_path / 'neg'}", label_column="species")
    write_parquet(tmp_path / "cl", "train", images, [0, 1, 1, 0, 1, 0], datasets.ClassLabel(names=["a", "b"]))
    path = next((tmp_path / "cl").glob("*.parquet"))
    table = pq.read_table(path)
    table = table.set_column(1, "species", [[0, 1, 7, 0, 1, 0]])
    pq.write_table(table.replace_schema_metadata(pq.read_schema(path).metadata), path)
    with pytest.raises(ValueError, match=r"out of range, e\.g\. 7; labels must lie in 0\.\.1"):
        load_splits(f"parquet:{path.parent}")


@pytest.mark.parametrize("make, message", [
    (lambda root: None, "holds no images"),
    (lambda root: (write_images(root / "cat", 2, 0), (root / "dog").mkdir()), r"class folder .*dog holds no images"),
    (lambda root: (write_images(root / "cat", 2, 0), write_images(root, 1, 1)), "both image files"),
])
def test_bad_folders(tmp_path, make, message):
    root = tmp_path / "data"
    root.mkdir()
    make(root)
    with pytest.raises(ValueError, match=message):
        load_splits(f"imagefolder:{root}")


def test_an_unreadable_image_is_named_or_skipped_with_a_count(tmp_path, capsys):
    for index, name in enumerate(CLASSES):
        write_images(tmp_path / name, 3, seed=index)
    (tmp_path / "dog" / "broken.jpg").write_bytes(b"not a jpeg at all")
    with pytest.raises(ValueError, match=r"1 image\(s\) cannot be decoded: .*dog/broken\.jpg.*skip_unreadable"):
        load_splits(f"imagefolder:{tmp_path}")
    data = load_splits(f"imagefolder:{tmp_path}", skip_unreadable=True)
    assert "skipped 1 unreadable image(s)" in capsys.readouterr().out
    assert len(data.train) + len(data.test) == 9


@pytest.mark.parametrize("name, options, message", [
    ("imagefolder:/no/such/folder", {}, "no such folder"),
    ("imagefolder:", {}, "names no folder"),
    ("cifar10", {"test_fraction": 0.5}, "apply to own data"),
    ("imagefolder:.", {"label_column": "x"}, "apply to parquet: and hf: sources"),
    ("imagefolder:.", {"test_fraction": 1.5}, "strictly between 0 and 1"),
    ("imagefolder:.", {"colour": "x"}, "unknown option"),
])
def test_bad_sources_and_options(name, options, message):
    with pytest.raises(ValueError, match=message):
        load_splits(name, **options)


def test_train_help_names_the_subcommand(capsys):
    with pytest.raises(SystemExit) as done:
        main(["train", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hscl-zoo train") and "test_fraction" in out


def test_train_then_embed_and_eval_an_image_folder(folder, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--dataset", f"imagefolder:{folder}", "--method", "hscl-beta", *TINY_RUN,
                 "--output_dir", str(run)]) == 0
    saved = json.loads((run / "config.json").read_text())
    measured = load_splits(f"imagefolder:{folder}").spec
    assert saved["mean"] == list(measured.mean) and saved["std"] == list(measured.std)
    hub = json.loads((run / "hub" / "config.json").read_text())
    assert hub["pretrained_cfg"]["mean"] == list(measured.mean) and hub["label_names"] == list(CLASSES)
    assert json.loads((run / "linear_eval.json").read_text())["test_split"].startswith("held-out 0.2")

    out = tmp_path / "test.npy"
    assert main(["embed", str(run / "hub"), f"imagefolder:{folder}", "--split", "test", "--out", str(out),
                 "--device", "cpu"]) == 0
    assert np.load(out).shape == (3, 512)
    assert out.with_suffix(".ids.csv").read_text().splitlines()[1:] == ["0,0", "1,1", "2,2"]
    result = tmp_path / "eval.json"
    assert main(["eval", str(run / "hub"), "--device", "cpu", "--out", str(result)]) == 0
    scores = json.loads(result.read_text())
    own = json.loads((run / "linear_eval.json").read_text())
    assert scores["dataset"] == f"imagefolder:{folder}"
    assert (scores["top1"], scores["knn_top1"]) == (own["top1"], own["knn_top1"]), "eval of the model folder repeats the run's own"


def test_unlabelled_folder_trains_ucl_and_refuses_scl(tmp_path, capsys):
    images = tmp_path / "photos"
    write_images(images, 8, seed=7)
    with pytest.raises(SystemExit, match=r"has no labels .*method 'scl' needs them"):
        main(["train", "--dataset", f"imagefolder:{images}", "--method", "scl", *TINY_RUN,
              "--output_dir", str(tmp_path / "scl")])
    assert not (tmp_path / "scl").exists()
    run = tmp_path / "ucl"
    assert main(["train", "--dataset", f"imagefolder:{images}", "--method", "ucl", *TINY_RUN,
                 "--output_dir", str(run)]) == 0
    assert "is unlabelled: no linear probe" in capsys.readouterr().out
    history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(history) == 1 and np.isfinite(history[0]["train_loss"]) and "knn_top1" not in history[0]
    assert (run / "hub" / "model.safetensors").is_file() and not (run / "linear_eval.json").exists()


@pytest.mark.slow
def test_train_in_a_fresh_interpreter_and_under_accelerate_launch(folder, tmp_path):
    common = ["--dataset", f"imagefolder:{folder}", *TINY_RUN]
    fresh = subprocess.run([sys.executable, "-m", "hscl_zoo.cli", "train", *common, "--output_dir",
                            str(tmp_path / "cli")], capture_output=True, text=True, timeout=600, env=ENV, cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    launched = subprocess.run(
        [str(ACCELERATE), "launch", "--cpu", "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no",
         "--dynamo_backend", "no", str(ROOT / "recipes" / "pretrain.py"), *common, "--output_dir",
         str(tmp_path / "recipe")],
        capture_output=True, text=True, timeout=600, env={**ENV, "ACCELERATE_USE_CPU": "1"}, cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr[-3000:]
    module = subprocess.run(
        [str(ACCELERATE), "launch", "--cpu", "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no",
         "--dynamo_backend", "no", "-m", "hscl_zoo.cli", "train", *common, "--output_dir", str(tmp_path / "module")],
        capture_output=True, text=True, timeout=600, env={**ENV, "ACCELERATE_USE_CPU": "1"}, cwd=tmp_path)
    assert module.returncode == 0, module.stderr[-3000:]
    evaluations = [json.loads((tmp_path / run / "linear_eval.json").read_text()) for run in ("cli", "recipe", "module")]
    for evaluation in evaluations:
        assert set(evaluation.pop("seconds")) == {"features", "linear", "knn", "retrieval", "audit"}, "wall times differ"
    assert evaluations[0] == evaluations[1] == evaluations[2]
