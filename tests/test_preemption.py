"""Preemption: a real recipe process, a real signal in the middle of an epoch, and --resume.

SIGTERM/SIGUSR1 (a scheduler) and SIGINT (Ctrl-C) finish the step in progress, write a
checkpoint recording the step within the epoch, print how to resume and exit 0 or 130; a second
signal ends the process at once. The resumed run reaches the uninterrupted run's weights exactly
(CPU). Each test starts two or three recipe processes (20-60 s here): marked slow.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from test_pretrain import ENV, RECIPE, ROOT

# 4 steps of 32 images per epoch, 2 epochs
COMMON = ["--subset", "128", "--batch_size", "32", "--epochs", "2", "--probe_epochs", "1", "--monitor_train_size", "64"]


def start(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(RECIPE), *COMMON, "--output_dir", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)


def signal_in_epoch_two(proc: subprocess.Popen, out: Path, *signums: int, pause: float = 0.0) -> tuple[int, str, str]:
    """Send `signums` once epoch 1's checkpoint exists (so the signal lands in epoch 2's steps)."""
    marker = out / "checkpoints" / "epoch_0001" / "state.json"
    deadline = time.time() + 300
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be signalled"
    for signum in signums:
        proc.send_signal(signum)
        time.sleep(pause)
    stdout, stderr = proc.communicate(timeout=300)
    return proc.returncode, stdout, stderr


@pytest.mark.slow
def test_sigterm_mid_epoch_then_resume_equals_the_uninterrupted_run(tmp_path):
    straight = tmp_path / "straight"
    done = subprocess.run([sys.executable, str(RECIPE), *COMMON, "--output_dir", str(straight)],
                          capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    out = tmp_path / "preempted"
    code, stdout, stderr = signal_in_epoch_two(start(out), out, signal.SIGTERM)
    assert code == 0, stderr[-3000:]
    assert "SIGTERM: stopped in epoch 2 after step" in stdout and f"--output_dir {out} --resume" in stdout
    mid = [p.name for p in (out / "checkpoints").iterdir() if "_step_" in p.name]
    assert len(mid) == 1 and mid[0].startswith("epoch_0001_step_"), mid
    step = json.loads((out / "checkpoints" / mid[0] / "state.json").read_text())["step"]
    assert 1 <= step < 4
    assert not (out / "hub").exists() and not (out / "run.lock").exists()

    resumed = subprocess.run([sys.executable, str(RECIPE), "--output_dir", str(out), "--resume"],
                             capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"after epoch 1, step {step} of epoch 2" in resumed.stdout
    a, b = load_file(straight / "hub" / "model.safetensors"), load_file(out / "hub" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert (a[key] == b[key]).all(), key
    losses = lambda p: [json.loads(line)["train_loss"] for line in (p / "metrics.jsonl").read_text().splitlines()]
    assert losses(out) == losses(straight)


@pytest.mark.slow
def test_ctrl_c_checkpoints_and_exits_130_and_a_second_one_exits_at_once(tmp_path):
    out = tmp_path / "once"
    code, stdout, stderr = signal_in_epoch_two(start(out), out, signal.SIGINT)
    assert code == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "--resume" in stdout
    assert any("_step_" in p.name for p in (out / "checkpoints").iterdir())

    out = tmp_path / "twice"
    code, stdout, stderr = signal_in_epoch_two(start(out), out, signal.SIGUSR1, signal.SIGUSR1, pause=0.05)
    assert code == 128 + signal.SIGUSR1, stderr[-3000:]
    assert "stopping now, without a checkpoint" in stderr
    assert not any("_step_" in p.name for p in (out / "checkpoints").iterdir())
    assert not (out / "run.lock").exists()


STOPPER = Path(__file__).with_name("stop_at_step.py")
TINY = ["--backbone", "test_resnet", "--subset", "128", "--batch_size", "32", "--epochs", "2", "--probe_epochs", "1",
        "--monitor_train_size", "64"]  # 4 steps of 32 images per epoch, 2 epochs
STEPS_PER_EPOCH = 4
TIMINGS = {"views_per_second", "epoch_seconds", "wall_seconds", "monitor_seconds"}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)


def records(out: Path) -> list[dict]:
    """metrics.jsonl without its timings (which differ between any two runs)."""
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMINGS} for line in lines]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    done = run(str(RECIPE), *TINY, "--output_dir", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("step", [1, 6, 4, 8], ids=["first-step", "middle-step-last-epoch", "last-step",
                                                    "last-step-last-epoch"])
def test_a_run_stopped_at_any_step_resumes_to_the_uninterrupted_result(uninterrupted, tmp_path, step):
    """SIGTERM during a given step of the run: within an epoch the loop stops after that step; at an
    epoch's last step it ends the epoch (record, checkpoint) first, so no checkpoint is left with
    nothing to resume. Either way --resume finishes the run with the uninterrupted run's weights,
    losses and diagnostics (the resumed epoch's diagnostics cover all its steps)."""
    out = tmp_path / "run"
    stopped = run(str(STOPPER), str(step), *TINY, "--output_dir", str(out))
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    done_epochs, within = divmod(step, STEPS_PER_EPOCH)
    latest = sorted(p.name for p in (out / "checkpoints").iterdir())[-1]
    if within:
        assert f"SIGTERM: stopped in epoch {done_epochs + 1} after step {within};" in stopped.stdout
        assert latest == f"epoch_{done_epochs:04d}_step_{within:06d}"
    else:
        assert f"SIGTERM: stopped after epoch {done_epochs};" in stopped.stdout
        assert latest == f"epoch_{done_epochs:04d}"
    assert not (out / "hub").exists()

    resumed = run(str(RECIPE), "--output_dir", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = load_file(uninterrupted / "hub" / "model.safetensors")
    b = load_file(out / "hub" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)
    assert records(out) == records(uninterrupted)
