"""Fine-tuning an encoder into a classifier, driven by Accelerate like pretraining.

`recipes/finetune.py` and `hscl-zoo finetune` run `main`:

    hscl-zoo finetune runs/default/hub --dataset digits --epochs 5
    hscl-zoo finetune hscl-beta-cifar10 --dataset cifar10 --data_dir data/cifar10 --freeze_stages 2
    hscl-zoo finetune runs/default/hub --contrastive_weight 0.5 --method hscl-beta --beta 2
    hscl-zoo finetune runs/default/hub --output_dir runs/ft --resume          # continue an interrupted run

The model is anything `hscl_zoo.load` opens. Its backbone (the first `freeze_stages` of timm's
coarse parameter groups frozen, BatchNorm statistics included: for a ResNet the stem, then
layer1..layer4) and its linear head are trained with cross-entropy on augmented images, plus
`contrastive_weight` times a registered contrastive objective on the projection head's output of
two views (each view is classified too). The learning rate warms up linearly over
`warmup_epochs` and then follows a cosine to 0, set per step from the step number alone, so a
resumed run continues the same curve. The head is kept when the model's classes are the
dataset's, else a new one is trained. After the last epoch (no best-epoch picking) the test split
is classified once, and `<output_dir>/hub` receives the weights and config.json (through
`hscl_zoo.save_pretrained`, with the protocol in its training summary) and metrics.json:
`hscl_zoo.load` opens it as a classifier of the dataset's classes.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed

from hscl_zoo.data.datasets import LoadedData, load_splits
from hscl_zoo.data.loaders import make_loader
from hscl_zoo.data.transforms import simclr_transform
from hscl_zoo.data.views import MultiViewDataset
from hscl_zoo.features import extract_features
from hscl_zoo.losses.methods import METHODS, build_loss, get_method
from hscl_zoo.models import ContrastiveEncoder
from hscl_zoo.probes import topk_accuracy
from hscl_zoo.protocol import top5_phrase
from hscl_zoo.training.checkpointing import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from hscl_zoo.training.epochs import due
from hscl_zoo.training.finetune_model import _Finetuned, classifier_for, freeze_stages, frozen_batchnorm_eval, stage_count
from hscl_zoo.training.setup import build_optimizer, run_contents
from hscl_zoo.zoo.hub import load
from hscl_zoo.zoo.saving import save_pretrained

__all__ = ["main", "finetune", "build_parser", "learning_rate", "default_augmentation", "freeze_stages", "stage_count",
           "classifier_for"]

AUGMENTATIONS: dict[str, dict[str, Any] | None] = {
    "light": {"scale": (0.35, 1.0), "strength": 0.5, "blur": False},
    "none": None,
}
"""`--augmentation` choices: `simclr_transform` with a milder crop and colour jitter and no blur,
or none (the model's own evaluation preprocessing)."""
RESUMABLE_CHANGES = {"num_workers", "checkpoint_every"}
METRICS_NAME = "metrics.json"


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The recipe's options; `--help` lists them with their defaults."""
    p = argparse.ArgumentParser(prog=prog, description="Fine-tune an encoder into a classifier and save it for the Hub.")
    p.add_argument("model", metavar="MODEL", help="a zoo name, hf-hub:owner/name[@revision], local-dir:/path, or a "
                   "folder written by save_pretrained")
    p.add_argument("--dataset", help="a registered dataset or imagefolder:PATH, parquet:PATH, hf:owner/name "
                   "(default: the model's training dataset)")
    p.add_argument("--data_dir", help="local parquet folder of the dataset (default: the Hub)")
    p.add_argument("--subset", type=int, help="class-balanced number of training images (default: all)")
    p.add_argument("--image_size", type=int, help="default: the model's")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch_size", type=int, default=128, help="global, across processes")
    p.add_argument("--optimizer", choices=("adam", "adamw", "sgd"), default="adam")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate, reached after the warm-up")
    p.add_argument("--weight_decay", type=float, default=1e-6)
    p.add_argument("--augmentation", choices=tuple(AUGMENTATIONS),
                   help="light: random crop (area 0.35-1), flip, colour jitter 0.5; none: the eval preprocessing "
                   "(default: light, or none for data whose class a crop or flip changes, such as digits)")
    p.add_argument("--warmup_epochs", type=float, default=1.0, help="linear warm-up, then cosine to 0")
    p.add_argument("--freeze_stages", type=int, default=0,
                   help="leading backbone stages to freeze (timm's coarse groups; a ResNet has 5: stem, layer1-4)")
    p.add_argument("--contrastive_weight", type=float, default=0.0,
                   help="weight of the contrastive term on two views (0: cross-entropy only)")
    p.add_argument("--method", default="scl", help=f"the contrastive term's method: {', '.join(METHODS)}")
    p.add_argument("--temperature", type=float, default=0.5)
    hyperparameters = {h.name: h for spec in METHODS.values() for h in spec.hyperparameters}
    for name, h in hyperparameters.items():
        p.add_argument(f"--{name}", type=float, help=f"{h.doc} (default: the method's)")
    p.add_argument("--mixed_precision", choices=("no", "bf16"), default="no")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num_workers", type=int, default=0)
    p.add_argument("--checkpoint_every", type=int, default=1, help="epochs between checkpoints (and always the last)")
    p.add_argument("--output_dir", default="runs/finetune")
    p.add_argument("--resume", action="store_true", help="continue the run in output_dir from its latest checkpoint")
    p.add_argument("--overwrite", action="store_true", help="delete what output_dir holds and start again")
    return p


def default_augmentation(data: LoadedData) -> str:
    """`--augmentation`'s default for a dataset: light, or none where the dataset table says a crop or a
    flip changes an image's class (the digits), since training on such views teaches wrong labels."""
    return "light" if data.spec.crops_and_flips_keep_class else "none"


def learning_rate(step: int, total_steps: int, warmup_steps: int, peak: float) -> float:
    """The learning rate of (0-based) step `step`: peak * (step + 1) / warmup_steps during the
    warm-up, then peak * (1 + cos(pi * (step - warmup_steps) / (total_steps - warmup_steps))) / 2."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    return peak * 0.5 * (1.0 + math.cos(math.pi * (step - warmup_steps) / max(total_steps - warmup_steps, 1)))


def explicitly_given(argv: list[str], prog: str | None) -> set[str]:
    """The options `argv` sets itself (not left at their defaults)."""
    parser = build_parser(prog)
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))


def resolve_settings(args: argparse.Namespace, given: set[str]) -> dict[str, Any]:
    """The run's settings: the given ones, or on --resume the saved ones (refusing changes)."""
    run_dir = Path(args.output_dir)
    settings = {k: v for k, v in vars(args).items() if k not in ("resume", "overwrite")}
    if args.resume:
        saved_path = run_dir / "finetune_config.json"
        if not saved_path.is_file():
            raise SystemExit(f"error: --resume: {run_dir} holds no fine-tuning run (no finetune_config.json). "
                             "Drop --resume to start one there.")
        saved = json.loads(saved_path.read_text())
        changed = sorted(k for k in given - RESUMABLE_CHANGES - {"output_dir", "resume"} if settings[k] != saved.get(k))
        if changed:
            raise SystemExit(f"error: --resume continues {run_dir} with its saved settings; these differ: "
                             f"{', '.join(f'{k} ({saved.get(k)!r} saved, {settings[k]!r} given)' for k in changed)}. "
                             "Drop them, or start a new run with another --output_dir.")
        return {**saved, **{k: settings[k] for k in given & RESUMABLE_CHANGES}}
    contents = run_contents(run_dir)
    if contents and not args.overwrite:
        raise SystemExit(f"error: output_dir {run_dir} already holds a run ({', '.join(contents)}). Pass --resume to "
                         "continue it, --overwrite to delete it and start again, or choose another --output_dir.")
    return settings


def check_settings(s: dict[str, Any]) -> None:
    """Raise ValueError naming the bad setting and what to pass instead."""
    for key in ("epochs", "batch_size", "checkpoint_every"):
        if s[key] < 1:
            raise ValueError(f"--{key} {s[key]} must be >= 1.")
    if not (s["lr"] > 0 and math.isfinite(s["lr"])):
        raise ValueError(f"--lr {s['lr']} must be a positive number.")
    if not 0 <= s["warmup_epochs"] <= s["epochs"]:
        raise ValueError(f"--warmup_epochs {s['warmup_epochs']} must lie in [0, epochs = {s['epochs']}].")
    if s["freeze_stages"] < 0:
        raise ValueError(f"--freeze_stages {s['freeze_stages']} must be >= 0 (0: fine-tune everything).")
    if not (s["contrastive_weight"] >= 0 and math.isfinite(s["contrastive_weight"])):
        raise ValueError(f"--contrastive_weight {s['contrastive_weight']} must be a finite number >= 0.")
    get_method(s["method"])


def contrastive_loss(s: dict[str, Any]):
    """The contrastive term's loss (None when its weight is 0), with the hyperparameters given."""
    if s["contrastive_weight"] == 0:
        return None
    spec = get_method(s["method"])
    options = {h.name: s[h.name] for h in spec.hyperparameters if s.get(h.name) is not None}
    given = {h.name for spec_ in METHODS.values() for h in spec_.hyperparameters if s.get(h.name) is not None}
    stray = sorted(given - set(options))
    if stray:
        raise ValueError(f"--method {spec.name} does not take {', '.join(stray)}; it takes "
                         f"{', '.join(h.name for h in spec.hyperparameters) or 'no hyperparameter'}.")
    loss = build_loss(spec.name, temperature=s["temperature"], **options)
    loss.equal_batches = True  # the loader drops the last incomplete batch
    return loss


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    """Run the recipe; bad settings, data or checkpoints end it with `error: ...` and exit status 1."""
    try:
        return finetune(sys.argv[1:] if argv is None else argv, prog)
    except (ValueError, OSError, LookupError, CheckpointError) as error:
        raise SystemExit(f"error: {error}") from error


def finetune(argv: list[str], prog: str | None = None) -> dict[str, Any]:
    """Parse `argv`, fine-tune, evaluate and save; returns the evaluation and ``hub_dir`` on the main
    process ({} elsewhere)."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.resume and args.overwrite:
        parser.error("--resume continues a run and --overwrite deletes it: pass one of them.")
    s = resolve_settings(args, explicitly_given(argv, prog))
    check_settings(s)
    loss_fn = contrastive_loss(s)
    run_dir = Path(s["output_dir"])
    accelerator = Accelerator(mixed_precision=s["mixed_precision"], project_dir=str(run_dir),
                              dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=s["seed"]))
    world = accelerator.num_processes
    if s["batch_size"] % world:
        raise ValueError(f"--batch_size {s['batch_size']} is global and must divide evenly over {world} processes.")

    source = load(s["model"])
    training = source.training_summary or {}
    s["dataset"] = s["dataset"] or training.get("dataset")
    if s["dataset"] is None:
        raise ValueError("the model's config names no training dataset: pass --dataset.")
    with accelerator.main_process_first():
        data = load_splits(s["dataset"], s["data_dir"], subset=s["subset"], seed=s["seed"]).labelled()
    if not data.class_names:
        raise ValueError(f"{s['dataset']} has no labels; fine-tuning a classifier needs a labelled dataset.")
    if s["augmentation"] is None:
        s["augmentation"] = default_augmentation(data)
        if s["augmentation"] == "none":
            accelerator.print(f"--augmentation none: a crop or flip changes the class of {s['dataset']}'s images "
                              "(pass --augmentation light to use them anyway)")
    if s["batch_size"] > len(data.train):
        raise ValueError(f"--batch_size {s['batch_size']} is larger than the {len(data.train)} training images of "
                         f"{s['dataset']}: no full batch exists. Pass --batch_size {len(data.train)} or smaller.")
    set_seed(s["seed"])
    encoder, head = classifier_for(source, data.class_names, s["image_size"])
    frozen = freeze_stages(encoder, s["freeze_stages"])
    if loss_fn is None:
        encoder.projector.requires_grad_(False)  # unused without the contrastive term

    if args.overwrite and accelerator.is_main_process and run_dir.exists():
        shutil.rmtree(run_dir)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "finetune_config.json").write_text(json.dumps(s, indent=2) + "\n")

    views = 2 if loss_fn is not None else 1
    size = encoder.model_args["image_size"]
    cfg = encoder.pretrained_cfg
    options = AUGMENTATIONS[s["augmentation"]]
    augmentation = encoder.transform if options is None else simclr_transform(size, mean=cfg["mean"], std=cfg["std"],
                                                                              **options)
    train_set = MultiViewDataset(data.train, augmentation, views=views, seed=s["seed"])
    loader = make_loader(train_set, s["batch_size"] // world, shuffle=True, seed=s["seed"],
                         num_workers=s["num_workers"], drop_last=True, pin_memory=accelerator.device.type == "cuda",
                         persistent_workers=s["num_workers"] > 0)
    model = _Finetuned(encoder)
    optimizer = build_optimizer(argparse.Namespace(**s), [p for p in model.parameters() if p.requires_grad], fused=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps_per_epoch = len(loader)
    total_steps = steps_per_epoch * s["epochs"]
    warmup_steps = round(s["warmup_epochs"] * steps_per_epoch)

    start_epoch = 1
    history: list[dict[str, Any]] = []
    if args.resume and (checkpoint := latest_checkpoint(run_dir)) is not None:
        state = load_checkpoint(accelerator, checkpoint)
        start_epoch, history = state["epoch"] + 1, state["history"]
        accelerator.print(f"resuming {run_dir} after epoch {state['epoch']} ({checkpoint.name})")

    for epoch in range(start_epoch, s["epochs"] + 1):
        loader.set_epoch(epoch)
        train_set.set_epoch(epoch)
        model.train()
        frozen_batchnorm_eval(encoder)
        started, totals = time.perf_counter(), torch.zeros(3, device=accelerator.device)
        for i, (images, labels, _) in enumerate(loader):
            step = (epoch - 1) * steps_per_epoch + i
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, total_steps, warmup_steps, s["lr"])
            B, V = images.shape[:2]
            logits, z = model(images.flatten(0, 1), project=loss_fn is not None)
            ce = F.cross_entropy(logits, labels.repeat_interleave(V))
            loss = ce if loss_fn is None else ce + s["contrastive_weight"] * loss_fn(z.view(B, V, -1), labels)
            optimizer.zero_grad(set_to_none=True)
            accelerator.backward(loss)
            optimizer.step()
            totals += torch.stack([loss.detach(), ce.detach(), torch.ones((), device=totals.device)])
        totals = accelerator.reduce(totals, reduction="mean")
        record = {"epoch": epoch, "train_loss": (totals[0] / totals[2]).item(),
                  "train_cross_entropy": (totals[1] / totals[2]).item(), "lr_last": optimizer.param_groups[0]["lr"],
                  "epoch_seconds": time.perf_counter() - started}
        history.append(record)
        accelerator.print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()))
        if due(epoch, s["checkpoint_every"], s["epochs"]):
            save_checkpoint(accelerator, run_dir, epoch, {"history": history})

    result: dict[str, Any] = {}
    if accelerator.is_main_process:
        protocol = {"augmentation": {"name": s["augmentation"], **(AUGMENTATIONS[s["augmentation"]] or {}),
                                     "views": views}, "head": head, "frozen_parameters": len(frozen),
                    "warmup_steps": warmup_steps, "total_steps": total_steps, "schedule": "linear warm-up, cosine to 0",
                    "selection": "last epoch", "num_processes": world, "source_training": training}
        result = export(encoder, data, s, protocol, history, run_dir, accelerator.device)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return result


def classify(encoder: ContrastiveEncoder, data: LoadedData, device: torch.device) -> dict[str, Any]:
    """Top-1 and top-5 (%, k = min(5, classes)) of the encoder's own classifier on the test split, eval
    preprocessing."""
    encoder.eval()
    logits, labels = extract_features(encoder, data.test, encoder.transform, device=device, progress=False)
    top1, top5 = topk_accuracy(logits, labels, logits.shape[1])
    return {"top1": top1, "top5": top5, "num_classes": logits.shape[1], "test_images": len(data.test),
            "test_split": data.spec.test_split}


def export(encoder: ContrastiveEncoder, data: LoadedData, s: dict[str, Any], protocol: dict[str, Any],
           history: list[dict[str, Any]], run_dir: Path, device: torch.device) -> dict[str, Any]:
    """Classify the test split once and write `<run_dir>/hub`: weights, config.json, metrics.json."""
    evaluation = classify(encoder, data, device)
    training = {
        "dataset": s["dataset"], "method": s["method"] if s["contrastive_weight"] else "cross-entropy",
        "hyperparameters": {h.name: s.get(h.name) for h in get_method(s["method"]).hyperparameters}
        if s["contrastive_weight"] else {},
        "epochs": s["epochs"], "global_batch_size": s["batch_size"], "expected_negatives_per_anchor": None,
        "recipe": "recipes/finetune.py", "finetuned_from": s["model"], "finetune": {**s, **protocol},
    }
    hub_dir = save_pretrained(encoder, run_dir / "hub", training=training)
    (hub_dir / METRICS_NAME).write_text(json.dumps({"evaluation": evaluation, "history": history}, indent=2) + "\n")
    top5 = top5_phrase(evaluation["top5"], evaluation["num_classes"])
    print(f"fine-tuned top-1 {evaluation['top1']:.2f}%{f' ({top5})' if top5 else ''} on {s['dataset']} "
          f"{evaluation['test_split']} ({evaluation['test_images']} images), last epoch. Hub-ready folder: {hub_dir}",
          flush=True)
    return {**evaluation, "hub_dir": str(hub_dir)}
