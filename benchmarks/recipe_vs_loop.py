"""The recipe's CPU training epoch against a bare PyTorch loop doing the same work (issue 37).

Both run in one process, interleaved: each rerun times recipe, bare, bare, recipe epochs (ABBA,
so that a load that drifts during the rerun weighs on both alike), after one untimed epoch of
each. A rerun's views/s per side is its views over its seconds; the ratio recipe / bare is taken
within the rerun, and the file reports the median over reruns and every rerun's numbers.

The setting is the issue's: the recipe's own encoder (timm ResNet-18, timm's stem, 32 px) on
5,000 class-balanced CIFAR-10 training images (the recipe's ``--subset 5000``), global batch 256,
2 views, H-SCL(beta) as the recipe configures it, torch threads 2, torchvision transforms in the
main process (num_workers 0), float32.

* recipe: what ``hscl-zoo train`` runs. The parts come from
  `hscl_zoo.training.setup.prepare_training` (the Accelerate-prepared model, optimizer and seeded
  loader over the per-item seeded `MultiViewDataset`); an epoch is what `train_epochs` does
  around `train_epoch` before its per-epoch work (set_epoch on loader, views and loss,
  ``model.train()``), then `train_epoch` itself: ``accelerator.backward``, the diagnostics every
  ``diagnostics_every`` steps, the progress bar with each step's loss, the stop check, the
  epoch's record.
* bare: the same rows, `simclr_transform`, encoder (built the same way, its own copy) and loss;
  ``torch.optim.Adam`` with the recipe's lr and weight decay; a plain ``DataLoader(shuffle=True,
  drop_last=True)`` over a dataset that decodes a row and transforms it twice; the epoch's mean
  loss read once at its end.

Not counted: what `train_epochs` does after an epoch (the kNN monitor, the metrics line, the
checkpoint), which a bare loop does not do at all; it is timed on its own, once, as
``per_epoch_extras``. ``--breakdown`` (default on) also times the recipe's extras per step in
isolation and profiles one recipe epoch with cProfile, grouped by where the time goes.

    python benchmarks/recipe_vs_loop.py --reruns 7               # writes benchmarks/results/recipe_vs_loop_cpu.json
    python benchmarks/recipe_vs_loop.py --dataset digits --subset 200 --batch-size 32 --reruns 1 --no-breakdown --json /tmp/x.json
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import torch
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.fetch import _MapDatasetFetcher
from torchvision.transforms import v2
from tqdm.auto import tqdm

from hscl_zoo.data.loaders import make_loader
from hscl_zoo.data.transforms import simclr_transform
from hscl_zoo.data.views import MultiViewDataset
from hscl_zoo.losses.diagnostics import DiagnosticsMeter
from hscl_zoo.losses.methods import build_loss
from hscl_zoo.training.checkpointing import save_checkpoint
from hscl_zoo.training.epochs import train_epoch
from hscl_zoo.training.monitoring import KnnMonitor, diagnostics_meter, reduce_diagnostics
from hscl_zoo.training.preemption import StopOnSignal
from hscl_zoo.training.setup import build_encoder, load_training_data, make_accelerator, parse_args, prepare_training
from provenance import command_line, git_commit, machine, utc_now  # benchmarks/, the script's own folder

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "cifar10"
RESULT = ROOT / "benchmarks" / "results" / "recipe_vs_loop_cpu.json"


class BareViews(Dataset):
    """A table's rows as ``views`` augmentations each, drawn from torch's global RNG as a plain
    loop would: one decode per row, no per-item seed, no index returned."""

    def __init__(self, table: datasets.Dataset, transform: Callable[[Any], torch.Tensor], views: int) -> None:
        self.table, self.transform, self.views = table, transform, views

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        row = self.table[index]
        return torch.stack([self.transform(row["image"]) for _ in range(self.views)]), row["label"]


class Recipe:
    """The recipe's run, set up by its own functions from its own command-line arguments."""

    def __init__(self, argv: list[str]) -> None:
        cfg, _, _ = parse_args(argv)
        self.accelerator = make_accelerator(cfg)
        self.plan = cfg.device_plan(self.accelerator.device.type, self.accelerator.num_processes)
        self.data, self.cfg = load_training_data(cfg, self.accelerator)
        self.image_size = self.cfg.image_size or self.data.spec.image_size
        self.parts = prepare_training(self.cfg, self.data, self.image_size, self.accelerator, self.plan)
        self.epoch = 0

    def run_epoch(self, stop: StopOnSignal) -> tuple[float, int]:
        """(seconds, views) of the next epoch as `train_epochs` runs it, up to its per-epoch work."""
        p, cfg = self.parts, self.cfg
        self.epoch += 1
        started = time.perf_counter()
        p.loader.set_epoch(self.epoch)
        p.train_set.set_epoch(self.epoch)
        p.loss_fn.set_epoch(self.epoch)
        p.model.train()
        record = train_epoch(cfg, self.epoch, self.accelerator, p.loader, p.augment, p.forward, p.optimizer, p.loss_fn,
                             channels_last=p.fast["channels_last"], diagnostics_every=self.plan["diagnostics_every"],
                             epoch_steps=len(p.loader), stop=stop)
        seconds = time.perf_counter() - started
        if "stopped_by" in record:
            raise SystemExit(f"stopped by signal {record['stopped_by']}; nothing written.")
        if not record["train_loss"] == record["train_loss"]:
            raise RuntimeError(f"recipe epoch {self.epoch}: the loss is NaN; the benchmark measures a healthy run.")
        return seconds, len(p.loader) * cfg.batch_size * cfg.views


