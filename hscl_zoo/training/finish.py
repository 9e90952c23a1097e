"""The end of a pretraining run: the linear probe and kNN on frozen features, the trained linear
head, linear_eval.json and the Hub-ready folder."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from hscl_zoo.data.datasets import LoadedData
from hscl_zoo.evaluation import evaluate_encoder
from hscl_zoo.models import ContrastiveEncoder
from hscl_zoo.protocol import METRICS, top5_phrase
from hscl_zoo.publishing.hub_folder import training_summary, write_hub_folder
from hscl_zoo.training.config import PretrainConfig
from hscl_zoo.training.monitoring import KnnMonitor, read_metrics

__all__ = ["export_run", "image_caches"]


def export_run(
    cfg: PretrainConfig,
    encoder: ContrastiveEncoder,
    data: LoadedData,
    run_dir: Path,
    device: torch.device,
    *,
    num_processes: int,
    config_path: str | None,
    images: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Probe the trained encoder, fit its linear head, write linear_eval.json and the Hub folder
    (unlabelled data: no probe, an empty evaluation and an untrained one-output head). ``images``:
    the run's uint8 caches of the labelled training rows and the test split, encoded from there
    rather than decoded again (see :func:`hscl_zoo.evaluation.evaluate_encoder`). The result
    adds ``views_per_second_after_epoch1``: the median training throughput of epochs 2 on (epoch 1
    holds compilation, cuDNN's search and the allocator's warm-up; None with one epoch)."""
    evaluation: dict[str, Any] = {}
    training = training_summary(cfg, num_processes, len(data.class_names) or 1, config_path)
    encoder.training_summary = training  # the audit reads the run's temperature and hardening from it
    if data.class_names:
        evaluation = evaluate_encoder(encoder, data, metrics=METRICS, epochs=cfg.probe_epochs, knn_k=cfg.knn_k,
                                      seed=cfg.seed, device=device, images=images, num_workers=cfg.num_workers)
        encoder.classifier.load_state_dict(evaluation.pop("head"))
        (run_dir / "linear_eval.json").write_text(json.dumps(evaluation, indent=2) + "\n")
    history = read_metrics(run_dir / "metrics.jsonl")
    hub_dir = write_hub_folder(encoder, run_dir / "hub", training=training, evaluation=evaluation, history=history)
    later = [h["views_per_second"] for h in history if h["epoch"] >= 2]
    throughput = statistics.median(later) if later else None
    if not evaluation:
        print(f"{cfg.dataset} is unlabelled: no linear probe. Hub-ready folder: {hub_dir}", flush=True)
        return {"hub_dir": str(hub_dir), "views_per_second_after_epoch1": throughput}
    top5 = top5_phrase(evaluation["top5"], len(data.class_names))
    print(
        f"linear-probe top-1 {evaluation['top1']:.2f}%{f' ({top5})' if top5 else ''}, "
        f"kNN top-1 {evaluation['knn_top1']:.2f}% on {cfg.dataset} {data.spec.test_split} "
        f"({len(data.test)} images; fitted on {evaluation['train_images']} labelled training images). "
        f"Hub-ready folder: {hub_dir}"
        + (f". Training throughput from epoch 2: {throughput:,.0f} views/s." if throughput else ""),
        flush=True,
    )
    return {**evaluation, "hub_dir": str(hub_dir), "views_per_second_after_epoch1": throughput}


def image_caches(data: LoadedData, train_set: Dataset, monitor: KnnMonitor | None) -> dict[str, torch.Tensor]:
    """The run's uint8 images that the final evaluation can encode instead of decoding them again:
    the training cache when every training row is labelled (the probe's rows are then its rows),
    and the kNN monitor's test images when they are the whole test split."""
    images = {}
    if getattr(train_set, "images", None) is not None and not data.unlabelled:
        images["train"] = train_set.images
    if monitor is not None and monitor.images is not None and len(monitor.splits[1]) == len(data.test):
        images["test"] = monitor.images[1]
    return images
