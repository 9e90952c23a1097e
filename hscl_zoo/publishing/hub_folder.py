"""Turning a trained encoder and its measurements into a folder the Hub can take as it is.

The folder holds `model.safetensors` and `config.json` (with the training summary), a rendered
model card `README.md`, and `metrics.json` (the linear-probe evaluation and, for a recipe run,
the per-epoch history). The pretraining loop (`hscl_zoo.training.pretrain`) writes it at the end
of a run; `recipes/publish.py` and `hscl-zoo push` rebuild it with :func:`rebuild_hub_folder` and
upload it with :func:`push_hub_folder`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from torch import nn

from hscl_zoo._files import sha256_file
from hscl_zoo.training.config import PretrainConfig
from hscl_zoo.zoo.cards import render_card
from hscl_zoo.zoo.hub import CONFIG_NAME, WEIGHTS_NAME, load
from hscl_zoo.zoo.saving import PushResult, save_pretrained
from hscl_zoo.zoo.sources import check_repo_id

METRICS_NAME = "metrics.json"
CARD_NAME = "README.md"
CARD_METRICS = ("top1", "top5", "knn_top1")


def expected_negatives_per_anchor(cfg: PretrainConfig, num_classes: int) -> int:
    """The negatives an anchor is expected to meet in a global batch, computed from the batch
    size and the class count, not counted during training: every other image's views for a method
    whose negatives are other images (UCL, H-UCL; exact); for one whose negatives are other labels
    (SCL, H-SCL) the other-label views of a class-balanced batch, (C - 1) / C of them (a real
    batch's count varies with the labels it draws). A memory queue adds its rows once full, in
    the same proportion."""
    others = (cfg.batch_size - 1) * cfg.views + cfg.queue_size
    if cfg.method_spec.negatives == "other-images":
        return others
    return round((cfg.batch_size * cfg.views + cfg.queue_size) * (num_classes - 1) / num_classes)


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
        "expected_negatives_per_anchor": expected_negatives_per_anchor(cfg, num_classes),
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
    _write_atomic(folder / CARD_NAME, render_card(config, results, name=name, repo_id=repo_id,
                                                     evaluation=evaluation))
    metrics = {"evaluation": dict(evaluation), "history": list(history or [])}
    _write_atomic(folder / METRICS_NAME, json.dumps(metrics, indent=2) + "\n")
    return folder


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def rebuild_hub_folder(
    run_or_folder: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    repo_id: str | None = None,
    name: str | None = None,
) -> Path:
    """Check and rewrite the Hub folder of a finished run (its ``hub/``, or that folder itself) into
    ``out`` (default: in place), with the card naming ``repo_id`` and ``name``.

    The weights are loaded back strictly first, so a broken run is refused before anything is
    written. Raises ``FileNotFoundError`` for an unfinished run and ``ValueError`` for a bad
    ``repo_id`` or a folder that does not load, lacks its training summary or lacks its evaluation.
    """
    if repo_id is not None:
        check_repo_id(repo_id, repo_id)
    run = Path(run_or_folder).expanduser()
    source = run if (run / WEIGHTS_NAME).is_file() else run / "hub"
    if not (source / WEIGHTS_NAME).is_file():
        raise FileNotFoundError(
            f"{run} has no finished model ({source / WEIGHTS_NAME} is missing). Finish the run first: "
            f"accelerate launch recipes/pretrain.py --output_dir {run} --resume")
    try:
        model = load(f"local-dir:{source.resolve()}")
    except (ValueError, OSError) as error:
        raise ValueError(f"{source} does not load back strictly, refusing to publish it: {error}") from error
    if not model.training_summary:
        raise ValueError(f"{source / CONFIG_NAME} has no training summary; publish folders written by "
                         "recipes/pretrain.py.")
    try:
        metrics = json.loads((source / METRICS_NAME).read_text())
        evaluation = metrics["evaluation"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{source / METRICS_NAME} is missing or has no 'evaluation' block ({error!r}); "
                         "the run did not finish its linear probe.") from error
    return write_hub_folder(model, source if out is None else out, training=model.training_summary,
                            evaluation=evaluation, history=metrics.get("history"), name=name, repo_id=repo_id)


def push_hub_folder(
    folder: str | os.PathLike[str],
    repo_id: str,
    *,
    private: bool | None = None,
    token: str | None = None,
    commit_message: str | None = None,
) -> PushResult:
    """Upload a folder written by :func:`rebuild_hub_folder` to a Hub model repo (created if
    needed; the token comes from ``token``, ``HF_TOKEN`` or the CLI login)."""
    from huggingface_hub import HfApi

    from hscl_zoo._version import __version__

    check_repo_id(repo_id, repo_id)
    folder = Path(folder)
    api = HfApi(token=token, library_name="hscl_zoo", library_version=__version__)
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    commit = api.upload_folder(repo_id=repo_id, folder_path=folder, repo_type="model",
                               commit_message=commit_message or f"Upload {repo_id} from hscl_zoo")
    return PushResult(repo_id=repo_id, revision=commit.oid, sha256=sha256_file(folder / WEIGHTS_NAME),
                      commit_url=commit.commit_url)