class Bare:
    """The same work in a bare PyTorch loop (see the module docstring)."""

    def __init__(self, recipe: Recipe) -> None:
        cfg = recipe.cfg
        torch.manual_seed(cfg.seed)
        self.model = build_encoder(cfg, recipe.data, recipe.image_size).projection_network()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.loss_fn = build_loss(cfg.method, **cfg.loss_kwargs())
        transform = simclr_transform(recipe.image_size, mean=cfg.mean, std=cfg.std)
        self.loader = DataLoader(BareViews(recipe.data.train, transform, cfg.views), batch_size=cfg.batch_size,
                                 shuffle=True, drop_last=True)

    def run_epoch(self) -> tuple[float, int]:
        """(seconds, views) of one epoch."""
        started = time.perf_counter()
        self.model.train()
        total, steps, views = torch.zeros(()), 0, 0
        for images, labels in self.loader:
            B, V = images.shape[:2]
            z = self.model(images.flatten(0, 1)).view(B, V, -1)
            loss = self.loss_fn(z, labels)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            total += loss.detach()
            steps, views = steps + 1, views + B * V
        if not (total / steps).item() == (total / steps).item():
            raise RuntimeError("bare epoch: the loss is NaN; the benchmark measures a healthy run.")
        return time.perf_counter() - started, views


def median_of(call: Callable[[], Any], repeats: int) -> float:
    """Median seconds of `repeats` calls after one untimed call."""
    call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def interleaved(recipe: Recipe, bare: Bare, reruns: int, pairs: int, stop: StopOnSignal) -> list[dict[str, Any]]:
    """Every rerun's epochs, ABBA ordered, with views/s per side and their ratio."""
    recipe.run_epoch(stop)
    bare.run_epoch()
    rows = []
    for rerun in range(reruns):
        load_before = os.getloadavg()
        slices: dict[str, list[tuple[float, int]]] = {"recipe": [], "bare": []}
        for _ in range(pairs):
            slices["recipe"].append(recipe.run_epoch(stop))
            slices["bare"].append(bare.run_epoch())
            slices["bare"].append(bare.run_epoch())
            slices["recipe"].append(recipe.run_epoch(stop))
        rate = {side: sum(v for _, v in s) / sum(t for t, _ in s) for side, s in slices.items()}
        row = {"rerun": rerun, "recipe_views_per_s": rate["recipe"], "bare_views_per_s": rate["bare"],
               "ratio": rate["recipe"] / rate["bare"],
               "epoch_seconds": {side: [round(t, 3) for t, _ in s] for side, s in slices.items()},
               "load_average_before": list(load_before), "load_average_after": list(os.getloadavg())}
        print(f"rerun {rerun}: recipe {row['recipe_views_per_s']:.1f} views/s, bare {row['bare_views_per_s']:.1f} "
              f"views/s, ratio {row['ratio']:.3f}", flush=True)
        rows.append(row)
    return rows


