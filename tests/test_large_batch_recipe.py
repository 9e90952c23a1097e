"""The pretraining recipe with the gradient cache (`chunk_size`) and the memory queue (`queue_size`):
runs that complete and log, resume with a queue, and the settings it refuses."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hscl_zoo import assumption_fraction, build_loss, lemma_losses
from hscl_zoo.losses.queue import MemoryQueue
from hscl_zoo.publishing.hub_folder import training_summary
from hscl_zoo.training import PretrainConfig
from hscl_zoo.training.steps import check_chunk_size
from test_pretrain import ONE_STEP, first_step_inputs, load_recipe, run_main


@pytest.fixture(scope="module")
def recipe():
    return load_recipe()


def history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_chunked_run_with_device_augmentation_and_channels_last_completes_and_logs(recipe, tmp_path):
    """64 images x 2 views encoded in 4 chunks of 16 images (32 views), from the batched augmentation, channels_last."""
    run = tmp_path / "chunked"
    result = recipe.main([*ONE_STEP, "--output_dir", str(run), "--chunk_size", "16", "--gpu_augment", "true",
                          "--channels_last", "true"])
    assert Path(result["hub_dir"]) == run / "hub"
    (record,) = history(run)
    cfg, encoder, ((x, y),) = first_step_inputs(run)
    with torch.no_grad():  # the step's embeddings: each chunk of 16 images normalised by its own BatchNorm statistics
        z = torch.cat([encoder.project(chunk.flatten(0, 1)) for chunk in x.split(16)]).view(*x.shape[:2], -1)
    assert record["train_loss"] == pytest.approx(build_loss(cfg.method, **cfg.loss_kwargs())(z, y).item(), rel=1e-5)
    assert record["assumption_fraction"] == pytest.approx(assumption_fraction(z, y, temperature=cfg.temperature,
                                                                              beta=cfg.beta), rel=1e-9)
    lemma = lemma_losses(z, y, temperature=cfg.temperature, beta=cfg.beta)
    assert {k: record[f"loss_{k}"] for k in lemma} == pytest.approx(lemma, rel=1e-5)
    assert json.loads((run / "config.json").read_text())["chunk_size"] == 16


def test_chunk_larger_than_the_batch_is_refused(recipe, tmp_path, capsys):
    message = run_main(recipe, [*ONE_STEP, "--output_dir", str(tmp_path / "r"), "--chunk_size", "65"], capsys)
    assert "chunk_size=65" in message and "1..64" in message and "counts the images" in message
    assert not (tmp_path / "r").exists()


def test_chunk_larger_than_one_process_share_is_refused():
    check_chunk_size(32, batch_size=64, views=2, num_processes=2)
    with pytest.raises(ValueError) as refused:
        check_chunk_size(33, batch_size=64, views=2, num_processes=2)
    assert str(refused.value) == (
        "chunk_size=33 exceeds the 32 images each of the 2 process(es) encodes per step (batch_size 64 / 2 "
        "processes, 2 views each): pass chunk_size <= 32 (a divisor of it keeps chunks equal), or unset it, as a "
        "share that fits in one chunk needs no cache.")


@pytest.mark.parametrize("bad, expected", [
    (["--chunk_size", "0"], "chunk_size=0 must lie in 1.."),
    (["--queue_size", "-1"], "queue_size=-1 must be >= 0"),
    (["--queue_size", "64", "--queue_start_epoch", "0"], "queue_start_epoch=0 must be >= 1"),
    (["--queue_size", "64", "--queue_start_epoch", "3"], "comes after the last epoch"),
    (["--queue_positives", "true"], "needs a queue"),
    (["--queue_size", "64", "--queue_positives", "true", "--positives", "views"], "positives='views'"),
    (["--queue_size", "64", "--queue_positives", "true", "--method", "ucl"], "positives='views'"),
])
def test_bad_large_batch_settings_are_refused(recipe, tmp_path, capsys, bad, expected):
    message = run_main(recipe, [*ONE_STEP, "--output_dir", str(tmp_path / "r"), *bad], capsys)
    assert expected in message


QUEUED = ["--subset", "128", "--batch_size", "32", "--epochs", "2", "--probe_epochs", "1", "--monitor_train_size", "64",
          "--queue_size", "96", "--queue_positives", "true"]


@pytest.mark.slow
def test_resume_with_a_queue_reaches_the_uninterrupted_weights(recipe, tmp_path, capsys):
    """A 2-epoch run with a queue (4 steps of 64 embeddings an epoch into 96 rows), resumed from its
    epoch-1 checkpoint, ends at the same weights; resumed with the queue emptied it does not (so
    the saved rows are what carried it), and without the queue file the resume is refused."""
    run = tmp_path / "queued"
    recipe.main([*QUEUED, "--output_dir", str(run)])
    straight = load_file(run / "hub" / "model.safetensors")
    checkpoints = run / "checkpoints"
    shutil.rmtree(checkpoints / "epoch_0002")
    saved = load_file(checkpoints / "epoch_0001" / "queue.safetensors")
    assert saved["position"].tolist() == [256 % 96, 96, 96] and saved["labels"].shape == (96,)

    recipe.main(["--output_dir", str(run), "--resume"])
    assert "resuming" in capsys.readouterr().out
    resumed = load_file(run / "hub" / "model.safetensors")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)

    shutil.rmtree(checkpoints / "epoch_0002")
    save_file(MemoryQueue(96).state_dict(), str(checkpoints / "epoch_0001" / "queue.safetensors"))
    recipe.main(["--output_dir", str(run), "--resume"])
    emptied = load_file(run / "hub" / "model.safetensors")
    assert not all(torch.equal(straight[k], emptied[k]) for k in straight)

    shutil.rmtree(checkpoints / "epoch_0002")
    (checkpoints / "epoch_0001" / "queue.safetensors").unlink()
    message = run_main(recipe, ["--output_dir", str(run), "--resume"], capsys)
    assert "cannot resume from" in message and "queue.safetensors" in message


def test_training_summary_counts_the_queue():
    cfg = PretrainConfig(method="hscl-beta", batch_size=64, queue_size=1024, queue_positives=True)
    summary = training_summary(cfg, num_processes=1, num_classes=4)
    assert summary["expected_negatives_per_anchor"] == round((64 * 2 + 1024) * 3 / 4)
    assert summary["hyperparameters"]["M"] == "global embeddings + queue rows - 2"
    assert summary["hyperparameters"]["queue_size"] == 1024
    ucl = training_summary(PretrainConfig(method="ucl", batch_size=64, queue_size=1024), 1, 4)
    assert ucl["expected_negatives_per_anchor"] == 63 * 2 + 1024
