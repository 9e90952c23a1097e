"""hscl_zoo.data: the dataset table, digits, local parquet folders, subsets, bad input."""

from __future__ import annotations

import io
from pathlib import Path

import datasets
import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

import hscl_zoo.data
from hscl_zoo.data import DATASETS, balanced_subset, label_array, load_split, load_splits

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def write_split(folder: Path, split: str, columns: dict, features: datasets.Features | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict(columns, features=features).to_parquet(str(folder / f"{split}-00000-of-00001.parquet"))


def digit_images(data, n: int) -> list[Image.Image]:
    return [data.train[i]["image"] for i in range(n)]


def test_registry_names_and_sources():
    assert set(DATASETS) == {"digits", "cifar10", "cifar100", "cifar100-coarse", "stl10", "tinyimagenet"}
    assert DATASETS["cifar10"].hub_id == "uoft-cs/cifar10"
    assert (DATASETS["cifar100"].image_column, DATASETS["cifar100"].label_column) == ("img", "fine_label")
    assert DATASETS["tinyimagenet"].test_split == "valid"
    assert DATASETS["stl10"].hub_id == "tanganke/stl10"
    for name, spec in DATASETS.items():
        assert spec.name == name
        assert len(spec.mean) == len(spec.std) == 3
        with pytest.raises(AttributeError):
            spec.num_classes = 1


def test_digits_fixed_stratified_split(digits):
    assert (len(digits.train), len(digits.test)) == (1437, 360)
    assert digits.train.column_names == ["image", "label"]
    assert isinstance(digits.train.features["image"], datasets.Image)
    assert digits.class_names == [str(d) for d in range(10)]
    image = digits.train[0]["image"]
    assert image.mode == "RGB" and image.size == (16, 16) == (digits.spec.image_size,) * 2
    train_counts = np.bincount(label_array(digits.train), minlength=10)
    test_counts = np.bincount(label_array(digits.test), minlength=10)
    assert train_counts.sum() + test_counts.sum() == 1797
    assert test_counts.min() >= 35 and test_counts.max() <= 37


def test_digits_rebuild_is_identical(digits):
    _, test = hscl_zoo.data.digits._digits_splits.__wrapped__(digits.spec.fallback_class_names)
    assert label_array(test).tolist() == label_array(digits.test).tolist()
    assert np.array_equal(np.asarray(test[5]["image"]), np.asarray(digits.test[5]["image"]))


def test_digits_normalisation_constants_match_the_data(digits):
    pixels = np.stack([np.asarray(row["image"], dtype=np.float64) / 255 for row in digits.train])
    np.testing.assert_allclose(pixels.mean(axis=(0, 1, 2)), digits.spec.mean, atol=1e-3)
    np.testing.assert_allclose(pixels.std(axis=(0, 1, 2)), digits.spec.std, atol=1e-3)


def test_subset_is_class_balanced_and_seeded(digits):
    small = load_splits("digits", subset=100, seed=3)
    assert np.bincount(label_array(small.train)).tolist() == [10] * 10
    assert len(small.test) == round(100 * 360 / 1437)
    assert set(np.bincount(label_array(small.test)).tolist()) <= {2, 3}
    again = load_splits("digits", subset=100, seed=3)
    other = load_splits("digits", subset=100, seed=4)
    pixels = [np.asarray(d.train[0]["image"]) for d in (small, again, other)]
    assert np.array_equal(pixels[0], pixels[1])
    assert label_array(small.train).tolist() == label_array(again.train).tolist()
    assert small.train[:]["label"] == again.train[:]["label"]
    assert any(not np.array_equal(np.asarray(small.train[i]["image"]), np.asarray(other.train[i]["image"]))
               for i in range(10))


def test_balanced_subset_spreads_shortfall_of_small_classes(digits):
    uneven = digits.train.select(np.flatnonzero(label_array(digits.train) != 0).tolist()
                                 + np.flatnonzero(label_array(digits.train) == 0)[:3].tolist())
    subset = balanced_subset(uneven, 93, seed=0)
    counts = np.bincount(label_array(subset), minlength=10)
    assert counts.sum() == 93 and counts[0] == 3 and set(counts[1:].tolist()) == {10}


@pytest.mark.parametrize("subset", [0, -5, 1438, 2.5])
def test_bad_subset_is_rejected(subset):
    with pytest.raises(ValueError, match="subset"):
        load_splits("digits", subset=subset)


def test_unknown_dataset_lists_known_ones():
    with pytest.raises(ValueError) as err:
        load_splits("imagenet")
    message = str(err.value)
    assert "imagenet" in message
    for name in DATASETS:
        assert name in message


def test_digits_refuses_a_data_dir(tmp_path):
    with pytest.raises(ValueError, match="without data_dir"):
        load_splits("digits", data_dir=tmp_path)


def test_cifar10_from_local_parquet(shared_data):
    data = load_splits("cifar10", data_dir=shared_data / "cifar10")
    assert (len(data.train), len(data.test)) == (50_000, 10_000)
    assert data.class_names == CIFAR10_NAMES
    assert data.train.column_names == ["image", "label"]
    row = data.test[1234]
    assert row["image"].mode == "RGB" and row["image"].size == (32, 32)
    assert 0 <= row["label"] < 10
    assert np.bincount(label_array(data.test)).tolist() == [1000] * 10


def test_cifar10_subset_from_local_parquet(shared_data):
    data = load_splits("cifar10", data_dir=str(shared_data / "cifar10"), subset=500, seed=1)
    assert np.bincount(label_array(data.train)).tolist() == [50] * 10
    assert np.bincount(label_array(data.test)).tolist() == [10] * 10


def test_cifar100_from_local_parquet(shared_data):
    """The real files: 100 fine classes, 500 / 100 images each, names in the official (alphabetical)
    order, the fine label kept and the coarse one dropped."""
    folder = shared_data / "cifar100"
    data = load_splits("cifar100", data_dir=folder)
    assert (len(data.train), len(data.test)) == (50_000, 10_000)
    assert data.train.column_names == data.test.column_names == ["image", "label"]
    assert len(data.class_names) == 100
    assert data.class_names[:3] == ["apple", "aquarium_fish", "baby"] and data.class_names[-1] == "worm"
    assert data.class_names == sorted(data.class_names)
    assert np.bincount(label_array(data.train), minlength=100).tolist() == [500] * 100
    assert np.bincount(label_array(data.test), minlength=100).tolist() == [100] * 100
    raw = pq.read_table(folder / "test-00000-of-00001.parquet", columns=["img", "fine_label"]).slice(4321, 1)
    cell, fine = raw.column("img")[0].as_py(), raw.column("fine_label")[0].as_py()
    assert data.test[4321]["label"] == fine
    assert cell["path"].split("/")[1] == data.class_names[fine]
    image = data.test[4321]["image"]
    assert image.mode == "RGB" and image.size == (32, 32)
    assert np.array_equal(np.asarray(image), np.asarray(Image.open(io.BytesIO(cell["bytes"])).convert("RGB")))


def test_cifar100_budget_subset_is_class_balanced(shared_data):
    data = load_splits("cifar100", data_dir=shared_data / "cifar100", subset=10_000, seed=0, full_test=True)
    assert np.bincount(label_array(data.train), minlength=100).tolist() == [100] * 100
    assert len(data.test) == 10_000


def test_cifar100_coarse_labels_are_the_superclasses(shared_data):
    """The same files read through the coarse column: 20 superclasses of 5 fine classes each, so
    2,500 training images per superclass, and every fine class inside exactly one superclass."""
    folder = shared_data / "cifar100"
    coarse = load_splits("cifar100-coarse", data_dir=folder)
    fine = load_splits("cifar100", data_dir=folder)
    assert coarse.class_names[:2] == ["aquatic_mammals", "fish"] and len(coarse.class_names) == 20
    assert np.bincount(label_array(coarse.train), minlength=20).tolist() == [2500] * 20
    pairs = set(zip(label_array(fine.train).tolist(), label_array(coarse.train).tolist()))
    assert len(pairs) == 100 and len({f for f, _ in pairs}) == 100
    assert fine.class_names.index("whale") in {f for f, c in pairs if coarse.class_names[c] == "aquatic_mammals"}


def test_cifar100_one_split(shared_data):
    test = load_split("cifar100", "test", shared_data / "cifar100")
    assert len(test) == 10_000 and len(test.features["label"].names) == 100


def test_tinyimagenet_valid_grayscale_comes_out_rgb(shared_data):
    parquet = shared_data / "tinyimagenet" / "valid-00000-of-00001.parquet"
    raw = pq.read_table(parquet, columns=["image"]).column("image").slice(0, 400).to_pylist()
    gray_rows = [i for i, cell in enumerate(raw) if Image.open(io.BytesIO(cell["bytes"])).mode == "L"]
    assert gray_rows, "expected grayscale JPEGs among the first 400 valid images"
    valid = load_split("tinyimagenet", "valid", shared_data / "tinyimagenet")
    assert len(valid) == 10_000
    assert valid.features["label"].names[0] == "n01443537"
    assert len(valid.features["label"].names) == 200
    row = gray_rows[0]
    image = valid[row]["image"]
    assert image.mode == "RGB" and image.size == (64, 64)
    gray = np.asarray(Image.open(io.BytesIO(raw[row]["bytes"])))
    rgb = np.asarray(image)
    for channel in range(3):
        assert np.array_equal(rgb[..., channel], gray)


def test_hub_layout_columns_are_mapped_to_internal_form(tmp_path, digits):
    images = digit_images(digits, 12)
    for split in ("train", "test"):
        write_split(tmp_path / "plain_text", split, {
            "img": images, "fine_label": list(range(12)), "coarse_label": [0] * 12,
        }, datasets.Features({"img": datasets.Image(), "fine_label": datasets.Value("int64"),
                              "coarse_label": datasets.Value("int64")}))
    data = load_splits("cifar100", data_dir=tmp_path)
    assert data.train.column_names == ["image", "label"]
    assert data.train["label"][:] == list(range(12))
    assert data.class_names == [str(i) for i in range(100)]
    assert np.array_equal(np.asarray(data.test[3]["image"]), np.asarray(images[3]))


def test_missing_split_says_what_was_found(tmp_path, digits):
    write_split(tmp_path, "train", {"img": digit_images(digits, 4), "label": [0, 1, 2, 3]})
    write_split(tmp_path, "validation", {"img": digit_images(digits, 4), "label": [0, 1, 2, 3]})
    with pytest.raises(ValueError) as err:
        load_splits("cifar10", data_dir=tmp_path)
    message = str(err.value)
    assert "['train', 'validation']" in message and "['train', 'test']" in message
    assert "missing ['test']" in message


def test_missing_columns_say_what_was_found(tmp_path, digits):
    for split in ("train", "test"):
        write_split(tmp_path, split, {"pixels": digit_images(digits, 4), "target": [0, 1, 2, 3]})
    with pytest.raises(ValueError) as err:
        load_splits("cifar10", data_dir=tmp_path)
    message = str(err.value)
    assert "['img', 'label']" in message and "['pixels', 'target']" in message


def test_data_dir_that_is_not_a_folder(tmp_path):
    with pytest.raises(ValueError, match="is not a folder"):
        load_splits("cifar10", data_dir=tmp_path / "nowhere")


def test_wrong_class_count_is_rejected(tmp_path, digits):
    for split in ("train", "test"):
        write_split(tmp_path, split, {"image": digit_images(digits, 4), "label": [0, 1, 2, 3]},
                    datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list("abcd"))}))
    with pytest.raises(ValueError, match="4 classes, expected 10"):
        load_splits("stl10", data_dir=tmp_path)


def test_labels_out_of_range_are_rejected(tmp_path, digits):
    for split in ("train", "test"):
        write_split(tmp_path, split, {"img": digit_images(digits, 3), "label": [0, 1, 10]})
    with pytest.raises(ValueError, match=r"\[0, 10\].*\[0, 9\]"):
        load_splits("cifar10", data_dir=tmp_path)


def test_unknown_split_is_rejected(shared_data):
    with pytest.raises(ValueError, match="'train', 'valid'"):
        load_split("tinyimagenet", "test", shared_data / "tinyimagenet")


def test_hub_unreachable_points_to_data_dir(monkeypatch, tmp_path):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path)
    with pytest.raises(ValueError, match="offline mode is on .* pass '--data_dir data/stl10'"):
        load_splits("stl10")


def test_full_test_keeps_the_whole_test_split_with_a_training_subset():
    whole = load_splits("digits")
    small = load_splits("digits", subset=200, seed=3)
    full = load_splits("digits", subset=200, seed=3, full_test=True)
    assert len(full.train) == len(small.train) == 200
    assert full.train["label"] == small.train["label"]
    assert len(full.test) == len(whole.test) > len(small.test)
