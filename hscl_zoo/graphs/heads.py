"""A linear head for a trained graph encoder: logistic regression on its frozen graph embeddings.

The embeddings are standardised and a multinomial logistic regression is fitted; the scaling is
then folded into one ``nn.Linear``, so the saved encoder predicts with ``head(embedding)`` alone.
Its accuracy is measured by stratified 10-fold cross-validation of the same pipeline, which is
what a card quotes.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from hscl_zoo.graphs.encoder import GraphEncoder
from hscl_zoo.graphs.graphset import GraphSet

__all__ = ["fit_linear_head"]


def _pipeline(seed: int):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=seed))


def fit_linear_head(encoder: GraphEncoder, graphs: GraphSet, seed: int = 0, folds: int = 10) -> dict[str, float]:
    """Give `encoder` a linear head over `graphs`' classes; returns its cross-validated accuracy
    (``cv_accuracy``, ``cv_std`` over the folds) and its accuracy on the graphs it was fitted on."""
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    from hscl_zoo.graphs.svm import check_folds

    x = encoder.embed(graphs).double().numpy()
    y = graphs.labels.numpy()
    check_folds(y, folds)
    scores = cross_val_score(_pipeline(seed), x, y, cv=StratifiedKFold(folds, shuffle=True, random_state=seed))
    model = _pipeline(seed).fit(x, y)
    scaler, logistic = model[0], model[1]
    weight, bias = logistic.coef_, logistic.intercept_
    if weight.shape[0] == 1:  # binary: one logit; as two classes, (-z/2, z/2) give the same probabilities
        weight, bias = np.concatenate([-weight / 2, weight / 2]), np.concatenate([-bias / 2, bias / 2])
    folded_weight = weight / scaler.scale_
    folded_bias = bias - folded_weight @ scaler.mean_
    head = nn.Linear(encoder.embed_dim, len(graphs.class_names))
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(folded_weight))
        head.bias.copy_(torch.from_numpy(folded_bias))
    encoder.head = head
    encoder.class_names = tuple(graphs.class_names)
    train_accuracy = float((encoder.predict(graphs).argmax(1).numpy() == y).mean())
    return {"cv_accuracy": float(scores.mean()), "cv_std": float(scores.std()), "folds": folds,
            "train_accuracy": train_accuracy}
