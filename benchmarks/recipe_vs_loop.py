"""The recipe's CPU training epoch against a bare PyTorch loop doing the same work (issue 37).

Both run in one process, interleaved in short slices so that a load that comes and goes on a
shared machine weighs on both alike: after one untimed slice of each, every rerun runs one
epoch's worth of steps per side in slices of ``--slice-steps`` steps, ordered recipe, bare, bare,
recipe, recipe, bare, ... A rerun's views/s per side is its views over its seconds, the ratio
recipe / bare is taken within the rerun, and the file has the medians over reruns and every
rerun's slices.

The setting is the issue's: the recipe's own encoder (timm ResNet-18, timm's stem, 32 px) on
5,000 class-balanced CIFAR-10 training images (the recipe's ``--subset 5000``), global batch 256,
2 views, H-SCL(beta) as the recipe configures it, torch threads 2, torchvision transforms in the
main process (num_workers 0), float32.

* recipe: what ``hscl-zoo train`` runs. Its parts come from
  `hscl_zoo.training.setup.prepare_training` (the Accelerate-prepared model, optimizer and seeded
  loader over the per-item seeded `MultiViewDataset`). A slice that starts an epoch does what
  `train_epochs` does before `train_epoch` (set_epoch on loader, views and loss,
  ``model.train()``); every slice is a `train_epoch` call: ``accelerator.backward``, the
  diagnostics every ``diagnostics_every`` steps of the epoch, the progress bar with each step's
  loss, the stop check, the epoch's record. A slice that ends within an epoch stops it as a
  signal does and the next resumes it (`Recipe`): a bar, a meter and a readback of the summed
  loss more per slice than an uninterrupted epoch has, which counts against the recipe.
* bare: the same rows, `simclr_transform`, encoder (built the same way, its own copy) and loss;
  ``torch.optim.Adam`` with the recipe's lr and weight decay; a plain ``DataLoader(shuffle=True,
  drop_last=True)`` over a dataset that decodes a row and transforms it twice; the epoch's mean
  loss read once at its end.

Not counted: what `train_epochs` does after an epoch (the kNN monitor, the metrics line, the
checkpoint), which a bare loop does not do at all; it is timed on its own as
``breakdown.per_epoch_not_counted``. Unless ``--no-breakdown``, the file also has the recipe's
extras per step timed alone and a cProfile of one whole recipe epoch.

    python benchmarks/recipe_vs_loop.py --reruns 7               # writes benchmarks/results/recipe_vs_loop_cpu.json
    python benchmarks/recipe_vs_loop.py --reruns 7 --diagnostics-every 1 --json /tmp/every_step.json
    python benchmarks/recipe_vs_loop.py --dataset digits --subset 64 --batch-size 32 --reruns 1 --no-breakdown --json /tmp/x.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from provenance import command_line, git_commit, machine, utc_now  # benchmarks/, the script's own folder
from recipe_breakdown import per_epoch_extras, per_step_extras, profile_epoch
from recipe_sides import Bare, Recipe

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "cifar10"
RESULT = ROOT / "benchmarks" / "results" / "recipe_vs_loop_cpu.json"


def interleaved(recipe: Recipe, bare: Bare, reruns: int, slice_steps: int) -> list[dict[str, Any]]:
    """Every rerun's slices and views/s per side, and their ratio. After one untimed slice of each,
    a rerun runs an epoch's worth of steps per side in slices of `slice_steps`, ordered recipe,
    bare, bare, recipe, ... (both sides cut their slices at the same steps: their epochs are in
    step)."""
    recipe.run_slice(slice_steps)
    bare.run_slice(slice_steps)
    views_per_step = recipe.cfg.batch_size * recipe.cfg.views
    sides: dict[str, Callable[[int], tuple[float, int]]] = {"recipe": recipe.run_slice, "bare": bare.run_slice}
    rows = []
    for rerun in range(reruns):
        load_before = os.getloadavg()
        done = {"recipe": 0, "bare": 0}
        slices: dict[str, list[tuple[float, int]]] = {"recipe": [], "bare": []}
        order = itertools.cycle(["recipe", "bare", "bare", "recipe"])
        while min(done.values()) < recipe.steps_per_epoch:
            side = next(order)
            if done[side] < recipe.steps_per_epoch:
                seconds, steps = sides[side](min(slice_steps, recipe.steps_per_epoch - done[side]))
                done[side] += steps
                slices[side].append((seconds, steps))
        rate = {side: sum(n for _, n in s) * views_per_step / sum(t for t, _ in s) for side, s in slices.items()}
        row = {"rerun": rerun, "recipe_views_per_s": rate["recipe"], "bare_views_per_s": rate["bare"],
               "ratio": rate["recipe"] / rate["bare"],
               "slices": {side: [[round(t, 3), n] for t, n in s] for side, s in slices.items()},
               "load_average_before": list(load_before), "load_average_after": list(os.getloadavg())}
        print(f"rerun {rerun}: recipe {row['recipe_views_per_s']:.1f} views/s, bare {row['bare_views_per_s']:.1f} "
              f"views/s, ratio {row['ratio']:.3f}", flush=True)
        rows.append(row)
    return rows


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="cifar10")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA), help="parquet folder (cifar10); unused for digits")
    parser.add_argument("--subset", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reruns", type=int, default=7, help="each an epoch's steps per side")
    parser.add_argument("--slice-steps", type=int, default=5, help="steps a side runs before the other's turn")
    parser.add_argument("--repeats", type=int, default=5, help="calls per timing of the breakdown's parts")
    parser.add_argument("--diagnostics-every", type=int, default=None,
                        help="the recipe's diagnostics_every (default: the recipe's own for the CPU)")
    parser.add_argument("--no-breakdown", action="store_true")
    parser.add_argument("--json", default=str(RESULT))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure, print the medians and write the result file (`--json`); returns what it wrote. The
    commit is read when the measurement starts, so that later edits to the checkout do not claim it."""
    args = parse(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*pin_memory.*")
    started, commit = utc_now(), git_commit()
    epochs = args.reruns + 4
    with tempfile.TemporaryDirectory() as out:
        recipe_argv = ["--dataset", args.dataset, "--subset", str(args.subset), "--batch_size", str(args.batch_size),
                       "--epochs", str(epochs), "--num_workers", "0", "--output_dir", out]
        if args.dataset != "digits":
            recipe_argv += ["--data_dir", args.data_dir]
        if args.diagnostics_every is not None:
            recipe_argv += ["--diagnostics_every", str(args.diagnostics_every)]
        recipe = Recipe(recipe_argv)
        bare = Bare(recipe)
        rows = interleaved(recipe, bare, args.reruns, args.slice_steps)
        breakdown = None
        if not args.no_breakdown:
            breakdown = {"profile_of_one_recipe_epoch": profile_epoch(recipe),
                         "per_step": per_step_extras(recipe, args.repeats),
                         "per_epoch_not_counted": per_epoch_extras(recipe, args.repeats)}
    cfg = recipe.cfg
    steps = recipe.steps_per_epoch
    median = {key: statistics.median(r[key] for r in rows) for key in ("recipe_views_per_s", "bare_views_per_s", "ratio")}
    result = {
        "command": command_line(__file__, argv),
        "git_commit": commit,
        "date": started,
        "machine": machine("cpu"),
        "setting": {"dataset": cfg.dataset, "train_images": len(recipe.data.train), "backbone": cfg.backbone,
                    "stem": cfg.stem, "image_size": recipe.image_size, "batch_size": cfg.batch_size, "views": cfg.views,
                    "method": cfg.method, "beta": cfg.beta, "temperature": cfg.temperature, "num_workers": 0,
                    "torch_threads": torch.get_num_threads(), "steps_per_epoch": steps,
                    "diagnostics_every": recipe.plan["diagnostics_every"],
                    "recipe_argv": [a if a != out else "<tmp>" for a in recipe_argv]},
        "method": ("after one untimed slice of each side, each rerun runs an epoch's steps per side in slices of "
                   f"{args.slice_steps} steps ordered recipe, bare, bare, recipe, ...; views/s per side = its views / "
                   "its seconds over the rerun; ratio = recipe / bare within a rerun; medians over reruns. A recipe "
                   "slice ending within an epoch stops train_epoch as a signal does and the next resumes it (carried "
                   "step, loss and diagnostics sums). Not counted: the per-epoch kNN monitor, metrics line and "
                   "checkpoint (breakdown.per_epoch_not_counted)."),
        "reruns": args.reruns, "slice_steps": args.slice_steps,
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
