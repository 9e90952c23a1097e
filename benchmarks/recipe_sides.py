"""The two sides `recipe_vs_loop.py` times: the recipe's training epoch (`Recipe`) and a bare
PyTorch loop doing the same work (`Bare`), each run slice by slice (see that script's docstring)."""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import datasets
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset

from hscl_zoo.data.transforms import simclr_transform
from hscl_zoo.losses.methods import build_loss
from hscl_zoo.training.epochs import train_epoch
from hscl_zoo.training.setup import build_encoder, load_training_data, make_accelerator, parse_args, prepare_training
from hscl_zoo.training.state import EpochStart, RunState


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


class SliceEnd:
    """Stands in for the run's `StopOnSignal` (one attribute read a step in one process): it asks
    `train_epoch` to stop, as a signal would, once `steps` steps have run."""

    def __init__(self, steps: int) -> None:
        self.left = steps

    def requested(self, accelerator: Accelerator) -> int | None:
        self.left -= 1
        return signal.SIGTERM if self.left <= 0 else None


class Recipe:
    """The recipe's run, set up by its own functions from its own command-line arguments, trained
    slice by slice: a slice that ends within an epoch stops `train_epoch` as a signal does, and the
    next continues the epoch as a resumed run does (its step, summed loss and diagnostics sums
    carried), so every epoch's record covers all its steps as an uninterrupted one's would."""

    def __init__(self, argv: list[str]) -> None:
        cfg, _, _ = parse_args(argv)
        self.accelerator = make_accelerator(cfg)
        self.plan = cfg.device_plan(self.accelerator.device.type, self.accelerator.num_processes)
        self.data, self.cfg = load_training_data(cfg, self.accelerator)
        self.image_size = self.cfg.image_size or self.data.spec.image_size
        self.parts = prepare_training(self.cfg, self.data, self.image_size, self.accelerator, self.plan)
        self.steps_per_epoch = len(self.parts.loader)
        self.epoch, self.position = 0, 0
        self.batches: Iterator | None = None
        self.carried: tuple[float, int] = (0.0, 0)
        self.carried_diagnostics: list[float] | None = None

    def run_slice(self, steps: int) -> tuple[float, int]:
        """(seconds, steps run) of up to `steps` steps, ending early at the epoch's end. A slice
        that starts an epoch first does what `train_epochs` does before `train_epoch` (set_epoch
        on loader, views and loss, ``model.train()``, a fresh pass over the loader)."""
        p, cfg = self.parts, self.cfg
        started = time.perf_counter()
        if self.position == 0:
            self.epoch += 1
            p.loader.set_epoch(self.epoch)
            p.train_set.set_epoch(self.epoch)
            p.loss_fn.set_epoch(self.epoch)
            p.model.train()
            self.batches = iter(p.loader)
        run = RunState(cfg, self.accelerator, p, self.plan, stop=SliceEnd(steps))
        record = train_epoch(run, self.epoch, self.batches,
                             EpochStart(self.position, self.carried[0], self.carried_diagnostics))
        seconds = time.perf_counter() - started
        before = self.position
        if "stopped_by" in record:
            self.position, self.carried = record["step"], (record["loss_sum"], record["step"])
            self.carried_diagnostics = record.get("diagnostics")
            return seconds, self.position - before
        if not math.isfinite(record["train_loss"]):
            raise RuntimeError(f"recipe epoch {self.epoch}: the loss is {record['train_loss']}; the benchmark measures "
                               "a healthy run.")
        self.position, self.carried, self.carried_diagnostics = 0, (0.0, 0), None
        return seconds, self.steps_per_epoch - before


class Bare:
    """The same work in a bare PyTorch loop (see the module docstring), slice by slice."""

    def __init__(self, recipe: Recipe) -> None:
        cfg = recipe.cfg
        torch.manual_seed(cfg.seed)
        self.model = build_encoder(cfg, recipe.data, recipe.image_size).projection_network()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.loss_fn = build_loss(cfg.method, **cfg.loss_kwargs())
        transform = simclr_transform(recipe.image_size, mean=cfg.mean, std=cfg.std)
        self.loader = DataLoader(BareViews(recipe.data.train, transform, cfg.views), batch_size=cfg.batch_size,
                                 shuffle=True, drop_last=True)
        self.batches: Iterator | None = None
        self.position, self.total = 0, torch.zeros(())

    def run_slice(self, steps: int) -> tuple[float, int]:
        """(seconds, steps run) of up to `steps` steps, ending early at the epoch's end, where the
        epoch's mean loss is read."""
        started = time.perf_counter()
        if self.position == 0:
            self.model.train()
            self.batches, self.total = iter(self.loader), torch.zeros(())
        done = 0
        while done < steps and self.position < len(self.loader):
            images, labels = next(self.batches)
            B, V = images.shape[:2]
            z = self.model(images.flatten(0, 1)).view(B, V, -1)
            loss = self.loss_fn(z, labels)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            self.total += loss.detach()
            self.position, done = self.position + 1, done + 1
        if self.position == len(self.loader):
            mean = (self.total / self.position).item()
            if not math.isfinite(mean):
                raise RuntimeError(f"bare epoch: the loss is {mean}; the benchmark measures a healthy run.")
            self.position = 0
        return time.perf_counter() - started, done
