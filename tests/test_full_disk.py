"""A full disk during a checkpoint, on a real small file system: a tmpfs mounted in a private
mount namespace (`unshare -rm`, no root needed where user namespaces are allowed; skipped where
they are not). Three recipe processes: marked slow."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_pretrain import ENV, RECIPE, ROOT

# resnet10t: a checkpoint of about 58 MB (weights and Adam's two moments)
COMMON = ["--subset", "64", "--batch_size", "32", "--probe_epochs", "1", "--monitor_train_size", "64",
          "--backbone", "resnet10t"]


def in_namespace(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "-rm", "bash", "-c", script], capture_output=True, text=True, env=ENV, cwd=ROOT,
                          timeout=900)


@pytest.fixture(scope="module")
def mountable(tmp_path_factory) -> None:
    probe = tmp_path_factory.mktemp("probe")
    if shutil.which("unshare") is None or in_namespace(f"mount -t tmpfs -o size=1m tmpfs {probe}").returncode:
        pytest.skip("cannot mount a tmpfs in a private mount namespace here (unshare -rm)")


@pytest.mark.slow
def test_a_checkpoint_that_does_not_fit_keeps_the_earlier_ones_and_resume_continues(mountable, tmp_path):
    disk, log = tmp_path / "disk", tmp_path / "log"
    disk.mkdir()
    log.mkdir()
    run = disk / "run"
    recipe = f"{sys.executable} {RECIPE} {' '.join(COMMON)} --output_dir {run}"
    script = f"""
        mount -t tmpfs -o size=24m tmpfs {disk}
        {recipe} --epochs 1 > {log}/small.out 2> {log}/small.err; echo $? > {log}/small.code
        ls -A {run}/checkpoints > {log}/small.ls
        umount {disk}
        mount -t tmpfs -o size=100m tmpfs {disk}
        {recipe} --epochs 2 > {log}/first.out 2> {log}/first.err; echo $? > {log}/first.code
        ls -A {run}/checkpoints > {log}/first.ls
        mount -o remount,size=300m {disk}
        {sys.executable} {RECIPE} --output_dir {run} --resume > {log}/resumed.out 2> {log}/resumed.err
        echo $? > {log}/resumed.code
        ls -A {run}/checkpoints > {log}/resumed.ls
        cat {run}/metrics.jsonl > {log}/metrics
    """
    done = in_namespace(script)
    assert done.returncode == 0, done.stderr[-3000:]
    read = lambda name: (log / name).read_text().strip()

    # a first checkpoint larger than the whole file system: the write fails, its folder goes
    assert read("small.code") == "1", read("small.err")[-3000:]
    last = read("small.err").splitlines()[-1]
    assert last.startswith(f"error: no space left on device at {run / 'checkpoints'}: ") and "MB needed" in last
    assert read("small.ls") == ""

    # the second checkpoint cannot fit beside the first: refused before writing, the first kept
    assert read("first.code") == "1", read("first.err")[-3000:]
    assert "no space left on device" in read("first.err").splitlines()[-1]
    assert read("first.ls").split() == ["epoch_0001"]

    # space freed: --resume continues after epoch 1 and finishes
    assert read("resumed.code") == "0", read("resumed.err")[-3000:]
    assert "resuming" in read("resumed.out") and "after epoch 1" in read("resumed.out")
    assert read("resumed.ls").split() == ["epoch_0001", "epoch_0002"]
    assert [json.loads(line)["epoch"] for line in read("metrics").splitlines()] == [1, 2]
