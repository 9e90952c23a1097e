"""Every command an error message suggests runs as written (issue 57), through the real command line
as a subprocess: the unreadable-image error's ``--skip_unreadable`` on ``train``, ``eval`` and
``embed`` (a plain folder too), ``embed``'s graph error, and the printed summaries of a 3-class
folder, which name no top-5 (it covers every class)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
CLASSES, PER_CLASS = 3, 12


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HSCL_ZOO_CACHE": str(tmp / "cache"), **extra}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hscl_zoo.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def _error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert proc.returncode == 1 and len(lines) == 1, (proc.returncode, proc.stderr[-2000:])
    return lines[0]


@pytest.fixture(scope="module")
def work(tmp_path_factory, digits) -> Path:
    """A folder ``photos/`` of three classes of digit images and one file that is no image, and its copy
    ``others/``."""
    root = tmp_path_factory.mktemp("suggested")
    counts = dict.fromkeys(range(CLASSES), 0)
    for row in digits.train:
        label = row["label"]
        if label in counts and counts[label] < PER_CLASS:
            folder = root / "photos" / f"digit-{label}"
            folder.mkdir(parents=True, exist_ok=True)
            row["image"].save(folder / f"{counts[label]}.png")
            counts[label] += 1
    (root / "photos" / "digit-0" / "broken.png").write_bytes(b"not a png")
    shutil.copytree(root / "photos", root / "others")  # not the run's data: eval does not take the run's options
    return root


@pytest.mark.slow  # a tiny training run and five more commands, each a fresh interpreter: about a minute
def test_the_unreadable_image_errors_suggestion_runs_as_written_on_train_eval_and_embed(work):
    env = _env(work)
    commands = {
        "train": ["train", "--dataset", "imagefolder:photos", "--epochs", "1", "--batch_size", "8", "--backbone",
                  "resnet10t", "--probe_epochs", "2", "--monitor_train_size", "16", "--output_dir", "runs/photos"],
        "eval": ["eval", "runs/photos", "--dataset", "imagefolder:others", "--probe_epochs", "2", "--metrics",
                 "linear,knn"],
        "embed a table": ["embed", "runs/photos", "imagefolder:photos", "--split", "train", "--out", "table.npy"],
        "embed a folder": ["embed", "runs/photos", "photos", "--out", "folder.npy"],
    }
    done = {}
    for name, command in commands.items():
        message = _error_line(_run(command, work, env))
        assert "broken.png" in message, message
        suggested = re.search(r"(--skip_unreadable\S*) on the command line", message)
        assert suggested, message
        proc = _run([*command, *shlex.split(suggested.group(1))], work, env)
        assert proc.returncode == 0, (name, proc.stderr[-2000:])
        done[name] = proc.stdout
    # the run and eval of three classes: top-1 printed, no top-5 (it would cover every class, always 100 %)
    for output in (done["train"], done["eval"]):
        assert "top-1" in output and "top-5" not in output, output[-600:]
    rows = np.load(work / "folder.npy").shape[0]
    assert rows == CLASSES * PER_CLASS, "every readable image of the folder, and the broken file left out"


@pytest.mark.slow  # a one-epoch MUTAG run (about 20 s) and two embeds
def test_embeds_graph_error_suggests_an_embed_command_that_runs(work, tu_root):
    env = _env(work, HSCL_ZOO_TU_ROOT=str(tu_root))
    train = _run(["train", "--dataset", "tu:MUTAG", "--method", "hscl-beta", "--beta", "2", "--epochs", "1",
                  "--folds", "2", "--no_progress", "--output_dir", "runs/mutag"], work, env)
    assert train.returncode == 0, train.stderr[-2000:]
    message = _error_line(_run(["embed", "runs/mutag/hub", "photos", "--out", "graphs.parquet"], work, env))
    assert "--dataset" not in message, "embed has no --dataset"
    suggested = re.search(r"IMAGES: (hscl-zoo embed .*)$", message)
    assert suggested, message
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", suggested.group(1)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and (work / "graphs.parquet").is_file(), proc.stderr[-2000:]


def test_a_summary_names_top5_only_where_it_is_not_every_class():
    from hscl_zoo.protocol import top5_phrase

    assert top5_phrase(91.234, 10) == "top-5 91.23%" and top5_phrase(100.0, 6) == "top-5 100.00%"
    assert top5_phrase(100.0, 5) is None and top5_phrase(100.0, 3) is None


@pytest.mark.slow  # the training stack imported in a fresh interpreter, then a Ctrl-C: about 15 s
def test_ctrl_c_while_the_data_loads_says_there_is_no_run_to_resume(tmp_path):
    """Ctrl-C while the dataset downloads (a Hub that accepts the connection and never answers): the
    hint is true of the folder. Nothing was written, so --resume would be refused; the message says
    to run the command again instead (issue 57: it suggested --resume)."""
    with socket.socket() as hub:
        hub.bind(("127.0.0.1", 0))
        hub.listen()
        hub.settimeout(240)
        env = {k: v for k, v in _env(tmp_path).items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
        env.update(HF_ENDPOINT=f"http://127.0.0.1:{hub.getsockname()[1]}", HF_HOME=str(tmp_path / "hf"))
        proc = subprocess.Popen([sys.executable, "-m", "hscl_zoo.cli", "train", "--dataset", "hf:someone/photos",
                                 "--output_dir", "runs/cut"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        connection, _ = hub.accept()  # the run is reading its data now
        with connection:
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, stderr[-2000:]
    last = stderr.strip().splitlines()[-1]
    assert last == ("interrupted before the run started: runs/cut holds no run to resume; run the same command "
                    "again to start it."), stderr[-2000:]
    assert not (tmp_path / "runs" / "cut").exists() or not any((tmp_path / "runs" / "cut").iterdir())
    resumed = _run(["train", "--output_dir", "runs/cut", "--resume"], tmp_path, _env(tmp_path))
    assert "holds no run" in _error_line(resumed), "--resume is refused, as the message says"


@pytest.mark.slow  # two short digits runs: about a minute
def test_the_home_pages_training_step_runs_after_the_readmes_first_command(tmp_path):
    """docs/index.md's step 2, as written, in a folder where the README's first command already left
    runs/default (issue 57: it was refused, 'runs/default already holds a run')."""
    from test_doc_snippets import blocks_of

    env = _env(tmp_path)
    readme = _run(["train", "--epochs", "1", "--subset", "160", "--batch_size", "16", "--backbone", "resnet10t",
                   "--probe_epochs", "2", "--monitor_train_size", "64"], tmp_path, env)  # the README's run, shortened
    assert readme.returncode == 0 and (tmp_path / "runs" / "default" / "hub").is_dir(), readme.stderr[-2000:]
    step = next(b for b in blocks_of(REPO / "docs" / "index.md") if b.code.startswith("hscl-zoo train"))
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", step.code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_skip_for_missing_data_is_one_short_line_per_dataset():
    """A clone without ../shared/data reads one short reason per dataset (issue 57: one 300-character
    sentence, the same for every dataset)."""
    from helpers import SHARED_DATA, missing_data

    reasons = {name: missing_data(SHARED_DATA / name / "sub") for name in ("cifar10", "cifar100", "tudataset")}
    reasons["all"] = missing_data(SHARED_DATA)
    assert len(set(reasons.values())) == 4 and all(len(r) <= 130 for r in reasons.values()), reasons
    assert "uoft-cs/cifar100 " in reasons["cifar100"] and "TUDataset" in reasons["tudataset"]
