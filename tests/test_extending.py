"""Adding a method is one MethodSpec (+ its hardening function) and adding a dataset one DatasetSpec:
a toy of each goes through build_loss, the config, the model card and a 1-epoch pretraining run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import datasets
import pytest
import torch

import hscl_zoo
from hscl_zoo import DatasetSpec, MethodSpec, register_dataset, register_method
from hscl_zoo.losses import Hyperparameter
from hscl_zoo.losses.reference import reference_loss
from hscl_zoo.training import PretrainConfig, main
from hscl_zoo.zoo.cards import render_card

TEMPERATURE = 0.5


class HalfCosinePower:
    """eta = ((1 + s) / 2) ** beta on the cosine s = t * temperature: non-negative, non-decreasing,
    zero for an opposite negative; it has no log_weight, so the loss takes its log itself."""

    def __init__(self, beta: float, temperature: float) -> None:
        self.beta, self.temperature = beta, temperature

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return ((1 + t * self.temperature) / 2).clamp_min(0) ** self.beta


TOY_METHOD = MethodSpec(
    "toy-power", "Toy(power)", "SCL with negatives weighted by a power of their half-cosine",
    negatives="other-labels", positives="labels",
    hardening=lambda values, temperature: HalfCosinePower(values["beta"], temperature),
    hyperparameters=(Hyperparameter("beta", 2.0, low=0.0, doc="the power"),),
)
DIGITS = hscl_zoo.DATASETS["digits"]
TOY_DATASET = DatasetSpec(
    name="toy-digits", hub_id="hscl-zoo-tests/toy-digits", image_column="pixels", label_column="digit",
    train_split="train", test_split="test", num_classes=10, image_size=16, mean=DIGITS.mean, std=DIGITS.std,
    fallback_class_names=tuple(f"digit {d}" for d in range(10)), display="Toy digits",
)


@pytest.fixture
def toy_method():
    spec = register_method(TOY_METHOD)
    yield spec
    hscl_zoo.METHODS.remove(spec.name)


@pytest.fixture
def toy_dataset():
    spec = register_dataset(TOY_DATASET)
    yield spec
    hscl_zoo.DATASETS.remove(spec.name)


@pytest.fixture(scope="module")
def toy_data_dir(tmp_path_factory) -> Path:
    """The digits as parquet files with the toy spec's own column names and a plain integer label."""
    folder = tmp_path_factory.mktemp("toy-digits")
    digits = hscl_zoo.load_splits("digits")
    for split, table in (("train", digits.train), ("test", digits.test)):
        table = table.cast_column("label", datasets.Value("int64")).rename_columns({"image": "pixels", "label": "digit"})
        table.to_parquet(folder / f"{split}-00000-of-00001.parquet")
    return folder


def test_registering_twice_is_refused(toy_method, toy_dataset):
    with pytest.raises(ValueError, match="already registered"):
        register_method(TOY_METHOD)
    with pytest.raises(ValueError, match="already registered"):
        register_dataset(TOY_DATASET)
    assert register_method(TOY_METHOD, replace=True) is TOY_METHOD


def test_toy_method_through_build_loss(toy_method):
    loss_fn = hscl_zoo.build_loss("toy-power", beta=3.0)
    assert loss_fn.needs_labels and isinstance(loss_fn.hardening, HalfCosinePower)
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(12, 2, 8, dtype=torch.float64, generator=generator)
    labels = torch.randint(0, 3, (12,), generator=generator)
    expected = reference_loss(features, labels, method="toy-power", positives="labels", temperature=TEMPERATURE,
                              eta=HalfCosinePower(3.0, TEMPERATURE))
    assert loss_fn(features, labels).item() == pytest.approx(expected.item(), abs=1e-10)
    assert hscl_zoo.build_loss("toy-power", detach_weights=True).detach_weights
    with pytest.raises(ValueError, match="toy-power does not take tau_plus"):
        hscl_zoo.build_loss("toy-power", tau_plus=0.1)
    with pytest.raises(ValueError, match="toy-power: beta must be a finite number >= 0"):
        hscl_zoo.build_loss("toy-power", beta=-1.0)


