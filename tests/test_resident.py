"""hscl_zoo.data.resident: the training split kept on the device, each batch gathered and augmented
there, and the step that reads nothing back on the host. Runs on the CPU (the CPU is the device)."""

from __future__ import annotations

import json
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.overrides import TorchFunctionMode

from hscl_zoo.data.device_augment import BatchSimCLRAugment
from hscl_zoo.data.loaders import make_loader
from hscl_zoo.data.overlap import OverlappedViews
from hscl_zoo.data.raw_images import RawImageDataset
from hscl_zoo.data.resident import ResidentBatches
from hscl_zoo.data.transforms import simclr_transform
from hscl_zoo.losses.fused import _mask_keys
from hscl_zoo.training import PretrainConfig
from hscl_zoo.training.epochs import NonFiniteLoss, train_epoch, train_step
from hscl_zoo.training.state import RunState, TrainingParts

from test_pretrain import ENV, RECIPE, ROOT

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


@pytest.fixture(scope="module")
def raw(digits):
    return RawImageDataset(digits.train.select(range(100)), cache=True)


def resident(raw, batch_size=16, **kw) -> ResidentBatches:
    return ResidentBatches(raw.images, torch.from_numpy(raw.labels), batch_size, device="cpu", seed=3, **kw)


def test_one_process_gets_the_loaders_batches_bit_for_bit(raw):
    """The DataLoader path (SeededSampler order, collated uint8 batches) is the reference."""
    loader = make_loader(raw, 16, shuffle=True, seed=3, drop_last=True)
    batches = resident(raw)
    assert len(batches) == len(loader) == 6
    for epoch in (1, 2):
        loader.set_epoch(epoch)
        batches.set_epoch(epoch)
        pairs = list(zip(loader, batches, strict=True))
        for (images, labels, index), (r_images, r_labels, r_index) in pairs:
            assert torch.equal(images, r_images) and torch.equal(labels, r_labels) and torch.equal(index, r_index)


def test_processes_share_each_epoch_without_overlap_and_orders_change(raw):
    ranks = [resident(raw, 16, num_processes=3, process_index=k) for k in range(3)]
    seen = []
    for epoch in (1, 2):
        rows = []
        for batches in ranks:
            batches.set_epoch(epoch)
            rows.append(torch.cat([index for _, _, index in batches]))
        joined = torch.cat(rows)
        assert len(ranks[0]) == 2 and joined.numel() == 96 == joined.unique().numel()  # 100 // 48 global batches
        seen.append(rows[0])
    assert not torch.equal(seen[0], seen[1])
    again = resident(raw, 16, num_processes=3, process_index=0)
    again.set_epoch(1)
    assert torch.equal(torch.cat([index for _, _, index in again]), seen[0])


def test_a_pass_resumed_at_a_step_gives_the_rest_of_the_epoch(raw):
    batches = resident(raw)
    batches.set_epoch(4)
    whole = [index for _, _, index in batches]
    batches.set_epoch(4)
    rest = [index for _, _, index in batches.skip_first_batches(4)]
    assert len(rest) == 2 and all(torch.equal(a, b) for a, b in zip(whole[4:], rest, strict=True))
    batches.set_epoch(4)
    assert len(list(batches)) == 6  # the skip held for one pass only


def test_bad_input_is_refused(raw):
    labels = torch.from_numpy(raw.labels)
    with pytest.raises(ValueError, match=r"uint8 tensor of shape \(N, 3, H, W\), got \(100, 3, 16, 16\) torch.float32"):
        ResidentBatches(raw.images.float(), labels, 8, device="cpu")
    with pytest.raises(ValueError, match=r"100 images make no full batch of 64 x 2 processes"):
        ResidentBatches(raw.images, labels, 64, device="cpu", num_processes=2)
    with pytest.raises(ValueError, match=r"labels must have shape \(100,\)"):
        ResidentBatches(raw.images, labels[:5], 8, device="cpu")


def augmenter(device="cpu", seed=5) -> BatchSimCLRAugment:
    return BatchSimCLRAugment.from_transform(simclr_transform(8, mean=MEAN, std=STD), seed=seed,
                                             generator_device=device).to(device)


def epoch_views(raw, epoch: int, device="cpu") -> list[torch.Tensor]:
    batches, augment = resident(raw), augmenter(device)
    batches.set_epoch(epoch)
    augment.set_epoch(epoch)
    return [views for views, _, _ in OverlappedViews(batches, augment, device)]


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", devices())
def test_a_seed_gives_the_same_views_twice_on_one_device_and_epochs_differ(raw, device):
    first, second, other = epoch_views(raw, 1, device), epoch_views(raw, 1, device), epoch_views(raw, 2, device)
    assert len(first) == 6 and all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert not torch.equal(first[0], other[0])


SYNCING = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero",
           "masked_select", "unique", "argwhere"}
"""Tensor operations that make the host wait for the device (a value read back, or an output whose
size depends on values)."""


