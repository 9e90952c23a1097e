"""Turning a trained encoder and its measurements into a folder the Hub can take as it is.

The folder holds `model.safetensors` and `config.json` (with the training summary), a rendered
model card `README.md`, and `metrics.json` (the linear-probe evaluation and, for a recipe run,
the per-epoch history). The pretraining loop (`hscl_zoo.training.pretrain`) writes it at the end
of a run and `recipes/publish.py` rebuilds or pushes it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from torch import nn

from hscl_zoo.training.config import PretrainConfig
from hscl_zoo.zoo.cards import render_card
from hscl_zoo.zoo.hub import CONFIG_NAME
from hscl_zoo.zoo.saving import save_pretrained

METRICS_NAME = "metrics.json"
CARD_NAME = "README.md"
CARD_METRICS = ("top1", "top5", "knn_top1")


def negatives_per_anchor(cfg: PretrainConfig, num_classes: int) -> int:
    """Negatives each anchor meets in a global batch: every other image's views for a method whose
    negatives are other images (UCL, H-UCL); for one whose negatives are other labels (SCL, H-SCL)
    the other-label views, (C - 1) / C of them on a class-balanced batch."""
    others = (cfg.batch_size - 1) * cfg.views
    if cfg.method_spec.negatives == "other-images":
        return others
    return round(cfg.batch_size * cfg.views * (num_classes - 1) / num_classes)


def training_summary(
    cfg: PretrainConfig, num_processes: int, num_classes: int, config_path: str | None = None
) -> dict[str, Any]:
    """The `training` block of config.json: what a reader needs to know how the weights were made
    (`config_path`: the YAML file the run started from, named in the model card)."""
    return {
        "dataset": cfg.dataset,
        "method": cfg.method,
        "hyperparameters": cfg.method_hyperparameters(),
        "epochs": cfg.epochs,
        "global_batch_size": cfg.batch_size,
        "negatives_per_anchor": negatives_per_anchor(cfg, num_classes),
        "views": cfg.views,
        "label_positive_pairing": cfg.label_positive_pairing,
        "subset": cfg.subset,
        "optimizer": {"name": cfg.optimizer, "lr": cfg.lr, "weight_decay": cfg.weight_decay},
        "mixed_precision": cfg.mixed_precision,
        "num_processes": num_processes,
        "seed": cfg.seed,
        "stem": cfg.stem,
        "recipe": "recipes/pretrain.py",
        "config": config_path,
        "recipe_config": cfg.to_dict(),
    }


def write_hub_folder(
    model: nn.Module,
    folder: str | os.PathLike[str],
    *,
    training: Mapping[str, Any],
    evaluation: Mapping[str, Any],
    history: list[Mapping[str, Any]] | None = None,
    name: str | None = None,
    repo_id: str | None = None,
) -> Path:
    """Save weights + config, then the card and metrics (each written whole, then renamed)."""
    folder = save_pretrained(model, folder, training=training)
    config = json.loads((folder / CONFIG_NAME).read_text())
    results = {k: float(evaluation[k]) for k in CARD_METRICS if k in evaluation}
    _write_atomic(folder / CARD_NAME, render_card(config, results, name=name, repo_id=repo_id))
    metrics = {"evaluation": dict(evaluation), "history": list(history or [])}
    _write_atomic(folder / METRICS_NAME, json.dumps(metrics, indent=2) + "\n")
    return folder


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
