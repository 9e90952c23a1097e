"""Parity of the device paths with the CPU: losses, batched augmentation, one training step.

The first thing to run on a new GPU (README, "On a GPU"): every check computes the same thing
from the same inputs on the CPU and on ``--device`` and reports the largest difference against
its tolerance; the exit status is 1 if any check fails.

* ``loss/<method>``: each loss's value and input gradient, float32 (B = 256 images x 2 views,
  d = 128, eight classes), and the same call inside bf16 autocast on the device (the losses pin
  float32, so it must agree as closely).
* ``augment``: :class:`hscl_zoo.data.device_augment.BatchSimCLRAugment` views from the same drawn
  parameters, with TF32 switched on process-wide (the augmentation must keep exact float32).
* ``step``: a ResNet-18 (small stem) projection network's loss and gradient norm after one
  forward/backward in training mode. cuDNN convolutions may use TF32 on Ampere and later
  (torch's default), hence the looser tolerance.
* ``kNN``: the kNN evaluation's top-1 on separable random features with the search on the device
  (the recipe's monitor and final evaluation run it there).

    python benchmarks/cuda_parity.py --device cuda --json benchmarks/results/cuda_parity_<gpu>.json
    python benchmarks/cuda_parity.py --device cpu      # runs everywhere; compares the CPU with itself
"""

from __future__ import annotations

import argparse
import json
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import hscl_zoo
from hscl_zoo.data.device_augment import BatchSimCLRAugment
from hscl_zoo.evaluation import knn_top1
from hscl_zoo.losses.methods import LOSS_NAMES

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def relative_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference over the reference's largest magnitude (0 for equal tensors)."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def judge(rows: list[dict[str, Any]]) -> bool:
    """Mark each row ``ok`` when its gap is within its tolerance (a NaN gap is not); True if all are."""
    for row in rows:
        row["ok"] = bool(row["gap"] <= row["tolerance"])
    return all(row["ok"] for row in rows)


def loss_checks(device: torch.device) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(256, 2, 128, generator=gen)
    labels = torch.randint(0, 8, (256,), generator=gen)
    rows = []
    for name in LOSS_NAMES:
        loss_fn = hscl_zoo.build_loss(name, **({"threshold": -0.1} if name == "hscl-tau" else {}))

        def run(on: torch.device, autocast: bool) -> tuple[torch.Tensor, torch.Tensor]:
            x = features.detach().clone().to(on).requires_grad_(True)  # a leaf of its own on every device
            with torch.autocast(on.type, dtype=torch.bfloat16, enabled=autocast):
                loss = loss_fn(x, labels.to(on))
            loss.backward()
            return loss, x.grad

        cpu_loss, cpu_grad = run(torch.device("cpu"), False)
        for autocast in (False, True):
            loss, grad = run(device, autocast)
            rows.append({"check": f"loss/{name}" + (" (bf16 autocast)" if autocast else ""),
                         "gap": max(relative_gap(loss, cpu_loss), relative_gap(grad, cpu_grad)), "tolerance": 1e-4})
    return rows


def augment_check(device: torch.device) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (128, 3, 32, 32), dtype=torch.uint8, generator=gen)
    augment = BatchSimCLRAugment(32, mean=CIFAR_MEAN, std=CIFAR_STD, views=2, seed=0)
    params = augment.sample_params(256, 32, 32)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        on_device = augment.to(device).apply(images.to(device), params)
    finally:
        torch.set_float32_matmul_precision(previous)
    on_cpu = augment.to("cpu").apply(images, params)
    return {"check": "augment (TF32 on process-wide)", "gap": relative_gap(on_device, on_cpu), "tolerance": 1e-5}


def step_check(device: torch.device) -> dict[str, Any]:
    torch.manual_seed(0)
    encoder = hscl_zoo.create_model("resnet18", num_classes=10, image_size=32, small_stem=True)
    gen = torch.Generator().manual_seed(1)
    views = torch.randn(64, 3, 32, 32, generator=gen)
    labels = torch.randint(0, 10, (32,), generator=gen)
    loss_fn = hscl_zoo.build_loss("hscl-beta")

    def run(on: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        model = encoder.projection_network().to(on).train()
        model.zero_grad(set_to_none=True)
        loss = loss_fn(model(views.to(on)).view(32, 2, -1), labels.to(on))
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        return loss, grads

    cpu_loss, cpu_grads = run(torch.device("cpu"))
    loss, grads = run(device)
    return {"check": "step (resnet18 forward + backward)", "gap": max(relative_gap(loss, cpu_loss),
                                                                       relative_gap(grads, cpu_grads)),
            "tolerance": 1e-2}


def knn_check(device: torch.device) -> dict[str, Any]:
    """The kNN evaluation (the monitor and the final one) searching on the device: accuracy in
    points against the CPU's; a near-tie may flip a prediction or two out of 2,000."""
    gen = torch.Generator().manual_seed(2)
    centres = torch.randn(10, 64, generator=gen)
    train_y, test_y = torch.randint(0, 10, (5000,), generator=gen), torch.randint(0, 10, (2000,), generator=gen)
    train_f = centres[train_y] + 2.0 * torch.randn(5000, 64, generator=gen)
    test_f = centres[test_y] + 2.0 * torch.randn(2000, 64, generator=gen)
    on_cpu = knn_top1(train_f, train_y, test_f, test_y, k=50)
    on_device = knn_top1(train_f, train_y, test_f, test_y, k=50, device=device)
    return {"check": "kNN top-1 (points)", "gap": abs(on_device - on_cpu), "tolerance": 0.2}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda was asked for but torch.cuda.is_available() is False.")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    checks: list[Callable[[torch.device], Any]] = [loss_checks, augment_check, step_check, knn_check]
    rows: list[dict[str, Any]] = []
    for check in checks:
        result = check(device)
        rows += result if isinstance(result, list) else [result]
    passed = judge(rows)
    print(f"CPU vs {device} ({name}), torch {torch.__version__}\n")
    print("| check | relative gap | tolerance | ok |\n|---|---:|---:|---|")
    for row in rows:
        print(f"| {row['check']} | {row['gap']:.2e} | {row['tolerance']:.0e} | {'yes' if row['ok'] else 'NO'} |")
    if args.json is not None:
        args.json.write_text(json.dumps({"device": str(device), "device_name": name, "torch": torch.__version__,
                                         "checks": rows}, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
