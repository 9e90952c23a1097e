"""Named reproduction budgets: the settings every run of a budget shares, and each method's own.

A budget is a set of pretraining config keys (see `hscl_zoo.training.config.PretrainConfig`) plus a
sentence saying what it is for. H-SCL(tau)'s threshold schedule is not typed in: it is read from
the negative cosines the SCL run of the same seed measured (`threshold_schedule`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hscl_zoo.data.catalog import get_spec


@dataclass(frozen=True)
class Budget:
    """`evidence`: its runs are evidence about the methods (the model cards of its dataset quote
    them); a smoke or test budget is not."""
    name: str
    description: str
    settings: dict[str, Any] = field(default_factory=dict)
    evidence: bool = False


BUDGETS: dict[str, Budget] = {b.name: b for b in (
    Budget("cpu-cifar10",
           "The smoke budget: 1,500 CIFAR-10 training images (300 test images), 6 epochs, on two CPU cores. Too "
           "small for the methods to separate; it checks the driver end to end in about half an hour.",
           dict(dataset="cifar10", subset=1500, backbone="resnet18", stem="default", epochs=6, batch_size=128,
                probe_epochs=100, knn_k=50, monitor_train_size=1500)),
    Budget("cpu-cifar10-10k",
           "The CPU evidence budget: a class-balanced 10,000-image CIFAR-10 subset, evaluated on the full "
           "10,000-image test split; ResNet-18 with timm's stem (the paper's small stem keeps 16x the positions "
           "per layer at 32 px, too slow for a CPU), batch 256 (M = 510), 15 epochs. The per-epoch kNN monitor "
           "classifies 5,000 balanced test images "
           "from a 5,000-image bank; the final linear probe and kNN use all of both splits.",
           dict(dataset="cifar10", subset=10000, full_test=True, backbone="resnet18", stem="default", epochs=15,
                batch_size=256, probe_epochs=100, knn_k=50, monitor_train_size=5000, monitor_test_size=5000),
           evidence=True),
    Budget("cpu-tinyimagenet-20k",
           "Tiny ImageNet resized to 32 px: 100 training images per class (20,000), the full 10,000-image "
           "validation split as test, 10 epochs; otherwise as cpu-cifar10-10k.",
           dict(dataset="tinyimagenet", subset=20000, full_test=True, image_size=32, backbone="resnet18",
                stem="default", epochs=10, batch_size=256, probe_epochs=100, knn_k=50, monitor_train_size=5000,
                monitor_test_size=5000), evidence=True),
    Budget("cpu-cifar100-10k",
           "CIFAR-100 at the CIFAR-10 evidence budget: a class-balanced 10,000-image subset (100 images per "
           "class), the full 10,000-image test split, ResNet-18 with timm's stem at 32 px, batch 256, 15 epochs. "
           "A batch of 256 holds about 2.6 images of each class, so besides its own second view an anchor's "
           "label positives are the views of the two or three other images of its class in the batch, and "
           "nearly every negative is of another class.",
           dict(dataset="cifar100", subset=10000, full_test=True, backbone="resnet18", stem="default", epochs=15,
                batch_size=256, probe_epochs=100, knn_k=50, monitor_train_size=5000, monitor_test_size=5000),
           evidence=True),
    Budget("gpu-cifar10",
           "One H100/H200: full CIFAR-10, ResNet-18 with the paper's small stem, bf16, batch 512, 30 epochs. The "
           "images are the JPEG (quality 75) re-encoding of CIFAR-10 this project's GPU runs read, not the original "
           "PNGs, so the accuracies are not comparable to the paper's column as benchmark numbers.",
           dict(dataset="cifar10", backbone="resnet18", stem="small", epochs=30, batch_size=512, probe_epochs=100,
                knn_k=200, monitor_train_size=10000, mixed_precision="bf16", num_workers=12), evidence=True),
    Budget("gpu-cifar100",
           "One H100/H200: full CIFAR-100 (50,000 training images of 100 classes, the 10,000-image test split), "
           "ResNet-18 with the paper's small stem, bf16, batch 512, 30 epochs. The images are the "
           "JPEG (quality 75) re-encoding of CIFAR-100 this project's GPU runs read, not the original PNGs, so the "
           "accuracies are not comparable to the paper's column as benchmark numbers.",
           dict(dataset="cifar100", backbone="resnet18", stem="small", epochs=30, batch_size=512, probe_epochs=100,
                knn_k=200, monitor_train_size=10000, mixed_precision="bf16", num_workers=12), evidence=True),
)}
BUDGETS["gpu-cifar100-200ep"] = Budget(
    "gpu-cifar100-200ep",
    "gpu-cifar100 trained longer: the same data, model and settings (ResNet-18 with the paper's small stem, bf16, "
    "batch 512, the JPEG (quality 75) re-encoding of CIFAR-100), for 200 epochs, the paper's count.",
    {**BUDGETS["gpu-cifar100"].settings, "epochs": 200}, evidence=True)
GPU_BUDGETS = ("gpu-cifar100", "gpu-cifar10", "gpu-cifar100-200ep")
"""The budgets trained on a lent GPU (tools/gpu_sprint.sh), each with a ``<name>-rehearsal``
twin at a CPU size that proves its commands first."""
REHEARSAL_IMAGES = 64
for _name in GPU_BUDGETS:
    BUDGETS[f"{_name}-rehearsal"] = Budget(
        f"{_name}-rehearsal",
        f"{_name}'s settings at a CPU size ({REHEARSAL_IMAGES} images, 1 epoch, float32, no workers, the images "
        "kept on the device as on a GPU): "
        "`tools/gpu_sprint.sh --rehearse next` proves the GPU budget's commands before a GPU runs them. Not evidence.",
        {**BUDGETS[_name].settings, "subset": REHEARSAL_IMAGES, "epochs": 1, "batch_size": REHEARSAL_IMAGES // 2,
         "mixed_precision": "no", "num_workers": 0, "probe_epochs": 5, "knn_k": 20, "monitor_train_size": REHEARSAL_IMAGES,
         "device_data": True})

# Within a seed: the headline pair first, and SCL before H-SCL(tau), whose threshold comes from SCL.
RUN_ORDER = ("scl", "hscl-beta", "hucl", "ucl", "hscl-tau")
# The threshold at the first epoch keeps the upper half of SCL's other-label negative cosines at its
# first epoch; the one at the last epoch the upper quarter at its last epoch.
THRESHOLD_START_QUANTILE, THRESHOLD_END_QUANTILE = "neg_cos_q50", "neg_cos_q75"


def threshold_schedule(runs_dir: Path, seed: int) -> dict[str, float]:
    """H-SCL(tau)'s threshold_start / threshold_end at a budget, from the SCL run of the same seed:
    the median other-label negative cosine at its first epoch and the 75th percentile at its last,
    rounded to 0.01, so that the threshold selects a subset rather than all of them: half of SCL's
    negatives early, a quarter late (H-SCL(tau)'s own negatives sit closer to their anchors, so it
    keeps more; each run logs the fraction it kept)."""
    scl_path = runs_dir / f"scl-s{seed}.json"
    if not scl_path.is_file():
        raise ValueError(f"H-SCL(tau) takes its threshold schedule from {scl_path}, which does not exist yet; "
                         "run scl for this seed first (the default method order does).")
    history = json.loads(scl_path.read_text())["history"]
    if THRESHOLD_START_QUANTILE not in history[0]:
        raise ValueError(f"{scl_path} has no negative-cosine quantiles (it predates their logging); re-run that SCL run.")
    return {"threshold_start": round(history[0][THRESHOLD_START_QUANTILE], 2),
            "threshold_end": round(history[-1][THRESHOLD_END_QUANTILE], 2)}


def class_prior(budget: Budget) -> float:
    """H-UCL's debiasing prior tau_plus at a budget: 1 / the number of classes of its dataset, the
    chance that a random other image shares the anchor's class (as in the paper configs)."""
    return 1.0 / get_spec(budget.settings["dataset"]).num_classes


def method_settings(budget: Budget, runs_dir: Path, method: str, seed: int) -> dict[str, Any]:
    """Where one run of a budget departs from the method table's defaults (beta = 1 is the table's,
    the middle of the paper's grid): H-UCL's class prior, H-SCL(tau)'s threshold schedule."""
    if method == "hscl-tau":
        return threshold_schedule(runs_dir, seed)
    if method == "hucl":
        return {"tau_plus": class_prior(budget)}
    return {}


def run_settings(budget: Budget, runs_dir: Path, method: str, seed: int, data_dir: str | None) -> dict[str, Any]:
    """Every pretraining key of one run of `budget`: its settings, the method's own, the seed and
    the local data folder (None: the Hub)."""
    keys = {**budget.settings, **method_settings(budget, runs_dir, method, seed), "method": method, "seed": seed}
    return keys if data_dir is None else {**keys, "data_dir": data_dir}
