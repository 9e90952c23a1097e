"""hscl_zoo.audit: alignment, uniformity, per-class accuracy and confusions against values derived
by hand or by a loop, and the whole audit of a real tiny encoder whose outputs are known."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import pytest
import torch
from torch import nn

import hscl_zoo
from hscl_zoo.audit import alignment, audit, class_accuracy, confused_pairs, uniformity
from hscl_zoo.data.datasets import label_array
from rounding import dot_product_bound, undecided_argmax


def test_alignment_hand_cases():
    a = torch.randn(7, 5)
    assert alignment(a, 3.0 * a) == pytest.approx(0.0, abs=1e-12)  # same direction: distance 0
    assert alignment(a, -a) == pytest.approx(4.0)  # antipodal: ||2u||^2
    e = torch.eye(4)
    assert alignment(e, e.roll(1, dims=0)) == pytest.approx(2.0)  # orthogonal unit vectors
    assert alignment(e, e.roll(1, dims=0), alpha=1.0) == pytest.approx(math.sqrt(2.0))


def test_alignment_matches_a_loop():
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(9, 4, generator=generator), torch.randn(9, 4, generator=generator)
    total = 0.0
    for x, y in zip(a.double(), b.double()):
        total += float(((x / x.norm() - y / y.norm()) ** 2).sum()) ** 1.5
    assert alignment(a, b, alpha=3.0) == pytest.approx(total / 9)


@pytest.mark.parametrize("n", [2, 5, 12])
def test_uniformity_of_a_regular_simplex(n):
    # n unit vectors with pairwise cosine -1/(n-1): every squared distance is 2 + 2/(n-1)
    simplex = torch.eye(n) - 1.0 / n
    assert uniformity(simplex, chunk_size=3) == pytest.approx(-2.0 * (2.0 + 2.0 / (n - 1)))
    assert uniformity(simplex, t=0.5) == pytest.approx(-0.5 * (2.0 + 2.0 / (n - 1)))


def test_uniformity_collapse_and_a_loop():
    assert uniformity(torch.ones(6, 3)) == pytest.approx(0.0, abs=1e-12)
    z = torch.randn(23, 6, generator=torch.Generator().manual_seed(1))
    unit = [v / v.norm() for v in z.double()]
    terms = [math.exp(-2.0 * float(((unit[i] - unit[j]) ** 2).sum())) for i, j in itertools.combinations(range(23), 2)]
    expected = math.log(sum(terms) / len(terms))
    for chunk_size in (1, 4, 100):
        assert uniformity(z, chunk_size=chunk_size) == pytest.approx(expected, abs=1e-10)


def test_class_accuracy_and_confused_pairs_by_hand():
    labels = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2, 3])
    predictions = torch.tensor([0, 0, 1, 2, 0, 1, 2, 2, 1, 3])
    assert class_accuracy(predictions, labels, 5)[:4] == pytest.approx([50.0, 50.0, 200 / 3, 100.0])
    assert math.isnan(class_accuracy(predictions, labels, 5)[4])  # no test image of class 4
    pairs = confused_pairs(predictions, labels, 5)
    # {0,1}: 0->1 once, 1->0 once, over 4 + 2 images; {1,2}: 2->1 once over 2 + 3; {0,2}: 0->2 once over 4 + 3
    assert pairs == [
        {"a": 0, "b": 1, "a_as_b": 1, "b_as_a": 1, "rate": pytest.approx(100 * 2 / 6)},
        {"a": 0, "b": 2, "a_as_b": 1, "b_as_a": 0, "rate": pytest.approx(100 * 1 / 7)},
        {"a": 1, "b": 2, "a_as_b": 0, "b_as_a": 1, "rate": pytest.approx(100 * 1 / 5)},
    ]
    assert confused_pairs(predictions, labels, 5, top=1) == pairs[:1]


@pytest.mark.parametrize("call, message", [
    (lambda: alignment(torch.ones(3, 2), torch.ones(2, 2)), "same shape"),
    (lambda: uniformity(torch.ones(1, 2)), "N >= 2"),
    (lambda: class_accuracy(torch.tensor([0, 5]), torch.tensor([0, 1]), 3), r"predictions range over \[0, 5\]"),
    (lambda: confused_pairs(torch.tensor([0]), torch.tensor([0, 1]), 3), "same shape"),
])
def test_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.fixture(scope="module")
def digits_test(digits):
    return dataclasses.replace(digits, test=digits.test.select(range(0, 360, 6)))


def _tiny_encoder(spec, **training):
    torch.manual_seed(0)
    model = hscl_zoo.create_model("resnet10t", num_classes=10, image_size=16, mean=spec.mean, std=spec.std)
    model.training_summary = {"hyperparameters": training} if training else None
    return model.eval()


def test_audit_of_a_collapsed_encoder_is_known_by_hand(digits_test):
    model = _tiny_encoder(digits_test.spec, temperature=0.2, beta=3.0)
    last = [m for m in model.projector.modules() if isinstance(m, nn.Linear)][-1]
    nn.init.zeros_(last.weight)
    nn.init.constant_(last.bias, 1.0)  # every projection is the same unit vector
    head = {"weight": torch.zeros(10, model.num_features), "bias": torch.arange(10.0) * (torch.arange(10) == 3)}
    result = audit(model, digits_test, head=head, batch_size=32, progress=False)
    json.dumps(result)
    labels = torch.tensor(label_array(digits_test.test))
    counts = torch.bincount(labels, minlength=10)
    # the head predicts class 3 for every image
    assert result["class_accuracy"] == {str(c): (100.0 if c == 3 else 0.0) for c in range(10)}
    top = sorted((-int(counts[c]), c) for c in range(10) if c != 3)[:5]
    assert [(p["classes"], p["a_as_b"] + p["b_as_a"]) for p in result["confused_pairs"]] == [
        (sorted([str(c), "3"], key=int), -n) for n, c in top]
    # identical projections: distance 0 everywhere, and equal means over collisions and negatives
    assert result["alignment"] == pytest.approx(0.0, abs=1e-10)
    assert result["uniformity"] == pytest.approx(0.0, abs=1e-6)
    assert result["assumption_fraction"] == 1.0
    assert result["assumption_anchors"] == 2 * len(labels) and result["images"] == len(labels)
    assert result["protocol"]["assumption_temperature"] == 0.2
    assert result["protocol"]["assumption_hardening"] == "exponential tilt, beta 3"


def test_audit_of_a_random_encoder(digits_test):
    model = _tiny_encoder(digits_test.spec, temperature=0.5, threshold=0.1)
    result = audit(model, digits_test, batch_size=40, progress=False)
    assert 0.0 < result["alignment"] < 4.0 and -4.0 < result["uniformity"] < 0.0
    assert 0.0 <= result["assumption_fraction"] <= 1.0
    assert result["protocol"]["assumption_hardening"] == "threshold 0.1"
    images = torch.stack([model.transform(row["image"]) for row in digits_test.test])
    with torch.no_grad():
        feats = torch.cat([model.encode(chunk) for chunk in images.split(40)])
        logits = model.classifier(feats)
    head = model.classifier
    reach = dot_product_bound(feats.abs() @ head.weight.abs().T + head.bias.abs(), feats.shape[1] + 1, torch.float32)
    open_rows = undecided_argmax(logits, reach)
    labels = torch.tensor(label_array(digits_test.test))
    for c in range(10):
        mine = labels == c
        expected = 100.0 * float((logits[mine].argmax(1) == c).float().mean())
        allowed = 100.0 * int(open_rows[mine].sum()) / int(mine.sum())
        assert abs(result["class_accuracy"][str(c)] - expected) <= allowed + 1e-9, (
            f"class {c}: {result['class_accuracy'][str(c)]} against {expected}; the head's two products (one matmul "
            f"and a bias, or one addmm) may decide only {int(open_rows[mine].sum())} near-tied image(s) differently")
    assert audit(model, digits_test, batch_size=40, progress=False) == result, "seeded: the same audit twice"
