"""The paper's evaluation of graph embeddings: an RBF SVM, cross-validated.

Outer loop: stratified K-fold (10) with the seed's shuffle. Inside each training part, C is
chosen from {1e-3, ..., 1e3} by a 5-fold stratified grid search (the first C of the best mean
accuracy wins a tie), the SVM is refitted on the whole training part and scored on the held-out
fold. This is InfoGraph's and HCL's ``svc_classify`` with the outer folds seeded. Every fold is
returned, with the inner-CV accuracy of the chosen C, so that a hyperparameter can later be chosen
without looking at test folds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["C_GRID", "check_folds", "outer_folds", "svm_fold", "svm_folds"]

C_GRID: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0, 1e1, 1e2, 1e3)


def check_folds(labels: np.ndarray, folds: int) -> None:
    """Refuse a split that stratified K-fold cannot make: every class needs `folds` graphs."""
    classes, counts = np.unique(labels, return_counts=True)
    if folds < 2:
        raise ValueError(f"cross-validation needs at least 2 folds, got {folds}.")
    if counts.min() < folds:
        small = classes[counts.argmin()]
        raise ValueError(f"class {small} has {counts.min()} graphs, fewer than the {folds} folds; "
                         f"use --folds {int(counts.min())} or fewer, or add graphs of that class.")


def svm_fold(embeddings: np.ndarray, labels: np.ndarray, train: np.ndarray, test: np.ndarray,
             c_grid: Sequence[float] = C_GRID, inner_folds: int = 5) -> dict[str, float]:
    """Choose C by grid search on the `train` rows, refit there, score on the `test` rows."""
    from sklearn.model_selection import GridSearchCV, StratifiedKFold
    from sklearn.svm import SVC

    search = GridSearchCV(SVC(), {"C": list(c_grid)}, cv=StratifiedKFold(n_splits=inner_folds), scoring="accuracy")
    search.fit(embeddings[train], labels[train])
    return {"C": float(search.best_params_["C"]), "inner_accuracy": float(search.best_score_),
            "test_accuracy": float(search.score(embeddings[test], labels[test]))}


def outer_folds(labels: np.ndarray, seed: int, folds: int = 10) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (train rows, test rows) of stratified K-fold with the seed's shuffle."""
    from sklearn.model_selection import StratifiedKFold

    labels = np.asarray(labels)
    check_folds(labels, folds)
    splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    return list(splitter.split(np.zeros((labels.size, 1)), labels))


def svm_folds(embeddings: np.ndarray, labels: np.ndarray, seed: int, folds: int = 10,
              c_grid: Sequence[float] = C_GRID, inner_folds: int = 5) -> list[dict[str, float]]:
    """One record per outer fold: ``fold``, ``C``, ``inner_accuracy`` (the grid search's best mean
    accuracy on the training part) and ``test_accuracy`` (on the held-out fold)."""
    embeddings, labels = np.asarray(embeddings, dtype=np.float64), np.asarray(labels)
    return [{"fold": fold, **svm_fold(embeddings, labels, train, test, c_grid, inner_folds)}
            for fold, (train, test) in enumerate(outer_folds(labels, seed, folds))]
