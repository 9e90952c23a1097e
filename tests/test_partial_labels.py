"""Partly labelled data (issue 17): the recipe's labelled_fraction, the diagnostics on labelled
anchors, and the label-positive pairing of unlabelled images. The losses' rule for label -1 is
tested in tests/test_unlabelled_loss.py."""

import math

import numpy as np
import pytest
import torch

from hscl_zoo.data.datasets import label_array
from hscl_zoo.data.labelling import labelled_rows, partly_labelled
from hscl_zoo.data.views import MultiViewDataset
from hscl_zoo.losses.diagnostics import DiagnosticsMeter, assumption_counts, lemma_losses, negative_masses
from hscl_zoo.training.config import PretrainConfig


def test_labelled_rows_are_class_balanced_seeded_and_keep_unlabelled_rows_out():
    labels = np.array([0] * 50 + [1] * 30 + [2] * 3 + [-1] * 7)
    kept = labelled_rows(labels, 0.1, seed=3)
    assert np.bincount(labels[kept]).tolist() == [5, 3, 1]  # round(0.1 n), at least one per class
    assert np.array_equal(kept, labelled_rows(labels, 0.1, seed=3))
    assert not np.array_equal(kept, labelled_rows(labels, 0.1, seed=4))
    assert np.array_equal(labelled_rows(labels, 1.0, seed=0), np.flatnonzero(labels >= 0))


def test_partly_labelled_digits_marks_the_rest_unlabelled(digits):
    data = partly_labelled(digits, 0.2, seed=0)
    before, after = label_array(digits.train), label_array(data.train)
    kept = after != -1
    assert np.array_equal(after[kept], before[kept]), "kept labels are the original ones"
    assert data.unlabelled == int((~kept).sum()) == len(before) - int(kept.sum())
    per_class = np.bincount(after[kept], minlength=10)
    assert np.array_equal(per_class, np.round(0.2 * np.bincount(before)).astype(int))
    assert len(data.labelled().train) == int(kept.sum()) and len(data.test) == len(digits.test)
    assert data.train.features == digits.train.features
    assert partly_labelled(digits, 1.0) is digits


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.01, True])
def test_labelled_fraction_outside_zero_one_is_refused(bad):
    with pytest.raises(ValueError, match=r"labelled_fraction=.* must be a number in \(0, 1\]"):
        PretrainConfig(labelled_fraction=bad)


def test_a_nan_labelled_fraction_is_refused_as_not_finite():
    with pytest.raises(ValueError, match=r"^labelled_fraction=nan must be a finite number\.$"):
        PretrainConfig(labelled_fraction=math.nan)