class HostReads(TorchFunctionMode):
    """Records every syncing operation on a tensor, with the innermost hscl_zoo frame that made it."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[str, str]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        index = args[1] if name == "__getitem__" and len(args) > 1 else None
        keys = index if isinstance(index, tuple) else (index,)
        if name in SYNCING or any(isinstance(k, torch.Tensor) and k.dtype == torch.bool for k in keys):
            ours = [f for f in traceback.extract_stack()[:-1] if "/hscl_zoo/" in f.filename]
            where = f"{Path(ours[-1].filename).name}:{ours[-1].name}" if ours else "test"
            self.reads.append((name, where))
        return func(*args, **(kwargs or {}))


def test_masked_label_keys_read_labels_only_on_the_cpu():
    """The one host read the test below allows: a CPU-only shortcut of the fused loss."""
    with HostReads() as watch:
        _mask_keys(torch.zeros(4, dtype=torch.int64, device="meta"), torch.float32)
    assert watch.reads == []
    with HostReads() as watch:
        _mask_keys(torch.zeros(4, dtype=torch.int64), torch.float32)
    assert watch.reads and {where for _, where in watch.reads} == {"fused.py:_mask_keys"}


@pytest.mark.parametrize("method", ["hscl-beta", "hucl"])
def test_an_epoch_of_device_batches_and_steps_reads_nothing_back(tmp_path, method):
    """The recipe's own parts (prepare_training, device_data on) through train_step: neither the
    data path (gather, parameters, views) nor the step (forward, loss, backward, fused optimiser)
    waits for the device; the loss's checks are deferred to the epoch's end."""
    from accelerate import Accelerator

    from hscl_zoo.data.datasets import load_splits
    from hscl_zoo.training.setup import prepare_training

    cfg = PretrainConfig(method=method, backbone="test_resnet", batch_size=16, subset=64, device_data=True,
                         fused_optimizer=True, diagnostics=False, output_dir=str(tmp_path))
    data = load_splits("digits", None, subset=64, seed=0)
    cfg = PretrainConfig.from_dict({**cfg.to_dict(), "mean": list(data.spec.mean), "std": list(data.spec.std)})
    accelerator = Accelerator(cpu=True)
    parts = prepare_training(cfg, data, 8, accelerator, {"sync_batchnorm": False, "diagnostics_every": 1})
    assert isinstance(parts.loader, ResidentBatches) and parts.augment.generator.device.type == "cpu"
    parts.loader.set_epoch(1)
    parts.augment.set_epoch(1)
    run = RunState(cfg, accelerator, parts)
    with HostReads() as watch:
        for views, labels, _ in OverlappedViews(parts.loader, parts.augment, accelerator.device):
            train_step(run, views, labels)
    allowed = {"fused.py:_mask_keys"}  # CPU only: see the test above
    assert [read for read in watch.reads if read[1] not in allowed] == []


def test_a_non_finite_loss_stops_the_epoch_with_what_to_do(raw):
    cfg = PretrainConfig(backbone="test_resnet", batch_size=16, diagnostics=False, epochs=1)
    from accelerate import Accelerator

    from hscl_zoo.losses.methods import build_loss
    from hscl_zoo.models import create_model

    model = create_model("test_resnet", num_classes=10, image_size=8).projection_network()
    loss_fn = build_loss("scl")
    loss_fn.check_finite = False
    batches, augment = resident(raw), augmenter()
    parts = TrainingParts(None, model, None, augment, batches, lambda x: model(x) * torch.nan,
                          torch.optim.Adam(model.parameters()), loss_fn)
    with pytest.raises(NonFiniteLoss, match=r"^the training loss became nan in epoch 1 \(within its first 6 steps\)"):
        train_epoch(RunState(cfg, Accelerator(cpu=True), parts), 1, batches)


TINY = ["--backbone", "test_resnet", "--subset", "128", "--batch_size", "32", "--epochs", "2", "--probe_epochs", "1",
        "--monitor_train_size", "64"]  # 4 steps of 32 images per epoch, 2 epochs


def recipe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)


@pytest.mark.slow
def test_the_recipe_on_device_data_trains_as_on_the_loader_and_resumes_mid_epoch(tmp_path):
    """On the CPU the resident path gives the DataLoader path's weights to the bit; a run stopped
    by SIGTERM in the middle of epoch 2 resumes to the same weights and records."""
    runs = {}
    for name, flags in (("loader", ["--gpu_augment", "true"]), ("resident", ["--device_data", "true"])):
        runs[name] = tmp_path / name
        done = recipe(str(RECIPE), *TINY, *flags, "--output_dir", str(runs[name]))
        assert done.returncode == 0, done.stderr[-3000:]
    stopped_dir = tmp_path / "stopped"
    stopped = recipe(str(Path(__file__).with_name("stop_at_step.py")), "6", *TINY, "--device_data", "true",
                     "--output_dir", str(stopped_dir))
    assert stopped.returncode == 0 and "SIGTERM: stopped in epoch 2 after step 2;" in stopped.stdout, stopped.stderr[-3000:]
    resumed = recipe(str(RECIPE), "--output_dir", str(stopped_dir), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    weights = {name: load_file(folder / "hub" / "model.safetensors") for name, folder in
               {**runs, "stopped": stopped_dir}.items()}
    for name in ("resident", "stopped"):
        assert weights[name].keys() == weights["loader"].keys()
        assert all(torch.equal(weights[name][k], weights["loader"][k]) for k in weights["loader"]), name
    losses = {name: [json.loads(line)["train_loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
              for name, folder in {**runs, "stopped": stopped_dir}.items()}
    assert losses["resident"] == losses["loader"] == losses["stopped"]


@pytest.mark.slow
def test_compiled_augmentation_kernels_give_the_eager_views(raw):
    """torch.compile (inductor on the CPU) of the views' computation: the same parameters give the
    eager views to 1e-4 (normalised units; fusion reorders float32 sums)."""
    eager, compiled = augmenter(), augmenter().compile_kernels()
    images = raw.images[:32]
    params = eager.sample_params(64, 16, 16)
    expected, got = eager.apply(images, params), compiled.apply(images, params)
    assert compiled._compiled is not None and got.shape == expected.shape == (32, 2, 3, 8, 8)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
