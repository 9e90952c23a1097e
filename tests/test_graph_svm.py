"""The SVM protocol against a loop written here: stratified, seeded outer folds, and for each the
C of the grid {1e-3, ..., 1e3} with the best 5-fold inner accuracy (the first on a tie), refitted
on the training part and scored on the held-out fold. The loop uses SVC and StratifiedKFold only,
not svm.py's GridSearchCV."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.model_selection import StratifiedKFold
from sklearn.svm import SVC

from hscl_zoo.graphs.svm import check_folds, outer_folds, svm_folds

GRID = [0.001, 0.01, 0.1, 1.0, 10.0, 100.0, 1000.0]


def small_set(seed: int, separation: float, first: int = 24) -> tuple[np.ndarray, np.ndarray]:
    """40 points in 3-D, `first` of class 0 and the rest of class 1, centres `separation` apart."""
    rng = np.random.default_rng(seed)
    labels = np.array([0] * first + [1] * (40 - first))
    return rng.normal(size=(40, 3)) + separation * labels[:, None], labels


def by_hand(x: np.ndarray, y: np.ndarray, seed: int, folds: int) -> list[dict[str, float]]:
    records = []
    outer = StratifiedKFold(folds, shuffle=True, random_state=seed)
    for fold, (train, test) in enumerate(outer.split(x, y)):
        best_c, best = None, -1.0
        for c in GRID:
            scores = []
            for inner_train, inner_test in StratifiedKFold(5).split(x[train], y[train]):
                model = SVC(C=c, kernel="rbf").fit(x[train][inner_train], y[train][inner_train])
                scores.append(np.mean(model.predict(x[train][inner_test]) == y[train][inner_test]))
            if np.mean(scores) > best:
                best_c, best = c, float(np.mean(scores))
        model = SVC(C=best_c, kernel="rbf").fit(x[train], y[train])
        records.append({"fold": fold, "C": best_c, "inner_accuracy": best,
                        "test_accuracy": float(np.mean(model.predict(x[test]) == y[test]))})
    return records


@pytest.mark.parametrize("separation", [1.0, 4.0], ids=["overlapping", "separable (ties in C)"])
@pytest.mark.parametrize("seed", [0, 3])
def test_svm_folds_equal_the_loop(seed, separation):
    x, y = small_set(seed, separation)
    got = svm_folds(x, y, seed, folds=4)
    expected = by_hand(x, y, seed, folds=4)
    assert [r["C"] for r in got] == [r["C"] for r in expected]
    for g, e in zip(got, expected):
        assert g["fold"] == e["fold"]
        assert g["inner_accuracy"] == pytest.approx(e["inner_accuracy"], abs=1e-12)
        assert g["test_accuracy"] == pytest.approx(e["test_accuracy"], abs=1e-12)
    if separation == 4.0:
        assert got[0]["C"] < 1000.0, "on a tie the smallest C of the best accuracy wins"


def test_when_every_c_ties_the_first_of_the_grid_wins():
    """Two balanced clusters far apart: every C of the grid classifies every inner fold right."""
    x, y = small_set(0, 4.0, first=20)
    got = svm_folds(x, y, 0, folds=4)
    assert [r["C"] for r in got] == [0.001] * 4
    assert [r["inner_accuracy"] for r in got] == [1.0] * 4
    assert [r["C"] for r in by_hand(x, y, 0, folds=4)] == [0.001] * 4


def test_the_outer_folds_are_stratified_seeded_and_cover_every_graph_once():
    _, y = small_set(0, 1.0)
    folds = outer_folds(y, seed=5, folds=4)
    tests = np.concatenate([test for _, test in folds])
    assert sorted(tests.tolist()) == list(range(40))
    for train, test in folds:
        assert np.bincount(y[test]).tolist() == [6, 4], "24/16 over 4 folds: 6 and 4 per fold"
        assert set(train.tolist()) == set(range(40)) - set(test.tolist())
    again = outer_folds(y, seed=5, folds=4)
    other = outer_folds(y, seed=6, folds=4)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(folds, again))
    assert not all(np.array_equal(a[1], b[1]) for a, b in zip(folds, other))
    assert not np.array_equal(folds[0][1], np.arange(10)), "the folds are shuffled, not the first rows"


def test_a_class_with_fewer_graphs_than_folds_is_refused_in_one_line():
    y = np.array([0] * 12 + [1] * 3)
    with pytest.raises(ValueError) as error:
        check_folds(y, 4)
    assert str(error.value) == ("class 1 has 3 graphs, fewer than the 4 folds; use --folds 3 or fewer, "
                                "or add graphs of that class.")
    check_folds(y, 3)