def per_step_extras(recipe: Recipe, repeats: int) -> dict[str, float]:
    """Seconds per step of each extra the recipe's step has over the bare one, timed alone with
    the run's own objects (the diagnostics at the recipe's cadence are per update)."""
    cfg, p = recipe.cfg, recipe.parts
    images, labels, _ = next(iter(p.loader))
    B, V = images.shape[:2]
    with torch.no_grad():
        z = p.forward(images.flatten(0, 1)).view(B, V, -1)
    meter = diagnostics_meter(cfg, p.loss_fn)
    nothing = lambda image: torch.zeros(())  # noqa: E731  (decode, but no augmentation)
    seeded = MultiViewDataset(recipe.data.train, nothing, views=cfg.views, seed=cfg.seed)
    plain = BareViews(recipe.data.train, nothing, cfg.views)
    rows = range(cfg.batch_size)
    cheap = make_loader(seeded, cfg.batch_size, seed=cfg.seed, drop_last=True)
    prepared = recipe.accelerator.prepare_data_loader(make_loader(seeded, cfg.batch_size, seed=cfg.seed, drop_last=True))
    loss = p.loss_fn(z, labels)
    bar = tqdm(range(1), disable=False, leave=False)
    stop = StopOnSignal()

    def bar_step() -> None:
        bar.set_postfix(loss=f"{loss.item():.4f}")
        stop.requested(recipe.accelerator)

    extras = {
        "diagnostics_update_s": median_of(lambda: meter.update(z.float(), labels), repeats),
        "decode_batch_seeded_views_s": median_of(lambda: [seeded[i] for i in rows], repeats),
        "decode_batch_bare_views_s": median_of(lambda: [plain[i] for i in rows], repeats),
        "loader_epoch_plain_decode_only_s": median_of(lambda: sum(1 for _ in cheap), 1),
        "loader_epoch_accelerate_decode_only_s": median_of(lambda: sum(1 for _ in prepared), 1),
        "bar_loss_item_and_stop_check_s": median_of(bar_step, repeats),
    }
    bar.close()
    return extras


def per_epoch_extras(recipe: Recipe, repeats: int) -> dict[str, float]:
    """Seconds of the per-epoch work `train_epochs` does after an epoch: the kNN monitor (with the
    recipe's monitor settings), the checkpoint (model, optimizer, RNG states), the metrics line."""
    monitor = KnnMonitor(recipe.data, recipe.cfg, recipe.accelerator.device)
    encoder = recipe.parts.encoder
    with tempfile.TemporaryDirectory() as folder:
        run = Path(folder)
        saved = iter(range(1, repeats + 2))
        extras = {
            "knn_monitor_s": median_of(lambda: monitor(encoder), repeats),
            "checkpoint_s": median_of(lambda: save_checkpoint(recipe.accelerator, run, next(saved),
                                                              {"config": recipe.cfg.to_dict()}, keep=2), repeats),
            "metrics_line_s": median_of(lambda: (run / "metrics.jsonl").open("a").write(json.dumps({"x": 1.0}) + "\n"),
                                        repeats),
        }
    extras["knn_monitor_images"] = len(monitor.splits[0]) + len(monitor.splits[1])
    return extras


def profiled_calls(recipe: Recipe) -> dict[str, Callable[..., Any]]:
    """The functions of a recipe epoch whose cumulative time the profile reports."""
    p = recipe.parts
    return {
        "train_epoch (the timed epoch)": train_epoch,
        "model forward": type(recipe.accelerator.unwrap_model(p.model)).forward,
        "loss forward": type(p.loss_fn).forward,
        "Accelerator.backward": Accelerator.backward,
        "torch.autograd.backward (inside it)": torch.autograd.backward,
        "AcceleratedOptimizer.step": AcceleratedOptimizer.step,
        "Adam.step (inside it)": torch.optim.Adam.step,
        "DataLoader fetch (items + collate)": _MapDatasetFetcher.fetch,
        "MultiViewDataset.__getitem__ (decode, seed, augment)": MultiViewDataset.__getitem__,
        "MultiViewDataset._plan (the per-item seed)": MultiViewDataset._plan,
        "augmentation (v2.Compose)": v2.Compose.forward,
        "DiagnosticsMeter.update": DiagnosticsMeter.update,
        "reduce_diagnostics (the epoch's summary)": reduce_diagnostics,
        "tqdm.set_postfix": tqdm.set_postfix,
    }


def code_key(function: Callable[..., Any]) -> tuple[str, int, str]:
    """cProfile's key of a (possibly decorated) Python function."""
    code = inspect.unwrap(function).__code__
    return code.co_filename, code.co_firstlineno, code.co_name


