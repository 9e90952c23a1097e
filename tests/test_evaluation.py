"""hscl_zoo.evaluation: feature extraction, weighted kNN, the linear probe and its protocol."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from hscl_zoo import evaluation
from hscl_zoo.data.datasets import label_array
from hscl_zoo.data.transforms import eval_transform
from hscl_zoo.evaluation import evaluate_encoder, extract_features, knn_top1, linear_probe
from rounding import dot_product_bound, undecided_argmax


class PixelEncoder(nn.Module):
    """A real (tiny) encoder: flatten, dropout, fixed linear map; ``encode`` is its feature path."""

    def __init__(self, spec) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.drop = nn.Dropout(0.5)
        self.proj = nn.Linear(3 * 16 * 16, 64)
        self.classifier = nn.Linear(64, 10)
        self.pretrained_cfg = {"mean": spec.mean, "std": spec.std, "input_size": (3, 16, 16)}

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.drop(x.flatten(1)))


@pytest.fixture(scope="module")
def transform(digits):
    spec = digits.spec
    return eval_transform({"mean": spec.mean, "std": spec.std, "input_size": (3, 16, 16)})


@pytest.fixture(scope="module")
def pixel_features(digits, transform):
    train = extract_features(nn.Flatten(), digits.train, transform, batch_size=500, progress=False)
    test = extract_features(nn.Flatten(), digits.test, transform, batch_size=500, progress=False)
    return train + test


def test_extract_features_in_order_in_eval_mode(digits, transform):
    encoder = PixelEncoder(digits.spec)
    encoder.train()
    feats, labels = extract_features(encoder.encode, digits.test, transform, batch_size=64, progress=False)
    assert feats.shape == (360, 64) and feats.dtype == torch.float32
    assert labels.dtype == torch.int64 and labels.tolist() == label_array(digits.test).tolist()
    assert encoder.training, "the module's mode must be restored"
    encoder.eval()
    with torch.no_grad():
        expected = encoder.encode(torch.stack([transform(digits.test[i]["image"]) for i in (0, 200, 359)]))
    torch.testing.assert_close(feats[[0, 200, 359]], expected)


def test_extract_features_rejects_spatial_maps(digits, transform):
    with pytest.raises(ValueError, match=r"\(batch, dim\).*pool"):
        extract_features(nn.Identity(), digits.test.select(range(4)), transform, progress=False)


def test_extract_features_needs_internal_columns(digits, transform):
    with pytest.raises(ValueError, match=r"missing \['label'\]"):
        extract_features(nn.Flatten(), digits.test.rename_column("label", "y"), transform, progress=False)


def reference_knn(train_f, train_y, test_f, test_y, k, temperature) -> float:
    train_n = train_f / train_f.norm(dim=1, keepdim=True)
    correct = 0
    for query, label in zip(test_f, test_y):
        sims = (train_n @ (query / query.norm())).tolist()
        nearest = sorted(range(len(sims)), key=lambda j: -sims[j])[:k]
        votes: dict[int, float] = {}
        for j in nearest:
            votes[int(train_y[j])] = votes.get(int(train_y[j]), 0.0) + float(np.exp(sims[j] / temperature))
        correct += max(votes, key=votes.get) == int(label)
    return 100.0 * correct / len(test_y)


def test_knn_matches_a_direct_implementation():
    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 8, generator=gen)
    train_y = torch.randint(0, 4, (300,), generator=gen)
    test_y = torch.randint(0, 4, (60,), generator=gen)
    train_f = centres[train_y] + 1.5 * torch.randn(300, 8, generator=gen)
    test_f = centres[test_y] + 1.5 * torch.randn(60, 8, generator=gen)
    for k, temperature in ((1, 0.1), (15, 0.1), (50, 0.5)):
        expected = reference_knn(train_f, train_y, test_f, test_y, k, temperature)
        assert knn_top1(train_f, train_y, test_f, test_y, k=k, temperature=temperature) == pytest.approx(expected)
        assert knn_top1(train_f, train_y, test_f, test_y, k=k, temperature=temperature,
                        chunk_size=7) == pytest.approx(expected)
    assert 0 < expected < 100


def test_knn_on_pixels_and_k_larger_than_the_bank(pixel_features):
    train_f, train_y, test_f, test_y = pixel_features
    assert knn_top1(train_f, train_y, test_f, test_y, k=20) > 95
    few = knn_top1(train_f[:30], train_y[:30], test_f, test_y, k=200)
    assert few == pytest.approx(knn_top1(train_f[:30], train_y[:30], test_f, test_y, k=30))


def test_knn_bad_input(pixel_features):
    train_f, train_y, test_f, test_y = pixel_features
    with pytest.raises(ValueError, match="dims"):
        knn_top1(train_f, train_y, test_f[:, :10], test_y)
    with pytest.raises(ValueError, match="labels must be"):
        knn_top1(train_f, train_y[:-1], test_f, test_y)
    with pytest.raises(ValueError, match="temperature"):
        knn_top1(train_f, train_y, test_f, test_y, temperature=0)


def test_linear_probe_learns_digits_and_records_protocol(pixel_features):
    train_f, train_y, test_f, test_y = pixel_features
    result = linear_probe(train_f, train_y, test_f, test_y, num_classes=10, epochs=30, progress=False)
    assert result.top1 > 90 and result.train_top1 > 95
    logits = test_f.float() @ result.head["weight"].T + result.head["bias"]
    correct_top1 = correct_top5 = 0
    for row, label in zip(logits.tolist(), test_y.tolist()):
        at_least_as_high = sum(value >= row[label] for c, value in enumerate(row) if c != label)  # ties count against
        correct_top1 += at_least_as_high == 0
        correct_top5 += at_least_as_high < 5
    assert result.top1 == pytest.approx(100.0 * correct_top1 / len(test_y), rel=1e-6)
    assert result.top5 == pytest.approx(100.0 * correct_top5 / len(test_y), rel=1e-6)
    assert result.protocol["optimizer"] == "Adam" and result.protocol["epochs"] == 30
    assert result.protocol["augmentation"] is False and result.protocol["report"] == "last epoch"
    json.dumps(result.protocol)
    head = nn.Linear(train_f.shape[1], 10)
    head.load_state_dict(result.head)
    with torch.no_grad():
        assert torch.allclose(head(test_f), logits, atol=1e-5)


def test_a_constant_feature_changes_nothing_in_the_probe(pixel_features):
    """Digits' border pixels are constant: the probe on the features with them equals the probe on
    the varying features alone (the constant ones get weight 0), to float32 precision."""
    train_f, train_y, test_f, test_y = pixel_features
    varies = train_f.amax(dim=0) > train_f.amin(dim=0)
    assert 0 < int((~varies).sum()) < len(varies)
    full = linear_probe(train_f, train_y, test_f, test_y, num_classes=10, epochs=5, progress=False)
    kept = linear_probe(train_f[:, varies], train_y, test_f[:, varies], test_y, num_classes=10, epochs=5,
                        progress=False)
    assert torch.equal(full.head["weight"][:, ~varies], torch.zeros(10, int((~varies).sum())))
    assert torch.allclose(full.head["weight"][:, varies], kept.head["weight"], rtol=1e-4, atol=1e-6)
    assert torch.allclose(full.head["bias"], kept.head["bias"], rtol=1e-4, atol=1e-5)
    assert (full.top1, full.top5) == (kept.top1, kept.top5)


def test_a_tie_with_the_true_class_is_not_a_hit():
    logits = torch.tensor([[1.0, 1.0, 0.0], [2.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    labels = torch.tensor([0, 0, 0])
    # row 0: class 1 ties the true class 0; row 1: a clear hit; row 2: all equal (a collapsed head)
    assert evaluation.topk_accuracy(logits, labels, num_classes=3) == pytest.approx((100 / 3, 100.0))
    collapsed = torch.zeros(2, 6)
    assert evaluation.topk_accuracy(collapsed, torch.tensor([0, 5]), num_classes=6) == (0.0, 0.0)


def test_linear_probe_is_seeded(pixel_features):
    train_f, train_y, test_f, test_y = pixel_features
    runs = [linear_probe(train_f, train_y, test_f, test_y, num_classes=10, epochs=3, seed=s, progress=False)
            for s in (1, 1, 2)]
    assert torch.equal(runs[0].head["weight"], runs[1].head["weight"])
    assert not torch.equal(runs[0].head["weight"], runs[2].head["weight"])


def test_linear_probe_top5_with_few_classes():
    gen = torch.Generator().manual_seed(0)
    feats, labels = torch.randn(40, 4, generator=gen), torch.arange(40) % 3
    result = linear_probe(feats, labels, feats, labels, num_classes=3, epochs=2, progress=False)
    assert result.top5 == 100.0 and result.protocol["top5_k"] == 3


def test_linear_probe_bad_input(pixel_features):
    train_f, train_y, test_f, test_y = pixel_features
    with pytest.raises(ValueError, match="num_classes=5"):
        linear_probe(train_f, train_y, test_f, test_y, num_classes=5, progress=False)
    with pytest.raises(ValueError, match=r"\(N, D\)"):
        linear_probe(train_f[:, :, None], train_y, test_f, test_y, num_classes=10, progress=False)


def test_evaluate_encoder_end_to_end(digits):
    encoder = PixelEncoder(digits.spec)
    result = evaluate_encoder(encoder, digits, epochs=10, knn_k=20, progress=False)
    encoder.classifier.load_state_dict(result.pop("head"))
    json.dumps(result)
    assert result["top1"] > 80 and result["knn_top1"] > 80
    assert result["dataset"] == "digits" and result["test_split"] == "test"
    encoder.eval()
    images = torch.stack([eval_transform(encoder.pretrained_cfg)(row["image"]) for row in digits.test]).flatten(1)
    with torch.no_grad():
        feats = encoder.encode(images)
        logits = encoder.classifier(feats)
    proj, head = encoder.proj, encoder.classifier
    feature_reach = dot_product_bound(images.abs() @ proj.weight.abs().T + proj.bias.abs(), images.shape[1] + 1,
                                      torch.float32)
    reach = feature_reach @ head.weight.abs().T + dot_product_bound(
        feats.abs() @ head.weight.abs().T + head.bias.abs(), feats.shape[1] + 1, torch.float32)
    open_rows = int(undecided_argmax(logits, reach).sum())
    accuracy = 100.0 * float((logits.argmax(1) == torch.tensor(label_array(digits.test))).float().mean())
    assert abs(accuracy - result["top1"]) <= 100.0 * open_rows / len(logits) + 1e-4, (
        f"top-1 {result['top1']} against {accuracy} from one batch of the whole test set; batches of another size "
        f"may decide only {open_rows} near-tied image(s) differently")
