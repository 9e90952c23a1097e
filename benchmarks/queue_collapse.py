"""The first steps of training with and without the labelled memory queue: how close the batch's
embeddings get to each other, step by step.

The study `negatives-cifar10-10k` found that H-SCL(beta) at batch 64 with a 384-row queue collapses
(every embedding onto one direction) while batch 64 alone and batch 256 (the same M = 510, every
negative a live embedding) train well. This script watches where that happens: it runs the study's
setting (its budget's data, backbone, optimiser and seed) for --steps steps per variant, each from
the same initialisation and batch order, and records per step the training loss and the median
cosine between the batch's embeddings of different images (and, with a queue, between the batch
and the queue rows), as the recipe computes them (`hscl_zoo.training.pretrain`).

    python benchmarks/queue_collapse.py --data_dir ../shared/data/cifar10 --threads 1   # about 4 minutes
    python benchmarks/queue_collapse.py --dataset digits --steps 3 --json /tmp/q.json   # a smoke run

Writes benchmarks/results/queue_collapse.json unless --json says otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed

from provenance import command_line, git_commit, machine, utc_now  # benchmarks/, the script's own folder

from hscl_zoo.losses.methods import build_loss
from hscl_zoo.reproduction.budgets import BUDGETS
from hscl_zoo.reproduction.studies import STUDIES
from hscl_zoo.training.setup import (
    build_encoder,
    build_optimizer,
    load_training_data,
    parse_args,
    training_views,
)

STUDY = "negatives-cifar10-10k"
VARIANTS: dict[str, dict[str, Any]] = {
    "batch 64": {"batch_size": 64},
    "batch 64 + 384-row queue": {"batch_size": 64, "queue_size": 384},
    "batch 64 + 128-row queue": {"batch_size": 64, "queue_size": 128},
    "batch 256": {"batch_size": 256},
}
RESULTS = Path(__file__).resolve().parent / "results" / "queue_collapse.json"


def settings(dataset: str | None, data_dir: str | None, overrides: dict[str, Any]) -> list[str]:
    """Command-line keys of the study's budget with the variant's overrides (H-SCL(beta) throughout)."""
    keys = dict(BUDGETS[STUDIES[STUDY].budget].settings, method="hscl-beta", num_workers=0, **overrides)
    if dataset is not None:
        keys = {k: v for k, v in keys.items() if k not in ("subset", "full_test", "mean", "std")} | {"dataset": dataset}
    if data_dir is not None:
        keys["data_dir"] = data_dir
    return [item for k, v in keys.items() if v is not None for item in (f"--{k}", str(v))]


def first_steps(argv: list[str], steps: int) -> list[dict[str, float]]:
    """Train `steps` steps as the recipe does (CPU, no monitor) and record each step."""
    cfg, _, _ = parse_args(argv)
    accelerator = Accelerator(cpu=True)
    data, cfg = load_training_data(cfg, accelerator)
    set_seed(cfg.seed)
    image_size = cfg.image_size or data.spec.image_size
    model = build_encoder(cfg, data, image_size).projection_network()
    train_set, _, loader = training_views(cfg, data, image_size, accelerator, gpu_augment=False, cache_images=False)
    optimizer = build_optimizer(cfg, model.parameters(), fused=False)
    loss_fn = build_loss(cfg.method, **cfg.loss_kwargs())
    loss_fn.set_epoch(1)
    loader.set_epoch(1)
    train_set.set_epoch(1)
    model.train()
    rows = []
    for step, (images, labels, _) in enumerate(loader):
        if step == steps:
            break
        B, V = images.shape[:2]
        queue = loss_fn.queue.rows()[0] if loss_fn.queue is not None and len(loss_fn.queue) else None
        z = model(images.flatten(0, 1)).view(B, V, -1)
        loss = loss_fn(z, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        flat = F.normalize(z.detach().flatten(0, 1), dim=-1)
        image = torch.arange(B).repeat_interleave(V)
        row = {"step": step + 1, "loss": loss.item(),
               "batch_median_cos": (flat @ flat.T)[image[:, None] != image[None, :]].median().item()}
        if queue is not None:
            row["queue_median_cos"] = (flat @ queue.T).median().item()
        rows.append(row)
    if len(rows) < steps:
        raise SystemExit(f"error: one epoch has {len(rows)} steps, fewer than --steps {steps}.")
    return rows


def table(runs: dict[str, list[dict[str, float]]], every: int) -> str:
    names = list(runs)
    lines = ["| step | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]
    for i in range(every - 1, len(runs[names[0]]), every):
        lines.append(f"| {i + 1} | " + " | ".join(f"{runs[n][i]['batch_median_cos']:.3f}" for n in names) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data_dir", default=None, help="local parquet folder of the study's dataset (default: the Hub)")
    p.add_argument("--dataset", default=None, help="another dataset than the study's (e.g. digits for a smoke run)")
    p.add_argument("--steps", type=int, default=35, help="steps per variant, from the first (batch 256 has 39 an epoch)")
    p.add_argument("--every", type=int, default=5, help="table rows every this many steps")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--json", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    command = command_line(__file__, argv)
    commit = git_commit()
    runs = {}
    for name, overrides in VARIANTS.items():
        runs[name] = first_steps(settings(args.dataset, args.data_dir, overrides), args.steps)
        print(f"  done: {name}", file=sys.stderr, flush=True)
    text = table(runs, max(1, min(args.every, args.steps)))
    print("median cosine between the batch's embeddings of different images, H-SCL(beta), step by step\n\n" + text)
    out = {"command": command, "commit": commit, "finished": utc_now(), "machine": machine("cpu"),
           "study": STUDY, "variants": VARIANTS, "steps": runs, "table": text}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
