"""The protocols of hscl_zoo.evaluation as a contract: ``evaluate_encoder`` against knn_top1,
linear_probe, retrieval_metrics and audit called on the same features; ``evaluate_model`` taking
the run's settings (own dataset only) or the caller's; ``evaluate_transfer`` rows and protocol."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import traceback
from pathlib import Path

import datasets
import huggingface_hub.constants
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

import hscl_zoo
from hscl_zoo.audit import audit
from hscl_zoo.data import load_splits
from hscl_zoo.data.labelling import partly_labelled
from hscl_zoo.data.transforms import eval_transform
from hscl_zoo.evaluation import (evaluate_encoder, evaluate_model, evaluate_transfer, extract_features, knn_top1,
                                 linear_probe, preprocessing)
from hscl_zoo.protocol import METRICS
from hscl_zoo.retrieval import retrieval_metrics

RECIPE = {"subset": 60, "full_test": True, "labelled_fraction": 0.5, "probe_epochs": 1, "knn_k": 3, "seed": 7,
          "data_dir": "/nonexistent/hscl-digits-parquet"}
TRAINING = {"dataset": "digits", "method": "scl", "hyperparameters": {"temperature": 0.5}, "epochs": 1,
            "global_batch_size": 8, "expected_negatives_per_anchor": 14, "recipe_config": RECIPE}
NOTE = ("note: reading digits from the Hub (the folder the model was trained from is not on this machine); "
        "--data_dir reads a local copy.\n")
TINY = "hf:someone/tiny-shapes"


class RecordingTransform:
    """The encoder's own eval transform; records whether each image was decoded in this process."""

    def __init__(self, cfg) -> None:
        self.inner = eval_transform(cfg)
        self.in_this_process: list[bool] = []

    def __call__(self, image):
        self.in_this_process.append(torch.utils.data.get_worker_info() is None)
        return self.inner(image)


class FixedEncoder(nn.Module):
    """A frozen encoder without parameters: fixed random maps held as buffers, its own transform,
    an untrained classifier that always says class 9; records the batch sizes ``encode`` sees."""

    def __init__(self, spec) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.register_buffer("maps", torch.randn(3 * 16 * 16, 32, generator=generator) / 16)
        self.register_buffer("head_maps", torch.randn(32, 8, generator=generator))
        self.pretrained_cfg = {"mean": spec.mean, "std": spec.std, "input_size": (3, 16, 16)}
        self.transform = RecordingTransform(self.pretrained_cfg)
        self.classifier = nn.Module()
        self.classifier.register_buffer("weight", torch.zeros(10, 32))
        self.classifier.register_buffer("bias", F.one_hot(torch.tensor(9), 10).float())
        self.batches: list[int] = []

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        self.batches.append(len(x))
        return x.flatten(1) @ self.maps

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x.flatten(1) @ self.maps @ self.head_maps, dim=1)


_WORKERS = multiprocessing.Array("i", 2, lock=False)
"""Processes forked so far by the evaluation's feature pass and by the audit."""


def _count_worker() -> None:
    """By the modules on the forking stack (not function names, which mutation testing rewrites)."""
    files = {Path(frame.filename).name for frame in traceback.extract_stack()}
    if "audit.py" in files:
        _WORKERS[1] += 1
    elif "evaluation.py" in files:
        _WORKERS[0] += 1


os.register_at_fork(after_in_child=_count_worker)


def _features(encoder, data, batch_size=256):
    """Both splits' features in the batches evaluate_encoder used (a matmul's round-off depends on
    the batch's row count on some CPUs, so other batches give other last bits)."""
    transform = eval_transform(encoder.pretrained_cfg)
    train = extract_features(encoder.encode, data.train, transform, batch_size=batch_size, progress=False)
    test = extract_features(encoder.encode, data.test, transform, batch_size=batch_size, progress=False)
    return train + test


def _bars(err: str, desc: str) -> int:
    return err.count(f"{desc}:   0%|")


