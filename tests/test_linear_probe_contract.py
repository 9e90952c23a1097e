"""The finer contract of :func:`hscl_zoo.evaluation.linear_probe`: the head equals a training loop
written here from the documented protocol (population standardisation, zero init, Adam, cosine
decay to 0 per step, seeded shuffled mini-batches), which features count as constant, the recorded
protocol against the documented defaults, the progress bar, the device, and every error message."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hscl_zoo.evaluation import CONSTANT_FEATURE, linear_probe
from hscl_zoo.protocol import EVAL_DEFAULTS


def _toy(n=24, seed=0):
    """Three classes in three dims of different scales; dim 0 is centred to a mean of about 0."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 3
    centres = torch.tensor([[1.0, -2.0, 3.0], [-1.0, 1.0, 0.0], [0.0, 2.0, -3.0]])
    feats = centres[labels] * torch.tensor([0.3, 2.0, 5.0]) + 0.4 * torch.randn(n, 3, generator=gen)
    feats = feats + torch.tensor([0.0, 7.0, -0.2])
    feats[:, 0] -= feats[:, 0].mean()
    return feats, labels


def _reference_head(feats, labels, num_classes, *, epochs, lr, weight_decay, batch_size, seed):
    """The probe's documented protocol, step by step; returns the head folded onto raw features."""
    mean = feats.mean(dim=0)
    std = ((feats - mean) ** 2).mean(dim=0).sqrt()
    z = (feats - mean) / std
    weight = torch.zeros(num_classes, feats.shape[1], requires_grad=True)
    bias = torch.zeros(num_classes, requires_grad=True)
    optimizer = torch.optim.Adam([weight, bias], lr=lr, weight_decay=weight_decay)
    total = epochs * math.ceil(len(feats) / batch_size)
    step = 0
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(feats), generator=gen)
        for start in range(0, len(feats), batch_size):
            for group in optimizer.param_groups:
                group["lr"] = lr * (1 + math.cos(math.pi * step / total)) / 2
            batch = order[start : start + batch_size]
            loss = F.cross_entropy(z[batch] @ weight.T + bias, labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
    with torch.no_grad():
        return weight / std, bias - weight @ (mean / std)


def test_head_equals_the_documented_training_loop():
    """lr, weight decay, the cosine schedule's length and every sample of every mini-batch
    (a ragged last one included) all show in the head after three epochs."""
    feats, labels = _toy()
    settings = {"epochs": 3, "lr": 0.05, "weight_decay": 0.01, "batch_size": 5, "seed": 7}
    result = linear_probe(feats, labels, feats, labels, num_classes=3, progress=False, **settings)
    weight, bias = _reference_head(feats, labels, 3, **settings)
    assert torch.allclose(result.head["weight"], weight, rtol=1e-4, atol=1e-6)
    assert torch.allclose(result.head["bias"], bias, rtol=1e-4, atol=1e-6)


def test_standardisation_uses_the_population_std_of_the_train_split():
    """After one full-batch Adam step from zero each weight is -lr * sign(gradient) on the
    standardised features, so the folded weight is -lr * sign / std with std over N, not N - 1."""
    feats, labels = _toy(n=12)
    result = linear_probe(feats, labels, feats, labels, num_classes=3, epochs=1, lr=0.1, batch_size=12,
                          progress=False)
    mean = feats.mean(dim=0)
    std = ((feats - mean) ** 2).sum(dim=0).div(12).sqrt()
    z = (feats - mean) / std
    gradient = (torch.full((12, 3), 1 / 3) - F.one_hot(labels, 3)).T @ z / 12
    expected = -0.1 * gradient.sign() / std
    assert torch.allclose(result.head["weight"], expected, rtol=1e-5)


def test_separable_classes_are_learned_perfectly():
    feats, labels = _toy(n=30)
    result = linear_probe(feats, labels, feats[:6], labels[:6], num_classes=3, epochs=20, lr=0.05,
                          batch_size=8, progress=False)
    assert (result.top1, result.top5, result.train_top1) == (100.0, 100.0, 100.0)


def test_a_feature_exactly_at_the_constant_threshold_gets_weight_zero():
    """std == CONSTANT_FEATURE * |mean| is 'at most' the threshold: constant, although the feature
    separates the classes (standardised it would be +-1)."""
    level = torch.tensor(1.0013580322265625)
    spread = CONSTANT_FEATURE * level
    labels = torch.arange(8) % 2
    feats, _ = _toy(n=8)
    feats = torch.cat([feats[:, :2], torch.where(labels == 1, level + spread, level - spread)[:, None]], dim=1)
    column = feats[:, 2:]
    assert torch.equal(column.std(dim=0, unbiased=False), CONSTANT_FEATURE * column.mean(dim=0).abs())
    result = linear_probe(feats, labels, feats, labels, num_classes=2, epochs=3, lr=0.1, progress=False)
    assert torch.equal(result.head["weight"][:, 2], torch.zeros(2))
    assert result.head["weight"][:, :2].abs().min() > 0


def test_a_centred_feature_is_not_constant():
    """A feature of mean about 0 and std 0.3 carries signal: it gets a weight, and alone it
    separates two classes."""
    labels = torch.arange(10) % 2
    feats = torch.where(labels == 1, 0.3, -0.3)[:, None].float()
    feats = feats - feats.mean()
    result = linear_probe(feats, labels, feats, labels, num_classes=2, epochs=5, lr=0.1, progress=False)
    assert result.head["weight"][1, 0] > 0 > result.head["weight"][0, 0]
    assert result.top1 == 100.0


def test_a_small_spread_feature_is_standardised_not_clamped():
    """A feature of std 0.01 is divided by 0.01 (the clamp is 1e-6), so one full-batch step gives
    folded weights of lr / 0.01."""
    labels = torch.arange(6) % 2
    feats = torch.where(labels == 1, 5.01, 4.99)[:, None].float()
    result = linear_probe(feats, labels, feats, labels, num_classes=2, epochs=1, lr=0.1, batch_size=6,
                          progress=False)
    std = float(feats.std(unbiased=False))
    assert result.head["weight"][:, 0].tolist() == pytest.approx([-0.1 / std, 0.1 / std], rel=1e-5)


def test_the_recorded_protocol_states_every_setting():
    feats, labels = _toy(n=14)
    labels = torch.arange(14) % 7
    result = linear_probe(feats[:, :2], labels, feats[:5, :2], labels[:5], num_classes=7, epochs=2, lr=0.02,
                          weight_decay=0.5, batch_size=4, seed=3, progress=False)
    assert result.protocol == {
        "features": "frozen encoder, eval transform, extracted once (no augmentation)",
        "augmentation": False,
        "feature_normalisation": "per-dimension standardisation with train mean/std, folded into head",
        "head": "linear 2 -> 7, zero init",
        "loss": "cross-entropy",
        "optimizer": "Adam",
        "lr": 0.02,
        "weight_decay": 0.5,
        "lr_schedule": "cosine to 0, per step",
        "epochs": 2,
        "batch_size": 4,
        "seed": 3,
        "report": "last epoch",
        "top5_k": 5,
        "num_classes": 7,
        "num_train": 14,
        "num_test": 5,
    }


def test_defaults_are_the_documented_settings(capsys):
    """docs/evaluation.md: Adam lr 1e-3, weight decay 1e-6, batch 512, 100 epochs; the seed and
    epochs are EVAL_DEFAULTS; the progress bar is on."""
    feats, labels = _toy(n=9)
    result = linear_probe(feats, labels, feats, labels, num_classes=3)
    protocol = result.protocol
    assert (protocol["lr"], protocol["weight_decay"], protocol["batch_size"]) == (1e-3, 1e-6, 512)
    assert (protocol["epochs"], protocol["seed"]) == (EVAL_DEFAULTS["probe_epochs"], EVAL_DEFAULTS["seed"])
    explicit = linear_probe(feats, labels, feats, labels, num_classes=3, epochs=100, seed=0, progress=False)
    assert torch.equal(result.head["weight"], explicit.head["weight"])
    assert "linear probe: " in capsys.readouterr().err


def test_progress_bar_is_named_and_cleared_when_done(capsys):
    feats, labels = _toy(n=6)
    linear_probe(feats, labels, feats, labels, num_classes=3, epochs=3, progress=True)
    err = capsys.readouterr().err
    assert "linear probe: " in err and "\n" not in err


def test_no_progress_output_when_progress_is_off(capsys):
    feats, labels = _toy(n=6)
    linear_probe(feats, labels, feats, labels, num_classes=3, epochs=3, progress=False)
    assert capsys.readouterr().err == ""


def test_one_epoch_and_batches_of_one_are_accepted():
    feats, labels = _toy(n=6)
    result = linear_probe(feats, labels, feats, labels, num_classes=3, epochs=1, batch_size=1, progress=False)
    assert (result.protocol["epochs"], result.protocol["batch_size"]) == (1, 1)


def test_a_single_train_row_is_accepted():
    feats, labels = _toy(n=3)
    result = linear_probe(feats[:1], labels[:1], feats, labels, num_classes=3, epochs=1, progress=False)
    assert result.protocol["num_train"] == 1


def test_the_whole_probe_runs_on_the_requested_device():
    """On ``meta`` every step (data, labels, head, mini-batches) runs shape-only, and the first
    failure is copying the trained head back: nothing stayed on, or fell back to, the CPU."""
    feats, labels = _toy(n=6)
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
        linear_probe(feats, labels, feats, labels, num_classes=3, epochs=1, device="meta", progress=False)


def _message(train=None, test=None, **kwargs):
    feats, labels = _toy(n=6)
    train = train or (feats, labels)
    test = test or (feats, labels)
    kwargs = {"num_classes": 3, "progress": False, **kwargs}
    with pytest.raises(ValueError) as error:
        linear_probe(*train, *test, **kwargs)
    return str(error.value)


def test_error_messages_name_the_split_and_the_fix():
    feats, labels = _toy(n=6)
    cube = feats[:, :, None]
    assert _message(train=(cube, labels)) == "train features must be (N, D), got shape (6, 3, 1)"
    assert _message(test=(cube, labels)) == "test features must be (N, D), got shape (6, 3, 1)"
    assert _message(test=(feats, labels[:4])) == (
        "test labels must be (N,) with N = 6 rows of features, got shape (4,)")
    assert _message(train=(feats[:0], labels[:0])) == "train features are empty"
    assert _message(test=(feats[:0], labels[:0])) == "test features are empty"
    assert _message(test=(feats[:, :2], labels)) == (
        "train features have 3 dims but test features 2; extract both with the same encoder")


def test_labels_outside_the_classes_are_refused_per_split():
    feats, labels = _toy(n=6)
    assert _message(train=(feats, labels + 1)) == (
        "train labels range over [1, 3] but num_classes=3; pass the dataset's number of classes")
    assert _message(test=(feats, labels - 1)) == (
        "test labels range over [-1, 1] but num_classes=3; pass the dataset's number of classes")


def test_epochs_or_batch_size_below_one_is_refused():
    assert _message(epochs=0) == "epochs and batch_size must be >= 1, got 0, 512"
    assert _message(batch_size=0) == "epochs and batch_size must be >= 1, got 100, 0"