def profile_epoch(recipe: Recipe, stop: StopOnSignal) -> dict[str, Any]:
    """One recipe epoch under cProfile: cumulative seconds of `profiled_calls`, the self seconds
    of all of accelerate's and tqdm's Python code, and the top functions by self time (cProfile's
    own overhead inflates Python-heavy parts; the per-step timings are the cleaner measure)."""
    keys = {label: code_key(function) for label, function in profiled_calls(recipe).items()}
    profiler = cProfile.Profile()
    profiler.enable()
    seconds, _ = recipe.run_epoch(stop)
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    own = {"accelerate": 0.0, "tqdm": 0.0}
    functions = []
    for (file, line, name), (_, _, self_time, _, _) in stats.items():
        for package in own:
            if f"site-packages/{package}/" in file:
                own[package] += self_time
        where = f"{file}:{line}({name})" if file != "~" else name
        functions.append((self_time, where.replace(sys.prefix, "<venv>")))
    functions.sort(reverse=True)
    return {"epoch_seconds_profiled": round(seconds, 3),
            "cumulative_seconds": {label: round(stats[key][3], 3) if key in stats else 0.0 for label, key in keys.items()},
            "python_self_seconds": {k: round(v, 3) for k, v in own.items()},
            "top_functions_self_seconds": [[round(t, 3), where] for t, where in functions[:15]]}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="cifar10")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA), help="parquet folder (cifar10); unused for digits")
    parser.add_argument("--subset", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reruns", type=int, default=7)
    parser.add_argument("--pairs", type=int, default=1, help="ABBA blocks (4 epochs) per rerun")
    parser.add_argument("--repeats", type=int, default=5, help="calls per timing of the breakdown's parts")
    parser.add_argument("--no-breakdown", action="store_true")
    parser.add_argument("--json", default=str(RESULT))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*pin_memory.*")
    started = utc_now()
    epochs = 2 + 4 * args.reruns * args.pairs + 2
    with tempfile.TemporaryDirectory() as out:
        recipe_argv = ["--dataset", args.dataset, "--subset", str(args.subset), "--batch_size", str(args.batch_size),
                       "--epochs", str(epochs), "--num_workers", "0", "--output_dir", out]
        if args.dataset != "digits":
            recipe_argv += ["--data_dir", args.data_dir]
        recipe = Recipe(recipe_argv)
        bare = Bare(recipe)
        with StopOnSignal() as stop:
            rows = interleaved(recipe, bare, args.reruns, args.pairs, stop)
            breakdown = None
            if not args.no_breakdown:
                breakdown = {"per_step": per_step_extras(recipe, args.repeats),
                             "per_epoch_not_counted": per_epoch_extras(recipe, args.repeats),
                             "profile_of_one_recipe_epoch": profile_epoch(recipe, stop)}
    cfg = recipe.cfg
    steps = len(recipe.parts.loader)
    median = {key: statistics.median(r[key] for r in rows) for key in ("recipe_views_per_s", "bare_views_per_s", "ratio")}
    result = {
        "command": command_line(__file__, argv),
        "git_commit": git_commit(),
        "date": started,
        "machine": machine("cpu"),
        "setting": {"dataset": cfg.dataset, "train_images": len(recipe.data.train), "backbone": cfg.backbone,
                    "stem": cfg.stem, "image_size": recipe.image_size, "batch_size": cfg.batch_size, "views": cfg.views,
                    "method": cfg.method, "beta": cfg.beta, "temperature": cfg.temperature, "num_workers": 0,
                    "torch_threads": torch.get_num_threads(), "steps_per_epoch": steps,
                    "diagnostics_every": recipe.plan["diagnostics_every"],
                    "recipe_argv": [a if a != out else "<tmp>" for a in recipe_argv]},
        "method": ("each rerun: recipe, bare, bare, recipe epochs per pair (ABBA) after one untimed epoch of each; "
                   "views/s per side = views / seconds over the rerun; ratio = recipe / bare within a rerun. Not "
                   "counted: the per-epoch kNN monitor, metrics line and checkpoint (breakdown.per_epoch_not_counted)."),
        "reruns": args.reruns, "pairs_per_rerun": args.pairs,
        "median": {k: round(v, 4) for k, v in median.items()},
        "runs": rows,
        "breakdown": breakdown,
    }
    print(f"median over {args.reruns} reruns: recipe {median['recipe_views_per_s']:.1f} views/s, bare "
          f"{median['bare_views_per_s']:.1f} views/s, ratio {median['ratio']:.3f}")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