def test_defaults_of_evaluate_encoder_are_the_documented_protocol(digits, capsys):
    """Defaults: linear and kNN, 100 probe epochs, seed 0, k 200, temperature 0.1, batches of 256
    images decoded in this process with the encoder's own transform, progress bars shown."""
    data = dataclasses.replace(digits, train=digits.train.select(range(300)), test=digits.test.select(range(60)))
    encoder = FixedEncoder(data.spec)
    result = evaluate_encoder(encoder, data)
    err = capsys.readouterr().err
    assert (_bars(err, "features"), _bars(err, "linear probe")) == (2, 1)
    assert encoder.batches == [256, 44, 60]
    assert encoder.transform.in_this_process == [True] * 360
    assert result["metrics"] == ["linear", "knn"]
    assert (result["protocol"]["epochs"], result["protocol"]["seed"]) == (100, 0)
    assert result["protocol"]["knn"] == {"k": 200, "temperature": 0.1, "weighting": "exp(cosine / temperature)"}
    assert (result["knn_k"], result["knn_temperature"]) == (200, 0.1)
    train_f, train_y, test_f, test_y = _features(encoder, data)
    probe = linear_probe(train_f, train_y, test_f, test_y, num_classes=10, progress=False)
    assert (result["top1"], result["top5"], result["train_top1"]) == (probe.top1, probe.top5, probe.train_top1)
    assert result["knn_top1"] == knn_top1(train_f, train_y, test_f, test_y)


@pytest.fixture(scope="module")
def half_labelled(digits):
    return partly_labelled(load_splits("digits", subset=100, seed=0), 0.5, seed=0)


