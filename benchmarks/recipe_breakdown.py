"""Where the recipe's time goes, for `recipe_vs_loop.py`: its extras per step timed alone with the
run's own objects, the per-epoch work a bare loop does not do, and a cProfile of one whole epoch."""

from __future__ import annotations

import cProfile
import inspect
import json
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer
from torch.utils.data import default_collate
from torch.utils.data._utils.fetch import _MapDatasetFetcher
from torchvision.transforms import v2
from tqdm.auto import tqdm

from hscl_zoo.data.loaders import make_loader
from hscl_zoo.data.views import MultiViewDataset
from hscl_zoo.losses.diagnostics import DiagnosticsMeter
from hscl_zoo.training.checkpointing import save_checkpoint
from hscl_zoo.training.epochs import train_epoch
from hscl_zoo.training.monitoring import KnnMonitor, diagnostics_meter, reduce_diagnostics
from hscl_zoo.training.preemption import StopOnSignal
from recipe_sides import BareViews, Recipe  # benchmarks/, the script's own folder


def median_of(call: Callable[[], Any], repeats: int) -> float:
    """Median seconds of `repeats` calls after one untimed call."""
    call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def per_step_extras(recipe: Recipe, repeats: int) -> dict[str, float]:
    """Seconds per step of each extra the recipe's step has over the bare one, timed alone with
    the run's own objects (the diagnostics at the recipe's cadence are per update)."""
    cfg, p = recipe.cfg, recipe.parts
    images, labels, _ = default_collate([p.train_set[i] for i in range(cfg.batch_size)])
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


def profile_epoch(recipe: Recipe) -> dict[str, Any]:
    """One whole recipe epoch (the current one finished first, untimed) under cProfile:
    cumulative seconds of `profiled_calls`, the self seconds of all of accelerate's and tqdm's
    Python code, and the top functions by self time (cProfile's own overhead inflates
    Python-heavy parts; the per-step timings are the cleaner measure)."""
    keys = {label: code_key(function) for label, function in profiled_calls(recipe).items()}
    if recipe.position:
        recipe.run_slice(recipe.steps_per_epoch)
    profiler = cProfile.Profile()
    profiler.enable()
    seconds, _ = recipe.run_slice(recipe.steps_per_epoch)
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
