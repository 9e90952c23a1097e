"""The paper's graph experiment as a grid of records, and the two protocols that fill them.

A record is one (dataset, protocol, variant, seed): ten outer folds of the SVM, each with its C,
its inner-CV accuracy and its test accuracy. Protocol ``a`` is the paper's: the encoder is trained
on every graph of the dataset, then the SVM is cross-validated on the frozen embeddings. Protocol
``b`` is leak-free: for each outer fold an encoder is trained on the training folds only, so the
test fold's labels never shape the encoder (SCL and H-SCL put labels inside the loss).

`GRAPH_VARIANTS` is the paper's grid: UCL, H-UCL and H-SCL(beta) at each beta of {1, 2, 10},
SCL, and H-SCL(tau) at the method table's default threshold.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Variant", "GRAPH_VARIANTS", "PROTOCOLS", "Plan", "PLANS", "RecordKey", "record_path", "run_record", "grid",
           "BETAS"]

BETAS = (1.0, 2.0, 10.0)
"""The beta grid of the paper's graph experiment (Robinson et al.'s)."""
PROTOCOLS = ("a", "b")


@dataclass(frozen=True)
class Plan:
    """What one protocol's part of the table is to hold: every variant on `datasets` over `seeds` seeds."""

    datasets: tuple[str, ...]
    seeds: int


PLANS = {
    "a": Plan(("MUTAG", "ENZYMES", "PTC_MR", "IMDB-BINARY", "IMDB-MULTI"), 10),
    "b": Plan(("MUTAG", "PTC_MR", "IMDB-BINARY"), 3),
}
"""The table's plan per protocol (TU names): (a), the paper's, at its own budget of ten seeds on all five
datasets; (b), the leak-free check, trains ten encoders per record, so it runs on the three smallest
two-class datasets with three seeds. The claim is judged on a protocol's planned datasets."""


@dataclass(frozen=True)
class Variant:
    """A method with its hyperparameters fixed: ``hscl-beta`` at beta = 2 is ``hscl-beta-b2``."""

    method: str
    hyperparameters: tuple[tuple[str, float], ...] = ()

    @property
    def name(self) -> str:
        suffix = "".join(f"-{key[0]}{value:g}" for key, value in self.hyperparameters)
        return f"{self.method}{suffix}"

    @property
    def loss_kwargs(self) -> dict[str, float]:
        return dict(self.hyperparameters)


GRAPH_VARIANTS: tuple[Variant, ...] = (
    Variant("ucl"),
    *(Variant("hucl", (("beta", b),)) for b in BETAS),
    Variant("scl"),
    *(Variant("hscl-beta", (("beta", b),)) for b in BETAS),
    Variant("hscl-tau", (("threshold", 0.0),)),
)


@dataclass(frozen=True)
class RecordKey:
    dataset: str
    protocol: str
    variant: Variant
    seed: int

    @property
    def label(self) -> str:
        return f"{self.dataset}/{self.protocol}/{self.variant.name}/seed{self.seed}"


def record_path(root: Path, key: RecordKey) -> Path:
    return Path(root) / key.dataset / f"protocol-{key.protocol}" / key.variant.name / f"seed{key.seed}.json"


def grid(datasets: list[str], protocols: list[str], seeds: list[int],
         variants: tuple[Variant, ...] = GRAPH_VARIANTS) -> Iterator[RecordKey]:
    """Every record, seeds outermost, so that a partial run already covers every cell."""
    for seed in seeds:
        for protocol in protocols:
            for dataset in datasets:
                for variant in variants:
                    yield RecordKey(dataset, protocol, variant, seed)


def _train_and_embed(graphs, train_ids, key: RecordKey, budget: dict[str, Any]) -> np.ndarray:
    from hscl_zoo.graphs.training import train_graph_encoder

    encoder = train_graph_encoder(graphs.subset(train_ids) if train_ids is not None else graphs, key.variant.method,
                                  key.seed, loss_kwargs=key.variant.loss_kwargs, **budget)
    return encoder.embed(graphs).numpy().astype(np.float64)


def run_record(graphs, key: RecordKey, budget: dict[str, Any] | None = None, folds: int = 10,
               progress: Path | None = None) -> dict[str, Any]:
    """Train and evaluate one record and return it; nothing is written but `progress`.

    `progress` (protocol ``b``) is a folder that keeps each finished fold as it lands: a record
    interrupted between folds (a session's end, a kill) resumes from its finished folds. Each fold's
    encoder is trained from the record's seed alone and the SVM is deterministic, so a resumed
    record equals an uninterrupted one; its ``seconds`` are the folds' own, summed."""
    from hscl_zoo.graphs.svm import outer_folds, svm_fold

    budget = dict(budget or {})
    labels = graphs.labels.numpy()
    splits = outer_folds(labels, key.seed, folds)
    if key.protocol == "a":
        start = time.perf_counter()
        embeddings = _train_and_embed(graphs, None, key, budget)
        fold_records = [{"fold": fold, **svm_fold(embeddings, labels, train, test)}
                        for fold, (train, test) in enumerate(splits)]
        seconds = time.perf_counter() - start
    elif key.protocol == "b":
        fold_records, seconds = [], 0.0
        for fold, (train, test) in enumerate(splits):
            kept = Path(progress) / f"fold{fold}.json" if progress is not None else None
            if kept is not None and kept.exists():
                finished = json.loads(kept.read_text())
            else:
                start = time.perf_counter()
                embeddings = _train_and_embed(graphs, train, key, budget)
                finished = {"fold": fold, **svm_fold(embeddings, labels, train, test),
                            "seconds": time.perf_counter() - start}
                if kept is not None:
                    write_record(kept, finished)
            seconds += finished.pop("seconds")
            fold_records.append(finished)
    else:
        raise ValueError(f"protocol is 'a' (the paper's) or 'b' (leak-free), got {key.protocol!r}.")
    accuracies = [f["test_accuracy"] for f in fold_records]
    return {"dataset": key.dataset, "protocol": key.protocol, "variant": key.variant.name,
            "method": key.variant.method, "hyperparameters": key.variant.loss_kwargs, "seed": key.seed,
            "budget": budget, "folds": fold_records, "mean_test_accuracy": float(np.mean(accuracies)),
            "mean_inner_accuracy": float(np.mean([f["inner_accuracy"] for f in fold_records])),
            "seconds": round(seconds, 1)}


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Write atomically: a record file exists whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(partial, path)