def test_toy_method_through_the_config(toy_method):
    cfg = PretrainConfig(method="toy-power", beta=3.0, tau_plus=0.3)
    assert cfg.loss_kwargs() == {"temperature": 0.5, "M": None, "beta": 3.0, "unlabelled_negatives": True}
    assert cfg.method_hyperparameters() == {"temperature": 0.5, "positives": "labels", "beta": 3.0,
                                            "M": "global embeddings - 2"}
    with pytest.raises(ValueError, match="toy-power: beta must be"):
        PretrainConfig(method="toy-power", beta=-1.0)


def test_a_method_whose_hyperparameter_no_config_key_sets_is_refused_by_the_config(toy_method):
    spec = register_method(MethodSpec("toy-gamma", "Toy(gamma)", "a toy", negatives="other-images",
                                      positives="views", hardening=lambda values, t: HalfCosinePower(values["gamma"], t),
                                      hyperparameters=(Hyperparameter("gamma", 1.0),)))
    try:
        assert hscl_zoo.build_loss("toy-gamma", gamma=2.0).hardening.beta == 2.0
        with pytest.raises(ValueError, match="no config key 'gamma'"):
            PretrainConfig(method="toy-gamma")
    finally:
        hscl_zoo.METHODS.remove(spec.name)


def test_toy_dataset_loads_with_its_column_mapping(toy_dataset, toy_data_dir):
    data = hscl_zoo.load_splits("toy-digits", toy_data_dir, subset=100)
    assert data.train.column_names == ["image", "label"] and len(data.train) == 100
    assert data.class_names == [f"digit {d}" for d in range(10)]
    assert data.spec is TOY_DATASET and data.spec.native_size == 16


def test_toy_specs_through_the_card(toy_method, toy_dataset):
    model = hscl_zoo.create_model("resnet10t", num_classes=10, image_size=16)
    cfg = PretrainConfig(method="toy-power", dataset="toy-digits")
    training = {"dataset": "toy-digits", "method": "toy-power", "hyperparameters": cfg.method_hyperparameters(),
                "epochs": 1, "global_batch_size": 32, "expected_negatives_per_anchor": 58}
    card = render_card({**model.model_config(), "training": training}, {"top1": 50.0})
    assert "trained on Toy digits with Toy(power), SCL with negatives weighted by a power" in card
    assert "hscl-zoo-tests/toy-digits" in card  # the Hub id, in the metadata
    assert "10 classes at 16x16 pixels" in card and "| paper, Table 1 | n/a |" in card


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_one_epoch_run_with_the_toy_method_on_the_toy_dataset(toy_method, toy_dataset, toy_data_dir, tmp_path):
    out = tmp_path / "run"
    result = main(["--dataset", "toy-digits", "--data_dir", str(toy_data_dir), "--method", "toy-power",
                   "--beta", "2", "--epochs", "1", "--batch_size", "32", "--subset", "200", "--probe_epochs", "2",
                   "--monitor_train_size", "100", "--output_dir", str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "config.json", "hub", "linear_eval.json",
                                                      "metrics.jsonl", "phase_seconds.json"]
    (record,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = ["epoch", "train_loss", "views_per_second", "epoch_seconds", "assumption_fraction", "loss_ucl",
              "loss_scl", "loss_hucl", "loss_hscl", "lemma_held_fraction", "mass_hucl", "mass_hscl", "mass_hcol",
              "neg_cos_q50", "knn_top1", "monitor_seconds"]
    assert set(logged) <= set(record) and all(math.isfinite(record[k]) for k in logged)
    assert record["epoch"] == 1 and record["train_loss"] > 0
    assert sorted(p.name for p in (out / "hub").iterdir()) == ["README.md", "config.json", "metrics.json",
                                                               "model.safetensors"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["epoch_0001"]
    assert {"top1", "top5", "knn_top1", "protocol"} <= set(json.loads((out / "linear_eval.json").read_text()))
    assert result["hub_dir"] == str(out / "hub")

    model = hscl_zoo.load(f"local-dir:{out / 'hub'}")
    summary = model.training_summary
    assert (summary["method"], summary["dataset"]) == ("toy-power", "toy-digits")
    assert summary["hyperparameters"] == {"temperature": 0.5, "positives": "labels", "beta": 2.0,
                                          "M": "global embeddings - 2"}
    assert summary["expected_negatives_per_anchor"] == round(32 * 2 * 9 / 10)
    assert model.class_names[3] == "digit 3"
    assert "Toy(power)" in (out / "hub" / "README.md").read_text()
