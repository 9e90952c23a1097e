"""hscl_zoo.retrieval: Recall@K, Precision@1, MAP@R and mAP against a loop written from the
definitions, hand-ranked cases, and pytorch-metric-learning's AccuracyCalculator."""

from __future__ import annotations

import json
import math

import pytest
import torch
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from pytorch_metric_learning.utils.inference import CustomKNN

import hscl_zoo
from hscl_zoo.cli import main
from hscl_zoo.data import load_splits
from hscl_zoo.evaluation import extract_features
from hscl_zoo.retrieval import retrieval_metrics


def brute_force(query, query_labels, gallery, gallery_labels, ks, leave_one_out):
    """Each query ranks the gallery by float64 cosine (ties: earlier gallery row first), then the
    metrics are summed rank by rank from their definitions."""
    totals = dict.fromkeys([f"recall_at_{k}" for k in ks] + ["precision_at_1", "map_at_r", "map"], 0.0)
    scored = 0
    for i in range(len(query)):
        q = query[i].double()
        candidates = [j for j in range(len(gallery)) if not (leave_one_out and j == i)]
        cosine = {j: float(q @ gallery[j].double() / (q.norm() * gallery[j].double().norm())) for j in candidates}
        ranked = sorted(candidates, key=lambda j: (-cosine[j], j))
        relevant = [int(gallery_labels[j]) == int(query_labels[i]) for j in ranked]
        r = sum(relevant)
        if r == 0:
            continue
        scored += 1
        for k in ks:
            totals[f"recall_at_{k}"] += any(relevant[:k])
        totals["precision_at_1"] += relevant[0]
        hits, ap, ap_r = 0, 0.0, 0.0
        for rank, is_relevant in enumerate(relevant, start=1):
            if is_relevant:
                hits += 1
                ap += hits / rank
                if rank <= r:
                    ap_r += hits / rank
        totals["map"] += ap / r
        totals["map_at_r"] += ap_r / r
    return {key: 100.0 * value / scored for key, value in totals.items()}, scored


def clustered(n, classes, dim, seed, spread=1.5):
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=generator)
    labels = torch.randint(0, classes, (n,), generator=generator)
    return centres[labels] + spread * torch.randn(n, dim, generator=generator), labels


@pytest.mark.parametrize("max_chunk_bytes", [1, 56 * 70 * 7, 2**30])
def test_query_against_gallery_matches_the_definitions(max_chunk_bytes):
    query, query_labels = clustered(50, 6, 8, seed=0)
    gallery, gallery_labels = clustered(70, 5, 8, seed=1)  # class 5 of the queries has no gallery item
    ks = (1, 5, 10, 100)
    expected, scored = brute_force(query, query_labels, gallery, gallery_labels, ks, leave_one_out=False)
    result = retrieval_metrics(query, query_labels, gallery, gallery_labels, ks=ks, max_chunk_bytes=max_chunk_bytes)
    for key, value in expected.items():
        assert result[key] == pytest.approx(value, abs=1e-9), key
    assert result["queries"] == scored and result["queries_without_match"] == int((query_labels == 5).sum()) > 0
    assert (result["gallery_size"], result["leave_one_out"]) == (70, False)
    assert result["recall_at_100"] == 100.0


@pytest.mark.parametrize("max_chunk_bytes", [1, 2**30])
def test_leave_one_out_with_ties_and_classes_of_one(max_chunk_bytes):
    feats, labels = clustered(60, 8, 6, seed=2)
    feats[10] = feats[3]  # exact ties, across and within classes
    feats[11], labels[11] = feats[3], labels[3]
    labels[20] = 99  # a class of one: no other item, left out
    expected, scored = brute_force(feats, labels, feats, labels, (1, 5, 10), leave_one_out=True)
    result = retrieval_metrics(feats, labels, max_chunk_bytes=max_chunk_bytes)
    for key, value in expected.items():
        assert result[key] == pytest.approx(value, abs=1e-9), key
    assert (result["queries"], result["queries_without_match"], result["gallery_size"]) == (scored, 1, 59)
    assert scored == 59


def _at_angles(degrees):
    radians = torch.tensor(degrees, dtype=torch.float64) * math.pi / 180
    return torch.stack([radians.cos(), radians.sin()], dim=1).float()