def clustered(B=24, V=2, d=8, classes=4, spread=0.4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(B) % classes
    centres = torch.nn.functional.normalize(torch.randn(classes, d, generator=gen, dtype=torch.float64), dim=-1)
    return centres[labels][:, None, :] + spread * torch.randn(B, V, d, generator=gen, dtype=torch.float64), labels


def test_diagnostics_use_the_labelled_images_only_and_count_them():
    f, labels = clustered()
    unlabelled = torch.zeros(24, dtype=torch.bool)
    unlabelled[[1, 2, 7, 11, 12, 20]] = True
    mixed = torch.where(unlabelled, -1, labels)
    kept_f, kept_y = f[~unlabelled], labels[~unlabelled]
    assert assumption_counts(f, mixed, beta=1.0) == assumption_counts(kept_f, kept_y, beta=1.0)
    assert assumption_counts(f, mixed, beta=1.0) != assumption_counts(f, labels, beta=1.0)
    assert lemma_losses(f, mixed) == lemma_losses(kept_f, kept_y)
    eta = torch.exp
    masses = negative_masses(f, mixed, eta)
    assert all(torch.equal(masses[k], negative_masses(kept_f, kept_y, eta)[k]) for k in masses)

    meter, reference = DiagnosticsMeter(beta=1.0), DiagnosticsMeter(beta=1.0)
    meter.update(f, mixed)
    meter.update(f[:4], torch.full((4,), -1))  # no labelled image: left out, counted
    reference.update(kept_f, kept_y)
    out, expected = meter.compute(), reference.compute()
    assert out["diagnostics_anchors"] == 18 * 2 and out["diagnostics_unlabelled_anchors"] == (6 + 4) * 2
    assert expected["diagnostics_anchors"] == 36 and expected["diagnostics_unlabelled_anchors"] == 0
    same = [k for k in out if not k.startswith("diagnostics_")]
    # the meter masks the unlabelled rows out instead of dropping them: its sums run over more
    # (zero) terms in another order, equal to the last bits; counts and histogram are exact
    assert {k: out[k] for k in same} == pytest.approx({k: expected[k] for k in same}, rel=1e-12)
    exact = ["assumption_fraction", "lemma_held_fraction", *(k for k in same if k.startswith("neg_cos_"))]
    assert {k: out[k] for k in exact} == {k: expected[k] for k in exact}


def test_diagnostics_of_batches_without_labels_are_nan_with_counts():
    f, _ = clustered(B=6)
    nobody = torch.full((6,), -1)
    assert assumption_counts(f, nobody, beta=1.0) == (0, 0)
    assert all(math.isnan(v) for v in lemma_losses(f, nobody).values())
    meter = DiagnosticsMeter(beta=1.0)
    meter.update(f, nobody)
    out = meter.compute()
    assert (out["diagnostics_anchors"], out["diagnostics_unlabelled_anchors"]) == (0, 12)
    assert math.isnan(out["assumption_fraction"]) and math.isnan(out["loss_hscl"])


def test_diagnostics_refuse_other_negative_labels_and_float_labels():
    f, labels = clustered(B=6)
    with pytest.raises(ValueError, match="label -3 is negative"):
        assumption_counts(f, torch.tensor([0, 1, -3, 0, 1, 2]), beta=1.0)
    with pytest.raises(ValueError, match="integer class ids"):
        lemma_losses(f, labels.float())


def test_label_positive_pairing_keeps_an_unlabelled_image_to_itself(digits):
    table = partly_labelled(digits, 0.5, seed=0).train.select(range(60))
    views = MultiViewDataset(table, lambda image: image, views=3, label_positive=True, seed=0)
    labels = label_array(table)
    for row in range(60):
        sources = views.view_sources(row)
        if labels[row] == -1:
            assert sources == [row] * 3
        else:
            assert all(labels[s] == labels[row] for s in sources)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_one_epoch_run_with_a_fifth_of_the_labels_reports_what_it_used(tmp_path):
    import json

    from hscl_zoo.training.pretrain import main

    out = tmp_path / "run"
    main(["--method", "scl", "--labelled_fraction", "0.2", "--epochs", "1", "--subset", "200", "--batch_size", "32",
          "--backbone", "resnet10t", "--probe_epochs", "2", "--monitor_train_size", "100", "--output_dir", str(out)])
    evaluation = json.loads((out / "linear_eval.json").read_text())
    assert (evaluation["train_images"], evaluation["unlabelled_train_images"]) == (40, 160)
    (record,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert record["knn_train_images"] == 40
    anchors, left_out = record["diagnostics_anchors"], record["diagnostics_unlabelled_anchors"]
    assert record["diagnostics_every"] == 10, "the CPU's default: of the epoch's 6 steps, step 0 only"
    assert anchors + left_out == 1 * 32 * 2 and 0 < anchors < left_out
    assert json.loads((out / "config.json").read_text())["labelled_fraction"] == 0.2


def test_train_on_unlabelled_false_pretrains_on_the_labelled_images_only():
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from hscl_zoo.training.setup import load_training_data

    AcceleratorState._reset_state(reset_partial_state=True)  # an earlier in-process run may have set one up
    accelerator = Accelerator(cpu=True)
    try:
        kept, _ = load_training_data(PretrainConfig(subset=200, labelled_fraction=0.2), accelerator)
        labelled, _ = load_training_data(PretrainConfig(subset=200, labelled_fraction=0.2, train_on_unlabelled=False),
                                         accelerator)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert (len(kept.train), kept.unlabelled) == (200, 160)
    assert (len(labelled.train), labelled.unlabelled) == (40, 0)
    assert sorted(label_array(labelled.train).tolist()) == sorted(x for x in label_array(kept.train).tolist() if x != -1)
    assert len(labelled.test) == len(kept.test)
