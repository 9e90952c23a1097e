"""The recipe on a streamed training split (`--streaming true`): what it refuses, two gloo processes
through `accelerate launch`, and a run stopped mid-epoch that resumes to the uninterrupted weights.
Data: a sample of the real CIFAR-10 parquet in ../shared/data, written in row groups of 64."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from hscl_zoo.training import PretrainConfig
from helpers import missing_data, write_cifar_sample
from test_pretrain import ENV, LAUNCH_ENV, RECIPE, ROOT, launch_command

CIFAR10 = ROOT.parent / "shared" / "data" / "cifar10"
TINY = ["--dataset", "cifar10", "--streaming", "true", "--backbone", "test_resnet", "--batch_size", "64",
        "--probe_epochs", "1", "--stream_eval_examples", "128", "--stream_buffer_size", "256"]


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    """320 training and 100 test rows of CIFAR-10, drawn at random and kept in the file's order."""
    if not CIFAR10.is_dir():
        pytest.skip(missing_data(CIFAR10))
    return write_cifar_sample(CIFAR10, tmp_path_factory.mktemp("cifar10-sample"), {"train": 320, "test": 100})


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=900)


@pytest.mark.parametrize(("setting", "named"), [({"subset": 100}, "subset"), ({"labelled_fraction": 0.5}, "labelled_fraction"),
                                                ({"label_positive_pairing": True}, "label_positive_pairing"),
                                                ({"device_data": True}, "device_data")])
def test_streaming_refuses_what_reads_a_table(setting, named):
    with pytest.raises(ValueError, match=rf"^streaming=true reads the training split as a stream, .* it does not take "
                                         rf"{named}; drop it or drop streaming\.$"):
        PretrainConfig(streaming=True, **setting)


def test_a_stream_without_labels_or_statistics_is_refused_before_anything_is_written(sample, tmp_path):
    unlabelled = tmp_path / "unlabelled"
    unlabelled.mkdir()
    for split in ("train", "test"):
        table = pq.read_table(sample / f"{split}-00000-of-00001.parquet").select(["img"])
        pq.write_table(table, unlabelled / f"{split}-00000-of-00001.parquet")
    out = tmp_path / "run"
    common = ["--dataset", f"parquet:{unlabelled}", "--streaming", "--output_dir", str(out), "--backbone", "test_resnet"]
    refused = run(str(RECIPE), *common, "--method", "scl", "--image_size", "32", "--mean", "[0.5,0.5,0.5]",
                  "--std", "[0.25,0.25,0.25]")
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines()[-1].startswith(f"error: parquet:{unlabelled} has no labels"), refused.stderr
    no_statistics = run(str(RECIPE), *common, "--method", "ucl")
    assert no_statistics.returncode != 0 and no_statistics.stderr.strip().splitlines()[-1] == (
        f"error: parquet:{unlabelled}: a stream of your own data is not scanned for its image size and colour statistics; "
        "pass --image_size, --mean, --std (for example --image_size 32 --mean [0.5,0.5,0.5] --std [0.25,0.25,0.25]).")
    assert not out.exists()


@pytest.mark.slow
def test_two_processes_stream_the_split_through_accelerate_launch(sample, tmp_path):
    out = tmp_path / "run"
    done = subprocess.run(launch_command(*TINY, "--data_dir", str(sample), "--epochs", "2", "--output_dir", str(out),
                                         processes=2), capture_output=True, text=True, env=LAUNCH_ENV, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2] and all(np.isfinite(r["train_loss"]) for r in records)
    evaluation = json.loads((out / "linear_eval.json").read_text())
    assert evaluation["train_images"] == 128 and (out / "hub" / "model.safetensors").is_file()
    assert json.loads((out / "config.json").read_text())["streaming"] is True


@pytest.mark.slow
def test_a_streamed_run_stopped_mid_epoch_resumes_to_the_uninterrupted_weights(sample, tmp_path):
    """5 steps an epoch (320 rows, batch 64); SIGTERM during step 7 (epoch 2, step 2), then --resume."""
    common = [*TINY, "--data_dir", str(sample), "--epochs", "2"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert run(str(RECIPE), *common, "--output_dir", str(straight)).returncode == 0
    halted = run(str(Path(__file__).with_name("stop_at_step.py")), "7", *common, "--output_dir", str(stopped))
    assert halted.returncode == 0 and "SIGTERM: stopped in epoch 2 after step 2;" in halted.stdout, halted.stderr[-3000:]
    position = json.loads((stopped / "checkpoints" / "epoch_0001_step_000002" / "stream_position_0.json").read_text())
    assert position["epoch"] == 2 and position["steps"] == 2 and sum(position["consumed"]) == 128
    resumed = run(str(RECIPE), "--output_dir", str(stopped), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = load_file(straight / "hub" / "model.safetensors"), load_file(stopped / "hub" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)
    losses = [[json.loads(line)["train_loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
              for folder in (straight, stopped)]
    assert losses[0] == losses[1]