def test_hand_ranked_query():
    # ranked by angle: relevant, other, relevant, relevant, other; R = 3
    gallery = _at_angles([5, 10, 20, 30, 40])
    labels = torch.tensor([0, 1, 0, 0, 1])
    result = retrieval_metrics(_at_angles([0]), torch.tensor([0]), gallery, labels, ks=(1, 2))
    assert result["map_at_r"] == pytest.approx(100 * (1 + 2 / 3) / 3)
    assert result["map"] == pytest.approx(100 * (1 + 2 / 3 + 3 / 4) / 3)
    assert (result["precision_at_1"], result["recall_at_1"], result["recall_at_2"]) == (100.0, 100.0, 100.0)
    # the only relevant item at rank 2: Recall@1 0, Recall@2 100, MAP@R (R = 1) 0, mAP 1/2
    result = retrieval_metrics(_at_angles([0]), torch.tensor([1]), gallery, torch.tensor([0, 1, 0, 0, 0]), ks=(1, 2))
    assert (result["recall_at_1"], result["recall_at_2"], result["map_at_r"], result["map"]) == (0.0, 100.0, 0.0, 50.0)


def test_ties_rank_in_gallery_order():
    gallery = _at_angles([10, 10, 50])  # rows 0 and 1 are the same point
    first_relevant = retrieval_metrics(_at_angles([0]), torch.tensor([0]), gallery, torch.tensor([0, 1, 1]))
    second_relevant = retrieval_metrics(_at_angles([0]), torch.tensor([0]), gallery, torch.tensor([1, 0, 1]))
    assert (first_relevant["precision_at_1"], second_relevant["precision_at_1"]) == (100.0, 0.0)
    assert second_relevant["map"] == pytest.approx(50.0)


def _pml(query, query_labels, gallery=None, gallery_labels=None):
    calculator = AccuracyCalculator(include=("precision_at_1", "mean_average_precision_at_r",
                                             "mean_average_precision"),
                                    k=None, device=torch.device("cpu"), knn_func=CustomKNN(CosineSimilarity()))
    if gallery is None:
        return calculator.get_accuracy(query, query_labels)
    return calculator.get_accuracy(query, query_labels, gallery, gallery_labels, ref_includes_query=False)


@pytest.mark.parametrize("leave_one_out", [False, True])
def test_agrees_with_pytorch_metric_learning(leave_one_out):
    query, query_labels = clustered(300, 12, 16, seed=3, spread=2.0)
    gallery, gallery_labels = (None, None) if leave_one_out else clustered(400, 10, 16, seed=4, spread=2.0)
    ours = retrieval_metrics(query, query_labels, gallery, gallery_labels, max_chunk_bytes=56 * 400 * 37)
    theirs = _pml(query, query_labels, gallery, gallery_labels)
    assert ours["precision_at_1"] / 100 == pytest.approx(theirs["precision_at_1"], abs=1e-6)
    assert ours["map_at_r"] / 100 == pytest.approx(theirs["mean_average_precision_at_r"], abs=1e-6)
    assert ours["map"] / 100 == pytest.approx(theirs["mean_average_precision"], abs=1e-6)
    assert 0 < ours["map_at_r"] < ours["map"] < 100


@pytest.mark.parametrize("call, message", [
    (lambda f, y: retrieval_metrics(f, y, f), "both gallery_feats and gallery_labels"),
    (lambda f, y: retrieval_metrics(f, y[:3]), r"query labels must be \(N,\) with N = 4"),
    (lambda f, y: retrieval_metrics(f, y, f[:, :2], y), "query features have 3 dims but gallery features 2"),
    (lambda f, y: retrieval_metrics(f[:0], y[:0]), "non-empty"),
    (lambda f, y: retrieval_metrics(f, y, ks=(0,)), "ks must be integers >= 1"),
])
def test_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call(torch.randn(4, 3), torch.tensor([0, 0, 1, 1]))


def test_eval_command_writes_test_against_train_retrieval(tmp_path, capsys):
    torch.manual_seed(0)
    training = {"dataset": "digits", "method": "scl", "hyperparameters": {"temperature": 0.5}, "epochs": 1,
                "global_batch_size": 8, "expected_negatives_per_anchor": 14}
    model = hscl_zoo.create_model("resnet10t", num_classes=10, image_size=16, mean=[0.3] * 3, std=[0.4] * 3)
    folder = model.eval().save_pretrained(tmp_path / "model", training=training)
    out = tmp_path / "eval.json"
    assert main(["eval", str(folder), "--dataset", "digits", "--subset", "100", "--probe_epochs", "1",
                 "--metrics", "knn,retrieval", "--out", str(out)]) == 0
    assert "Recall@1" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["metrics"] == ["knn", "retrieval"] and "top1" not in result and "audit" not in result
    data = load_splits("digits", subset=100, seed=0)
    train = extract_features(model.encode, data.train, model.transform, progress=False)
    test = extract_features(model.encode, data.test, model.transform, progress=False)
    expected, scored = brute_force(*test, *train, (1, 5, 10), leave_one_out=False)
    for key, value in expected.items():
        assert result["retrieval"][key] == pytest.approx(value, abs=1e-9), key
    assert (result["retrieval"]["queries"], result["retrieval"]["gallery_size"]) == (scored, 100)
    assert result["protocol"]["retrieval"]["gallery"] == "train"