def test_every_metric_is_its_function_on_the_same_labelled_features(half_labelled, capsys):
    """All four metrics with chosen settings: each value is the metric's own function on the
    labelled training and the test features, and the result says what it used."""
    encoder = FixedEncoder(half_labelled.spec)
    result = evaluate_encoder(encoder, half_labelled, metrics=METRICS, epochs=2, knn_k=20, knn_temperature=0.5,
                              seed=3, device="cpu", batch_size=16, num_workers=0, progress=True)
    err = capsys.readouterr().err
    assert [_bars(err, desc) for desc in ("features", "linear probe", "audit")] == [2, 1, 1]
    labelled = half_labelled.labelled()
    sizes = (len(labelled.train), len(labelled.test))
    assert encoder.batches == [16] * (sizes[0] // 16) + [sizes[0] % 16] + [16] * (sizes[1] // 16) + [sizes[1] % 16]
    assert set(result) == {"dataset", "test_split", "train_images", "unlabelled_train_images", "metrics", "protocol",
                           "top1", "top5", "train_top1", "head", "knn_top1", "knn_k", "knn_temperature",
                           "retrieval", "audit", "features_from", "seconds"}
    assert (result["dataset"], result["test_split"], result["metrics"]) == ("digits", "test", list(METRICS))
    assert result["features_from"] == {"train": "decoded images", "test": "decoded images"}
    assert set(result["seconds"]) == {"features", *METRICS} and all(s >= 0 for s in result["seconds"].values())
    assert (result["train_images"], result["unlabelled_train_images"]) == (50, 50)

    train_f, train_y, test_f, test_y = _features(encoder, labelled, batch_size=16)
    assert len(train_f) == 50 and int(train_y.min()) >= 0
    probe = linear_probe(train_f, train_y, test_f, test_y, num_classes=10, epochs=2, seed=3, progress=False)
    assert (result["top1"], result["top5"], result["train_top1"]) == (probe.top1, probe.top5, probe.train_top1)
    assert all(torch.equal(result["head"][key], probe.head[key]) for key in ("weight", "bias"))
    assert result["knn_top1"] == knn_top1(train_f, train_y, test_f, test_y, k=20, temperature=0.5)
    assert (result["knn_k"], result["knn_temperature"]) == (20, 0.5)
    assert result["retrieval"] == retrieval_metrics(test_f, test_y, train_f, train_y)
    assert result["audit"] == audit(encoder, labelled, head=probe.head, features=(test_f, test_y), batch_size=16,
                                    seed=3, device="cpu", progress=False)
    assert result["protocol"] == {
        **probe.protocol,
        "knn": {"k": 20, "temperature": 0.5, "weighting": "exp(cosine / temperature)"},
        "retrieval": {"queries": "test", "gallery": "train", "similarity": "cosine",
                      "ties": "earlier gallery row first"},
    }
    assert result["audit"]["protocol"]["seed"] == 3
    assert result["audit"]["protocol"]["assumption_batches"] == "shuffled test batches of 16 images x 2 views"


def test_without_progress_nothing_is_drawn(half_labelled, capsys):
    encoder = FixedEncoder(half_labelled.spec)
    result = evaluate_encoder(encoder, half_labelled, metrics=METRICS, epochs=1, knn_k=5, device="cpu",
                              progress=False)
    assert capsys.readouterr().err == ""
    assert "audit" in result and result["knn_k"] == 5


def test_an_encoder_without_parameters_is_audited_on_the_cpu_by_default(half_labelled):
    encoder = FixedEncoder(half_labelled.spec)
    by_default = evaluate_encoder(encoder, half_labelled, metrics=("linear", "audit"), epochs=1, progress=False)
    on_cpu = evaluate_encoder(encoder, half_labelled, metrics=("linear", "audit"), epochs=1, device="cpu", progress=False)
    assert by_default["audit"] == on_cpu["audit"]


def test_num_workers_decode_every_pass_in_worker_processes(half_labelled):
    """The feature passes and the audit's augmented views are decoded in worker processes."""
    encoder = FixedEncoder(half_labelled.spec)
    before = list(_WORKERS)
    evaluate_encoder(encoder, half_labelled, metrics=("linear", "audit"), epochs=1, device="cpu", num_workers=1,
                     progress=False)
    assert _WORKERS[0] >= before[0] + 2 and _WORKERS[1] >= before[1] + 1
    assert encoder.transform.in_this_process == []


class CacheTransform(RecordingTransform):
    """The encoder's own transform as a zoo encoder's is: a uint8 batch (an image cache) is scaled
    to [0, 1] and nothing else, a PIL image gets the eval transform (and is recorded)."""

    def __call__(self, image):
        return image.float() / 255 if isinstance(image, torch.Tensor) else super().__call__(image)


def test_splits_given_as_image_caches_are_encoded_from_them_not_decoded(half_labelled):
    """A training run hands its decoded rows over: each split given is encoded from its uint8
    tensor (so every metric reads those features), the result says so, and no image is decoded."""
    encoder = FixedEncoder(half_labelled.spec)
    encoder.transform = CacheTransform(encoder.pretrained_cfg)
    labelled = half_labelled.labelled()
    generator = torch.Generator().manual_seed(5)
    caches = {split: torch.randint(0, 256, (len(rows), 3, 16, 16), dtype=torch.uint8, generator=generator)
              for split, rows in (("train", labelled.train), ("test", labelled.test))}
    result = evaluate_encoder(encoder, half_labelled, metrics=("knn", "retrieval"), knn_k=5, images=caches,
                              progress=False)
    assert encoder.transform.in_this_process == []
    assert result["features_from"] == {"train": "image cache", "test": "image cache"}
    train_f, test_f = ((caches[split].float() / 255).flatten(1) @ encoder.maps for split in ("train", "test"))
    train_y, test_y = (torch.tensor(rows["label"]) for rows in (labelled.train, labelled.test))
    assert result["knn_top1"] == knn_top1(train_f, train_y, test_f, test_y, k=5)
    assert result["retrieval"] == retrieval_metrics(test_f, test_y, train_f, train_y)

    one = evaluate_encoder(encoder, half_labelled, metrics=("knn",), knn_k=5, images={"test": caches["test"]},
                           progress=False)
    assert one["features_from"] == {"train": "decoded images", "test": "image cache"}
    decoded_train, _ = extract_features(encoder.encode, labelled.train, encoder.transform, progress=False)
    assert one["knn_top1"] == knn_top1(decoded_train, train_y, test_f, test_y, k=5)


def test_an_image_cache_for_an_unknown_split_is_refused_with_the_names_to_use(half_labelled):
    with pytest.raises(ValueError) as err:
        evaluate_encoder(FixedEncoder(half_labelled.spec), half_labelled, images={"val": torch.zeros(1, 3, 16, 16)})
    assert str(err.value) == "images has splits ['val']; name them 'train' and 'test'."


# ---- evaluate_model and evaluate_transfer on a saved zoo model ----


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = hscl_zoo.create_model("resnet10t", num_classes=10, image_size=16, mean=[0.3] * 3, std=[0.3] * 3)
    return model.eval().save_pretrained(tmp_path_factory.mktemp("models") / "digits-run", training=TRAINING)


@pytest.fixture(scope="module")
def tiny_parquet(tmp_path_factory) -> Path:
    """A local parquet copy of a 3-class Hub dataset of 20 x 20 images, training split only."""
    rng = np.random.default_rng(0)
    images, labels = [], []
    for label, level in enumerate((40, 120, 200)):
        for _ in range(12):
            images.append(Image.fromarray(np.clip(rng.normal(level, 30, (20, 20, 3)), 0, 255).astype(np.uint8)))
            labels.append(label)
    features = datasets.Features({"img": datasets.Image(),
                                  "label": datasets.ClassLabel(names=["dark", "grey", "light"])})
    folder = tmp_path_factory.mktemp("tiny-shapes")
    datasets.Dataset.from_dict({"img": images, "label": labels}, features=features).to_parquet(
        str(folder / "train-00000-of-00001.parquet"))
    return folder


@pytest.fixture
def offline(monkeypatch):
    """No Hub access: a dataset read without its local copy fails at once."""
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_the_runs_own_dataset_is_evaluated_with_the_runs_settings(model_dir, capsys):
    """No dataset, device or settings given: the run's dataset, subset, full test split, labelled
    fraction, probe epochs, k and seed; its data_dir, absent here, falls back with a note."""
    metrics = ("linear", "knn", "retrieval")
    result = evaluate_model(model_dir, metrics=metrics, progress=False)
    out, err = capsys.readouterr()
    assert [line for line in err.splitlines() if "data_dir" in line] == [NOTE.rstrip("\n")] and "note" not in out
    assert RECIPE["data_dir"] not in err, "the training machine's folder means nothing to a user"
    assert (_bars(err, "features"), _bars(err, "linear probe")) == (0, 0)
    assert {key: result[key] for key in ("model", "dataset", "data_dir", "subset", "full_test", "labelled_fraction",
                                         "trained_on", "transfer", "native_size")} == {
        "model": str(model_dir), "dataset": "digits", "data_dir": None, "subset": 60, "full_test": True,
        "labelled_fraction": 0.5, "trained_on": "digits", "transfer": False, "native_size": 16}
    assert result["preprocessing"] == preprocessing(hscl_zoo.load(model_dir).pretrained_cfg)
    assert (result["train_images"], result["unlabelled_train_images"]) == (30, 30)
    assert (result["protocol"]["epochs"], result["protocol"]["seed"], result["protocol"]["knn"]["k"]) == (1, 7, 3)
    assert result["protocol"]["num_test"] == 360 and "head" not in result

    data = partly_labelled(load_splits("digits", subset=60, seed=7, full_test=True), 0.5, seed=7)
    alone = evaluate_encoder(hscl_zoo.load(model_dir), data, metrics=metrics, epochs=1, knn_k=3, seed=7,
                             device="cpu", progress=False)
    for key in ("top1", "top5", "train_top1", "knn_top1", "retrieval"):
        assert result[key] == alone[key], key


def test_settings_given_override_the_runs(model_dir):
    result = evaluate_model(str(model_dir), "digits", subset=40, full_test=False, labelled_fraction=1.0,
                            probe_epochs=2, knn_k=4, seed=1, metrics=("linear", "knn"), device="cpu", progress=False)
    assert (result["subset"], result["full_test"], result["labelled_fraction"]) == (40, False, 1.0)
    assert (result["train_images"], result["unlabelled_train_images"]) == (40, 0)
    assert result["protocol"]["num_test"] == 10  # 40 / 1437 of the 360 test images
    assert (result["protocol"]["epochs"], result["protocol"]["seed"], result["protocol"]["knn"]["k"]) == (2, 1, 4)


def test_another_dataset_takes_the_runs_probe_settings_but_not_its_data_settings(model_dir, tiny_parquet, offline,
                                                                                capsys):
    """A transfer target read from its local copy with the caller's source options, progress shown
    by default; the run's subset, full_test, labelled fraction and data_dir stay with digits."""
    result = evaluate_model(model_dir, TINY, data_dir=str(tiny_parquet), test_fraction=0.25, probe_epochs=1,
                            metrics=("linear", "knn"), device="cpu")
    err = capsys.readouterr().err
    assert "note:" not in err and (_bars(err, "features"), _bars(err, "linear probe")) == (2, 1)
    assert {key: result[key] for key in ("model", "dataset", "data_dir", "subset", "full_test", "labelled_fraction",
                                         "trained_on", "transfer", "native_size")} == {
        "model": str(model_dir), "dataset": TINY, "data_dir": str(tiny_parquet), "subset": None, "full_test": False,
        "labelled_fraction": 1.0, "trained_on": "digits", "transfer": True, "native_size": None}
    assert result["test_split"] == "held-out 0.25 of each class of train (seed 7)"
    assert (result["train_images"], result["unlabelled_train_images"], result["protocol"]["num_test"]) == (27, 0, 9)
    assert (result["protocol"]["seed"], result["protocol"]["knn"]["k"]) == (7, 3)


def test_a_misspelt_option_is_refused_before_the_model_loads(capsys):
    with pytest.raises(TypeError) as err:
        evaluate_model("hscl-beta-mutag", "digits", epoch=3)
    assert str(err.value) == "evaluate_model() got an unexpected keyword argument 'epoch'"
    assert capsys.readouterr().err == ""


def test_a_graph_encoder_is_sent_to_the_graph_evaluation():
    with pytest.raises(ValueError) as err:
        evaluate_model("hscl-beta-mutag", "digits", progress=False)
    assert str(err.value) == ("hscl-beta-mutag loads as a GraphEncoder, not an image encoder, and evaluate_model "
                              "scores image encoders; score a graph encoder with `hscl-zoo eval hscl-beta-mutag` "
                              "(in Python: hscl_zoo.graphs.recipe.evaluate_graph_encoder).")


def test_a_model_without_a_training_dataset_needs_one(model_dir, tmp_path):
    model = hscl_zoo.create_model("resnet10t", num_classes=10, image_size=16, mean=[0.3] * 3, std=[0.3] * 3)
    bare = model.save_pretrained(tmp_path / "bare")
    with pytest.raises(ValueError) as err:
        evaluate_model(bare, device="cpu", progress=False)
    assert str(err.value) == "the model's config names no training dataset: pass --dataset."


def test_a_single_transfer_target_is_one_row_under_the_shared_protocol(model_dir, tiny_parquet, offline):
    report = evaluate_transfer(model_dir, [TINY], data_dirs=[str(tiny_parquet)], probe_epochs=1,
                               metrics=("linear", "knn"), device="cpu", progress=False)
    (row,) = report["rows"]
    assert (row["dataset"], row["data_dir"], row["test_split"]) == (
        TINY, str(tiny_parquet), "held-out 0.2 of each class of train (seed 7)")
    assert (report["model"], report["trained_on"]) == (str(model_dir), "digits")
    assert report["protocol"] == {
        "transfer": "frozen features of every target through the model's eval preprocessing, "
                    "a linear probe trained per target",
        "preprocessing": row["preprocessing"], "metrics": ["linear", "knn"], **row["protocol"]}


@pytest.mark.parametrize("targets, data_dirs", [([], None), (["digits", "cifar10"], ["a"])])
def test_targets_and_data_dirs_that_do_not_pair_are_refused_with_the_fix(model_dir, targets, data_dirs):
    with pytest.raises(ValueError) as err:
        evaluate_transfer(model_dir, targets, data_dirs=data_dirs)
    given = len(data_dirs) if data_dirs is not None else 0
    assert str(err.value) == (f"got {len(targets)} datasets and {given} data_dirs; give one data_dir per dataset "
                              "(empty for the default), in the same order.")
