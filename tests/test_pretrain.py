"""recipes/pretrain.py (the loop in hscl_zoo.training.pretrain) end to end: real `accelerate launch`, resume
after a kill, two processes, bad input."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from accelerate.utils import set_seed
from safetensors.torch import load_file

import hscl_zoo
from hscl_zoo.data.datasets import load_splits
from hscl_zoo.data.device_augment import BatchSimCLRAugment
from hscl_zoo.data.loaders import make_loader
from hscl_zoo.data.raw_images import RawImageDataset
from hscl_zoo.data.transforms import simclr_transform
from hscl_zoo.data.views import MultiViewDataset
from hscl_zoo.training import PretrainConfig
from hscl_zoo.training.monitoring import monitor_split

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "pretrain.py"
ACCELERATE = Path(sys.executable).with_name("accelerate")
TINY = ["--subset", "200", "--batch_size", "64", "--probe_epochs", "10", "--monitor_train_size", "200", "--backbone", "resnet10t"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def load_recipe():
    return load_script("recipes", "pretrain")


LAUNCH_ENV = {**ENV, "ACCELERATE_USE_CPU": "1"}


def launch_command(*args, processes=1, machines=("--num_machines", "1")) -> list[str]:
    """`accelerate launch` of the recipe on the CPU (run it with LAUNCH_ENV); several processes
    go through its torchrun launcher (gloo); `machines`: the launcher's --num_machines options."""
    mode = ["--multi_gpu"] if processes > 1 else ["--cpu"]
    return [str(ACCELERATE), "launch", *mode, "--num_processes", str(processes), *machines,
            "--mixed_precision", "no", "--dynamo_backend", "no", str(RECIPE), *args]


