"""Several machines: two `accelerate launch --num_machines 2` launchers of one CPU process each on
localhost (gloo), as two nodes of a cluster run them on a shared file system.

The first step of the two-machine run equals one step of one process on the global batch; a
machine lost in the middle of a run (killed, or hung) ends the other within `dist_timeout`
seconds with one line saying so, and a fresh launch of both with --resume finishes the run. The
SLURM script's launch line checkpoints on a SIGUSR1 sent to all its processes. Each test starts
one to four launchers (25-80 s here): marked slow.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

import hscl_zoo
from hscl_zoo.training.pretrain import lost_process_message

from test_distributed import _free_port
from test_preemption import COMMON
from test_pretrain import LAUNCH_ENV, ONE_STEP, ROOT, first_step_inputs, launch_command

DIST_TIMEOUT = 10  # seconds; the default (1800) would make a hung machine's test wait half an hour
LOST = "error: lost contact with another process of this run"
SLURM_LAUNCH = "trap '' USR1; exec"  # how the SLURM script in docs/safety.md starts each machine's launcher


def start(command: list[str], logs: Path, rank: int = 0) -> subprocess.Popen:
    """Run `command` as machine `rank`, logging to `logs/machine{rank}.out` and `.err`."""
    with (logs / f"machine{rank}.out").open("w") as stdout, (logs / f"machine{rank}.err").open("w") as stderr:
        return subprocess.Popen(command, stdout=stdout, stderr=stderr, env=LAUNCH_ENV, cwd=ROOT)


def start_machines(out: Path, *args: str, logs: Path) -> list[subprocess.Popen]:
    """Two launchers meeting at a free port on localhost."""
    port = str(_free_port())
    return [start(launch_command(*args, "--output_dir", str(out), processes=2,
                                 machines=["--num_machines", "2", "--machine_rank", str(rank),
                                           "--main_process_ip", "127.0.0.1", "--main_process_port", port]),
                  logs, rank)
            for rank in range(2)]


def processes_of(machine: subprocess.Popen) -> list[psutil.Process]:
    """A machine's launcher and its workers (torchrun starts each worker in a session of its own,
    so it outlives a launcher killed alone)."""
    launcher = psutil.Process(machine.pid)
    return [launcher, *launcher.children(recursive=True)]


def end_machines(machines: list[subprocess.Popen]) -> None:
    """Kill whatever is left of the launchers and their workers."""
    for machine in machines:
        if machine.poll() is None:
            for process in processes_of(machine):
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
        machine.wait()


def log(logs: Path, rank: int, stream: str = "err") -> str:
    return (logs / f"machine{rank}.{stream}").read_text()


def finish(machines: list[subprocess.Popen], logs: Path) -> None:
    """Wait for the launchers; every one must exit 0."""
    try:
        codes = [machine.wait(timeout=600) for machine in machines]
    finally:
        end_machines(machines)
    assert codes == [0, 0], log(logs, 0)[-3000:] + log(logs, 1)[-3000:]


LOST_ERRORS = [  # rank 0's errors in these tests' runs when machine 1 was killed or stopped, and NCCL's type
    RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
                 "[127.0.0.1]:41397: Connection reset by peer. This is typically caused by a remote worker hanging "
                 "or bugs in the application."),
    RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] Timed out "
                 "waiting 20000ms for send operation to complete"),
    RuntimeError("Application timeout caused pair closure"),
    torch.distributed.DistBackendError("NCCL communicator was aborted on rank 0."),
]


@pytest.mark.parametrize("error", LOST_ERRORS, ids=["killed", "timed-out", "pair-closed", "nccl"])
def test_a_lost_process_is_reported_in_one_line(error):
    message = lost_process_message(error)
    assert message.startswith(LOST) and "\n" not in message and "--resume" in message
    assert "[/__w" not in message and "typically caused" not in message


def test_other_errors_are_left_alone():
    assert lost_process_message(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)")) is None


def one_sgd_step(out: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The projection network after the first step of the two-process run in `out`, computed in
    this process from the step's inputs (`first_step_inputs`): the loss of the global batch (each
    process's BatchNorm over its own images, as in DDP), its gradient, and SGD's first step by
    hand, w - lr (g + weight_decay w) (the momentum buffer starts as that gradient).

    Returns (the parameters after that step; after the step the processes would take without
    gathering each other's embeddings, DDP averaging their local gradients; the buffers of
    process 0, which writes the Hub folder: BatchNorm statistics of its own images)."""
    cfg, encoder, batches = first_step_inputs(out, processes=2)
    assert cfg.optimizer == "sgd"
    net = encoder.projection_network()
    params = dict(net.named_parameters())
    loss_fn = hscl_zoo.build_loss(cfg.method, **cfg.loss_kwargs())
    z, buffers = [], {}
    for x, _ in batches:
        z.append(net(x.flatten(0, 1)).view(*x.shape[:2], -1))
        buffers = buffers or {name: value.detach().clone() for name, value in net.named_buffers()}
    labels = [y for _, y in batches]
    global_grads = torch.autograd.grad(loss_fn(torch.cat(z), torch.cat(labels)), list(params.values()),
                                       retain_graph=True)
    local_grads = torch.autograd.grad(sum(loss_fn(zr, yr) for zr, yr in zip(z, labels)) / len(batches),
                                      list(params.values()))

    def step(grads: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        return {name: (w - cfg.lr * (g + cfg.weight_decay * w)).detach() for (name, w), g in zip(params.items(), grads)}

    return step(global_grads), step(local_grads), buffers


@pytest.mark.slow
def test_two_machines_first_step_equals_one_process_on_the_global_batch(tmp_path):
    """One step on 64 images, 32 per machine. SGD, whose first step is linear in the gradient
    (Adam's is about lr * sign(gradient), blind to the gradient's size), and a large lr, so that
    the step stands far above float32 rounding. The weights rank 0 exports equal that step on the
    global batch's loss, and differ from the step without gathering."""
    out = tmp_path / "run"
    finish(start_machines(out, *ONE_STEP, "--optimizer", "sgd", "--lr", "0.05", logs=tmp_path), tmp_path)
    assert json.loads((out / "hub" / "config.json").read_text())["training"]["num_processes"] == 2
    assert not (out / "run.lock").exists()
    expected, without_gathering, buffers = one_sgd_step(out)
    hub = load_file(out / "hub" / "model.safetensors")
    for name, value in expected.items():
        torch.testing.assert_close(hub[name], value, rtol=1e-6, atol=1e-7, msg=name)
    for name, value in buffers.items():
        torch.testing.assert_close(hub[name], value, msg=name)
    assert max((hub[name] - value).abs().max().item() for name, value in without_gathering.items()) > 1e-5


def wait_for_epoch_1(out: Path, main: subprocess.Popen, logs: Path) -> None:
    """Return once epoch 1's checkpoint exists (the run is then in epoch 2's steps)."""
    marker = out / "checkpoints" / "epoch_0001" / "state.json"
    deadline = time.monotonic() + 300
    while not marker.exists() and main.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert main.poll() is None, log(logs, 0)[-3000:]


def lose_machine_1(out: Path, signum: int, logs: Path) -> tuple[int, float]:
    """Start a two-machine run (2 epochs of 4 steps), send `signum` to machine 1's launcher and
    worker once epoch 1's checkpoint exists, and return machine 0's exit status and the seconds
    it took to exit after the signal."""
    machines = start_machines(out, *COMMON, "--dist_timeout", str(DIST_TIMEOUT), logs=logs)
    try:
        wait_for_epoch_1(out, machines[0], logs)
        for process in processes_of(machines[1]):
            process.send_signal(signum)
        sent = time.monotonic()
        code = machines[0].wait(timeout=DIST_TIMEOUT + 120)
        return code, time.monotonic() - sent
    finally:
        end_machines(machines)


@pytest.mark.slow
def test_a_killed_machine_ends_the_other_with_one_line_and_resume_finishes(tmp_path):
    out = tmp_path / "run"
    code, seconds = lose_machine_1(out, signal.SIGKILL, tmp_path)
    assert code != 0 and seconds < DIST_TIMEOUT + 60, (code, seconds)
    assert LOST in log(tmp_path, 0) and "--resume" in log(tmp_path, 0)
    assert not (out / "run.lock").exists(), "the main process must release the lock when it fails"
    assert not (out / "hub").exists()

    finish(start_machines(out, "--resume", logs=tmp_path), tmp_path)
    assert f"resuming {out} after epoch 1 (epoch_0001)" in log(tmp_path, 0, "out")
    assert [json.loads(line)["epoch"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert (out / "hub" / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_hung_machine_ends_the_other_after_dist_timeout(tmp_path):
    """A stopped machine keeps its connections open: only the collective operations' timeout ends
    the other one."""
    code, seconds = lose_machine_1(tmp_path / "run", signal.SIGSTOP, tmp_path)
    assert code != 0 and DIST_TIMEOUT - 3 <= seconds < DIST_TIMEOUT + 60, (code, seconds)
    assert LOST in log(tmp_path, 0)


@pytest.mark.slow
def test_the_slurm_launch_line_checkpoints_when_every_process_gets_sigusr1(tmp_path):
    """SLURM's --signal reaches every process of a job step (proctrack/cgroup), the launcher too,
    which dies of SIGUSR1 unless it ignores it: the docs' script launches with `trap '' USR1;
    exec accelerate launch ...`, so that only the training processes, which install their own
    handler, act on it. One machine of two processes: each machine's launcher is the same."""
    assert f'bash -c "{SLURM_LAUNCH} accelerate launch' in (ROOT / "docs" / "safety.md").read_text()
    out = tmp_path / "run"
    launcher = start(["bash", "-c", f'{SLURM_LAUNCH} "$@"', "bash",
                      *launch_command(*COMMON, "--output_dir", str(out), processes=2)], tmp_path)
    try:
        wait_for_epoch_1(out, launcher, tmp_path)
        for process in processes_of(launcher):
            process.send_signal(signal.SIGUSR1)
        code = launcher.wait(timeout=300)
    finally:
        end_machines([launcher])
    assert code == 0, log(tmp_path, 0)[-3000:]
    assert "SIGUSR1: stopped in epoch 2 after step" in log(tmp_path, 0, "out")
    assert [p.name for p in (out / "checkpoints").iterdir() if "_step_" in p.name]