def launch(*args, processes=1, timeout=600):
    return subprocess.run(launch_command(*args, processes=processes), capture_output=True, text=True,
                          timeout=timeout, env=LAUNCH_ENV, cwd=ROOT)


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow  # the default recipe on 700 digits for 2 epochs: about a minute
def test_default_under_accelerate_launch_is_well_above_chance(tmp_path):
    out = tmp_path / "run"
    result = launch("--epochs", "2", "--subset", "700", "--probe_epochs", "50", "--output_dir", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(l for l in result.stdout.splitlines() if l.startswith("linear-probe top-1"))
    assert f"Hub-ready folder: {out / 'hub'}" in line
    evaluation = json.loads((out / "linear_eval.json").read_text())
    assert evaluation["top1"] > 40.0, f"chance is 10%: {evaluation['top1']}"
    assert evaluation["protocol"]["report"] == "last epoch"
    history = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [h["epoch"] for h in history] == [1, 2]
    for key in ("train_loss", "knn_top1", "assumption_fraction", "loss_ucl", "loss_scl", "loss_hucl", "loss_hscl"):
        assert all(isinstance(h[key], float) for h in history), key
    saved = json.loads((out / "config.json").read_text())
    assert saved["dataset"] == "digits" and saved["epochs"] == 2
    model = hscl_zoo.load(f"local-dir:{out / 'hub'}")
    assert model.training_summary["method"] == "hscl-beta"
    assert (out / "hub" / "README.md").read_text().startswith("---")


@pytest.mark.slow
def test_resume_after_a_kill_equals_the_uninterrupted_run(tmp_path):
    common = [*TINY, "--epochs", "3", "--method", "hscl-tau"]
    straight = tmp_path / "straight"
    result = subprocess.run([sys.executable, str(RECIPE), *common, "--output_dir", str(straight)],
                            capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]

    broken = tmp_path / "broken"
    proc = subprocess.Popen([sys.executable, str(RECIPE), *common, "--output_dir", str(broken)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, cwd=ROOT)
    marker = broken / "checkpoints" / "epoch_0001" / "state.json"
    deadline = time.time() + 300
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (broken / "hub" / "model.safetensors").exists(), "the run finished before it could be interrupted"

    refused = subprocess.run([sys.executable, str(RECIPE), *common, "--output_dir", str(broken)],
                             capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
    assert refused.returncode != 0 and "--resume" in refused.stderr

    resumed = subprocess.run([sys.executable, str(RECIPE), "--output_dir", str(broken), "--resume"],
                             capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming" in resumed.stdout
    a = load_file(straight / "hub" / "model.safetensors")
    b = load_file(broken / "hub" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert (a[key] == b[key]).all(), key
    lines = lambda p: [json.loads(l)["train_loss"] for l in (p / "metrics.jsonl").read_text().splitlines()]
    assert lines(straight) == lines(broken)


ONE_STEP = ["--subset", "64", "--batch_size", "64", "--epochs", "1", "--probe_epochs", "1", "--monitor_train_size", "64"]


def first_step_inputs(out: Path, processes: int = 1):
    """What the first step of the run in `out` started from, rebuilt in this process from its
    config: (config, the recipe's initial encoder (seeded as the recipe seeds it), per process the
    (views (B, V, C, H, W), labels) it encoded: CPU pipeline or batched augmentation)."""
    hub_config = json.loads((out / "hub" / "config.json").read_text())
    cfg = PretrainConfig.from_dict(json.loads((out / "config.json").read_text()))
    data = load_splits(cfg.dataset, cfg.data_dir, subset=cfg.subset, seed=cfg.seed)
    assert len(data.train) == cfg.batch_size, "one global batch must hold the whole training subset: one step"
    set_seed(cfg.seed)  # as the recipe does right before building the encoder
    encoder = hscl_zoo.ContrastiveEncoder.from_config(hub_config).train()
    transform = simclr_transform(hub_config["model_args"]["image_size"], mean=data.spec.mean, std=data.spec.std)
    pairing = dict(label_positive=cfg.label_positive_pairing, views=cfg.views, seed=cfg.seed)
    dataset = RawImageDataset(data.train, cache=True, **pairing) if cfg.gpu_augment else \
        MultiViewDataset(data.train, transform, **pairing)
    loader = make_loader(dataset, cfg.batch_size // processes, seed=cfg.seed, drop_last=True)
    loader.set_epoch(1)
    batches = []
    for rank, (x, y, _) in enumerate(loader):  # Accelerate gives process r the r-th per-process batch
        if cfg.gpu_augment:
            augment = BatchSimCLRAugment.from_transform(transform, views=cfg.views, seed=cfg.seed)
            augment.set_epoch(1, rank=rank)
            x = augment(x)
        batches.append((x, y))
    assert len(batches) == processes
    return cfg, encoder, batches


def recompute_first_step(out: Path, processes: int = 1) -> tuple[float, float]:
    """The first step's loss of the run in `out`, recomputed in this process (`first_step_inputs`),
    each process's BatchNorm over its own images as in DDP.
    Returns (loss of the global batch, mean of the per-process losses without gathering)."""
    cfg, encoder, batches = first_step_inputs(out, processes)
    loss_fn = hscl_zoo.build_loss(cfg.method, **cfg.loss_kwargs())
    with torch.no_grad():
        z = [encoder.project(x.flatten(0, 1)).view(x.shape[0], x.shape[1], -1) for x, _ in batches]
        labels = [y for _, y in batches]
        global_loss = loss_fn(torch.cat(z), torch.cat(labels)).item()
        local_only = sum(loss_fn(zr, yr).item() for zr, yr in zip(z, labels)) / processes
    return global_loss, local_only


@pytest.mark.slow
def test_two_processes_train_with_global_negatives(tmp_path):
    """One step on 64 images split over two processes: the logged loss is the loss of the 64-image
    global batch. Without gathering, each process would contrast only its own 32 images, which
    gives a clearly different number (checked, so the comparison can tell them apart)."""
    out = tmp_path / "ddp"
    result = launch(*ONE_STEP, "--output_dir", str(out), processes=2)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "hub" / "config.json").read_text())["training"]
    assert summary["num_processes"] == 2 and summary["global_batch_size"] == 64
    history = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(history) == 1 and 0.0 <= history[0]["assumption_fraction"] <= 1.0
    global_loss, local_only = recompute_first_step(out, processes=2)
    assert history[0]["train_loss"] == pytest.approx(global_loss, rel=1e-5)
    assert abs(local_only - global_loss) > 100 * 1e-5 * global_loss


# ---- bad input: a clear message, nothing lost ----

def run_main(recipe, args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        recipe.main(args)
    captured = capsys.readouterr()
    return str(exit_info.value.code) + captured.err


@pytest.fixture(scope="module")
def recipe():
    return load_recipe()


def test_unknown_dataset(recipe, tmp_path, capsys):
    message = run_main(recipe, ["--dataset", "mnist", "--output_dir", str(tmp_path / "r")], capsys)
    assert "unknown dataset 'mnist'" in message and "cifar10" in message


def test_data_dir_without_expected_columns(recipe, tmp_path, capsys):
    import datasets

    bad = tmp_path / "bad"
    bad.mkdir()
    for split in ("train", "test"):
        datasets.Dataset.from_dict({"pixels": [[0, 1]], "target": [0]}).to_parquet(bad / f"{split}-00000-of-00001.parquet")
    message = run_main(recipe, ["--dataset", "cifar10", "--data_dir", str(bad), "--output_dir", str(tmp_path / "r")], capsys)
    assert "img" in message and "pixels" in message


def test_unknown_config_key_lists_valid_ones(recipe, tmp_path, capsys):
    message = run_main(recipe, ["--learning_rate", "0.1", "--output_dir", str(tmp_path / "r")], capsys)
    assert "learning_rate" in message and "Valid keys" in message and "lr" in message


def test_batch_larger_than_dataset(recipe, tmp_path, capsys):
    message = run_main(recipe, ["--subset", "100", "--batch_size", "512", "--output_dir", str(tmp_path / "r")], capsys)
    assert "batch_size 512 is larger than the 100 training images" in message and "--batch_size 100" in message
    assert not (tmp_path / "r").exists()


def test_existing_run_is_refused_and_untouched(recipe, tmp_path, capsys):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"epoch": 1}\n')
    before = snapshot(run)
    message = run_main(recipe, ["--output_dir", str(run)], capsys)
    assert "already holds a run" in message and "--resume" in message and "--overwrite" in message
    assert snapshot(run) == before


def test_resume_with_changed_settings_is_refused(recipe, tmp_path, capsys):
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.json").write_text(PretrainConfig(output_dir=str(run)).to_json())
    message = run_main(recipe, ["--output_dir", str(run), "--resume", "--lr", "0.5"], capsys)
    assert "lr" in message and "saved config" in message


def test_corrupt_checkpoint_on_resume(recipe, tmp_path, capsys):
    run = tmp_path / "r"
    recipe.main([*TINY, "--epochs", "1", "--probe_epochs", "1", "--output_dir", str(run)])
    checkpoint = run / "checkpoints" / "epoch_0001"
    weights = next(checkpoint.glob("*.safetensors"))
    weights.write_bytes(b"not a safetensors file")
    before = snapshot(run)
    message = run_main(recipe, ["--output_dir", str(run), "--resume"], capsys)
    assert "cannot resume from" in message and "epoch_0001" in message and "--overwrite" in message
    assert snapshot(run) == before


def test_fast_path_options_train_like_the_plain_path(recipe, tmp_path):
    """Batched augmentation from a uint8 cache, channels_last and fused Adam (the GPU defaults), on
    the CPU. The batched augmentation draws its random parameters differently from the CPU
    pipeline, so the two paths see different views and their losses differ by augmentation noise
    (no tolerance between them would be tight). Instead each run's logged first-step loss must
    equal the loss recomputed from its own documented views and initial weights, to float32
    rounding (channels_last changes the convolutions' summation order); fused Adam only acts
    after that step (its steps are compared in test_fast_path.py)."""
    runs = {"plain": [], "fast": ["--gpu_augment", "true", "--channels_last", "true", "--fused_optimizer", "true"]}
    losses = {}
    for name, options in runs.items():
        result = recipe.main([*ONE_STEP, "--output_dir", str(tmp_path / name), *options])
        assert Path(result["hub_dir"]) == tmp_path / name / "hub"
        losses[name] = json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])["train_loss"]
        assert losses[name] == pytest.approx(recompute_first_step(tmp_path / name)[0], rel=1e-5), name
    assert json.loads((tmp_path / "fast" / "config.json").read_text())["gpu_augment"] is True
    assert losses["fast"] != pytest.approx(losses["plain"], rel=1e-4), "the fast run must have used its own views"
    # the final evaluation encodes the images a run holds decoded instead of decoding them again: the
    # kNN monitor's test images in both runs, the training cache in the fast run only
    for name, train in (("plain", "decoded images"), ("fast", "image cache")):
        evaluation = json.loads((tmp_path / name / "linear_eval.json").read_text())
        assert evaluation["features_from"] == {"train": train, "test": "image cache"}, name
        assert set(evaluation["seconds"]) == {"features", "linear", "knn", "retrieval", "audit"}


def test_knn_monitor_bank_covers_every_class_of_a_class_sorted_split(shared_data):
    data = hscl_zoo.load_splits("cifar10", shared_data / "cifar10", subset=2000)
    assert data.train["label"][:200] == [0] * 200, "the shared copy is sorted by class"
    cfg = PretrainConfig(dataset="cifar10", monitor_train_size=200)
    bank = monitor_split(data.train, cfg)
    assert len(bank) == 200 and sorted(set(bank["label"])) == list(range(10))
