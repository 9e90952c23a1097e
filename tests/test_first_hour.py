"""A user's first hour (issue 41): each error names the next step, and that step works.

Run folders load with ``local-dir:``, an unpublished name says the one command to run, a dataset
that cannot be read offline is reported at once with its download command and ``--data_dir``,
``list --published`` answers an empty list, ``train --help`` documents every key, the progress
bar shows each step's loss, and a local run's card names no path and claims no publication.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import hscl_zoo
from hscl_zoo.cli import build_parser, main
from hscl_zoo.config_help import build_train_parser, config_keys
from hscl_zoo.data.hub_reach import DatasetUnavailableError, check_hub_dataset, hub_reachable
from hscl_zoo.training.config import PretrainConfig
from hscl_zoo.training.finetune import build_parser as finetune_parser
from hscl_zoo.training.pretrain import parse_args
from hscl_zoo.zoo import registry
from hscl_zoo.zoo.cards import render_card
from hscl_zoo.zoo.hub import WeightsNotPublishedError

REPO = Path(__file__).resolve().parents[1]
TRAINING = {"dataset": "digits", "method": "scl", "hyperparameters": {"temperature": 0.5}, "epochs": 1,
            "global_batch_size": 8, "expected_negatives_per_anchor": 14}


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    """A finished run's output_dir: its model in hub/, beside the run's own files."""
    run = tmp_path_factory.mktemp("runs") / "my-run"
    torch.manual_seed(0)
    model = hscl_zoo.create_model("resnet10t", num_classes=10, image_size=16)
    model.eval().save_pretrained(run / "hub", training=TRAINING)
    (run / "metrics.jsonl").write_text("{}\n")
    (run / "config.json").write_text(PretrainConfig().to_json())
    return run


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ---- loading ------------------------------------------------------------------------------


def test_local_dir_of_a_run_folder_loads_its_hub_model(run_folder):
    expected = hscl_zoo.load(run_folder / "hub").state_dict()
    for source in (f"local-dir:{run_folder}", str(run_folder), run_folder):
        state = hscl_zoo.load(source).state_dict()
        assert state.keys() == expected.keys()
        assert all(torch.equal(state[k], expected[k]) for k in expected)


def test_a_folder_without_a_model_says_where_the_model_is(tmp_path, run_folder):
    unfinished = tmp_path / "unfinished"
    (unfinished / "checkpoints").mkdir(parents=True)
    (unfinished / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(FileNotFoundError) as err:
        hscl_zoo.load(f"local-dir:{unfinished}")
    assert f"writes its model to {unfinished / 'hub'}" in str(err.value) and "--resume" in str(err.value)

    parent = run_folder.parent
    with pytest.raises(FileNotFoundError) as err:
        hscl_zoo.load(f"local-dir:{parent}")
    assert f"Model folders inside it: {run_folder / 'hub'}" not in str(err.value)  # two levels down: not guessed
    models = tmp_path / "models"
    hscl_zoo.load(run_folder).save_pretrained(models / "a")
    with pytest.raises(FileNotFoundError) as err:
        hscl_zoo.load(models)
    assert f"Model folders inside it: {models / 'a'}" in str(err.value)


def test_unpublished_name_gives_one_line_whose_command_makes_what_it_loads():
    with pytest.raises(WeightsNotPublishedError) as err:
        hscl_zoo.load("hscl-beta-tinyimagenet")  # no tag of it is published
    message = str(err.value)
    assert "\n" not in message
    command = re.search(r"'(hscl-zoo train [^']+)'", message).group(1)
    source = re.search(r"hscl_zoo\.load\('local-dir:([^']+)'\)", message).group(1)
    argv = shlex.split(command)
    assert argv[:2] == ["hscl-zoo", "train"]
    cfg, _, _ = parse_args(argv[2:])
    assert (cfg.method, cfg.dataset) == ("hscl-beta", "tinyimagenet")
    assert Path(cfg.output_dir) == Path(source), "the command must write where the load reads"


# ---- data that cannot be read -------------------------------------------------------------


def test_hub_reachable_tells_a_listening_port_from_a_closed_one(monkeypatch):
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert hub_reachable()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    assert not hub_reachable()


def test_an_unreachable_hub_is_reported_at_once(monkeypatch, tmp_path):
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy",
                 "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    started = time.perf_counter()
    with pytest.raises(DatasetUnavailableError) as err:
        check_hub_dataset("stl10", "tanganke/stl10-not-cached-anywhere")
    print(f"reported after {time.perf_counter() - started:.3f} s")
    assert "the Hub cannot be reached" in str(err.value)
    assert "--local-dir data/stl10' and pass '--data_dir data/stl10'" in str(err.value)


@pytest.mark.slow  # the whole training stack imported in a fresh interpreter: 11 s
def test_offline_train_names_the_dataset_its_download_and_data_dir(tmp_path):
    """What `hscl-zoo info` tells a user to run, offline: one line, no traceback, nothing written."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(REPO)}
    env.pop("HF_DATASETS_CACHE", None), env.pop("HF_HUB_CACHE", None), env.pop("HF_DATASETS_OFFLINE", None)
    out = tmp_path / "run"
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "hscl_zoo.cli", "train", "--config", "hscl-beta-cifar100",
                           "--output_dir", str(out)], env=env, capture_output=True, text=True, timeout=300)
    print(f"exit {proc.returncode} after {time.perf_counter() - started:.1f} s (imports included)")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "Retrying" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "the cifar100 dataset" in lines[0] and "offline mode is on" in lines[0]
    assert "hf download uoft-cs/cifar100 --repo-type dataset --local-dir data/cifar100" in lines[0]
    assert "--data_dir data/cifar100" in lines[0]
    assert not out.exists()


# ---- the command line ---------------------------------------------------------------------


def test_list_published_with_nothing_published_is_an_empty_answer(capsys):
    pattern = "ucl-cifar100*"
    assert hscl_zoo.list_models(pattern), "the pattern names zoo entries"
    assert not any(name.startswith("ucl-cifar100") for name in registry._RELEASES), "pick a pattern with no release"
    assert hscl_zoo.list_models(pattern, published_only=True) == []
    assert main(["list", pattern, "--published"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["list", "nothing-like-this*"]) == 1, "a pattern that names nothing is still an error"


def test_train_help_lists_every_key_with_type_default_and_meaning(capsys):
    with pytest.raises(SystemExit) as done:
        main(["train", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    source = (REPO / "hscl_zoo" / "training" / "config.py").read_text()
    for field in dataclasses.fields(PretrainConfig):
        line = next(line for line in source.splitlines() if re.match(rf"\s+{field.name}: ", line))
        meaning = line.partition("  # ")[2].strip()
        default = field.default
        shown = "null" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
        entry = re.search(rf"^  --{field.name} \S+  \(([^;]+); default: (.*)\)\n      (.*)$", text, re.MULTILINE)
        assert entry is not None, f"--{field.name} missing from train --help"
        assert entry.group(2) == shown and entry.group(3) == meaning
        allowed = "null" if "None" in str(field.type) else None
        assert (allowed in entry.group(1)) if allowed else "null" not in entry.group(1)
    assert len(config_keys()) == len(dataclasses.fields(PretrainConfig))


def test_train_help_loads_no_torch():
    code = ("import sys, contextlib, io\nfrom hscl_zoo.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit): main(['train', '--help'])\n"
            "print(sorted(m for m in ('torch', 'timm', 'accelerate', 'datasets') if m in sys.modules))")
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    print(f"train --help in {time.perf_counter() - started:.2f} s (interpreter start included)")
    assert out.strip() == "[]"


def test_top_level_help_is_plain_text_for_wheel_users():
    text = build_parser().format_help()
    assert "``" not in text and "recipes/" not in text
    for command in ("list", "info", "train", "finetune", "eval", "embed", "export"):
        assert f"hscl-zoo {command}" in text, f"no example of {command}"


# ---- training output ----------------------------------------------------------------------


def test_progress_bar_shows_each_steps_loss_and_the_card_claims_no_publication(tmp_path, capsys):
    from hscl_zoo.training.pretrain import pretrain

    run = tmp_path / "run"
    pretrain(["--subset", "160", "--batch_size", "16", "--epochs", "1", "--probe_epochs", "1", "--backbone",
              "resnet10t", "--monitor_train_size", "64", "--diagnostics", "false", "--output_dir", str(run)])
    captured = capsys.readouterr()
    shown = re.findall(r"loss=([0-9.]+)", captured.err)
    assert len(set(shown)) >= 6, f"the bar showed {sorted(set(shown))} over 10 steps"
    (record,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # the epoch's console line: its loss, views/s and kNN top-1 only; metrics.jsonl keeps every field
    assert (f"epoch 1/1  loss {record['train_loss']:.4f}  {record['views_per_second']:,.0f} views/s  "
            f"kNN top-1 {record['knn_top1']:.2f} %\n") in captured.out
    assert "=" not in "".join(line for line in captured.out.splitlines() if line.startswith("epoch "))
    from hscl_zoo.training.epochs import epoch_line

    assert all(f"{key}=" in epoch_line(record, 1, verbose=True) for key in record)  # --verbose true: all of it

    card = (run / "hub" / "README.md").read_text()
    header = yaml.safe_load(card.split("---")[1])
    assert "datasets" not in header, "digits is not a Hub dataset"
    assert "published at" not in card and "not been published" in card
    assert str(tmp_path) not in card


def test_a_local_folder_run_card_names_no_path(tmp_path):
    secret = tmp_path / "home" / "someone" / "photos"
    config = hscl_zoo.create_model("resnet10t", num_classes=3, image_size=16).model_config()
    config["training"] = {**TRAINING, "dataset": f"imagefolder:{secret}", "method": "hscl-beta"}
    card = render_card(config, {"top1": 50.0})
    header = yaml.safe_load(card.split("---")[1])
    assert str(secret) not in card and "someone" not in card
    assert "datasets" not in header
    assert card.split("---", 2)[2].lstrip().splitlines()[0] == "# hscl-beta-imagefolder"
    assert "published at" not in card
    hub = dict(config, training={**config["training"], "dataset": "hf:owner/pets"})
    assert yaml.safe_load(render_card(hub, {}).split("---")[1])["datasets"] == ["owner/pets"]


def test_loading_a_zoo_name_prints_one_line_with_the_weights_and_their_score(capsys):
    model = hscl_zoo.load("hscl-beta-mutag")
    assert model is not None
    err = capsys.readouterr().err
    svm = registry.info("hscl-beta-mutag").metrics["svm_accuracy"]
    assert err == f"hscl_zoo: loaded hscl-beta-mutag: SVM accuracy {svm:.2f} % (GIN 3 x 32, the paper's 200 epochs)\n"


# What users read: our GPU tooling and its limits belong on the contributing and benchmarks pages.
TOOLING = re.compile(r"device command|device tool|gpu_sprint|sprint|lent GPU|lent minutes|minutes of device|\.gpu/",
                     re.I)
USER_PAGES = [REPO / "README.md", *(p for p in sorted((REPO / "docs").glob("*.md"))
                                    if p.name not in ("contributing.md", "benchmarks.md"))]


def test_no_user_page_card_or_info_speaks_of_our_gpu_tooling():
    texts = {str(p.relative_to(REPO)): p.read_text() for p in USER_PAGES}
    texts |= {str(p.relative_to(REPO)): p.read_text() for p in (REPO / "model_cards").glob("*.md")}
    texts |= {str(p.relative_to(REPO)): p.read_text() for p in (REPO / "releases").glob("*/README.md")}
    texts |= {f"hscl-zoo info {name}": str(hscl_zoo.info(name)) for name in hscl_zoo.list_models()}
    parser = build_parser()
    texts["hscl-zoo --help"] = parser.format_help()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    texts |= {f"hscl-zoo {name} --help": command.format_help() for name, command in commands.items()}
    texts["hscl-zoo train --help"] = build_train_parser("hscl-zoo train").format_help()
    texts["hscl-zoo finetune --help"] = finetune_parser("hscl-zoo finetune").format_help()
    found = {where: match.group(0) for where, text in texts.items() if (match := TOOLING.search(text))}
    assert not found, found
    assert "hscl_zoo.zoo.cards" not in texts["docs/models.md"], "rewriting the zoo's cards is contributing.md's"


@pytest.mark.slow
def test_a_refused_run_under_accelerate_launch_prints_one_line(tmp_path):
    """training.md: under `accelerate launch -q` (one process) a run refused before it starts prints
    its one line and no launcher traceback, and writes nothing."""
    run = tmp_path / "thesis"
    run.mkdir()
    (run / "thesis.tex").write_text("mine")
    done = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "-q", "--num_processes", "1",
                           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                           str(REPO / "recipes" / "pretrain.py"), "--output_dir", str(run), "--overwrite"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "ACCELERATE_USE_CPU": "1"})
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode != 0 and len(lines) == 1 and "thesis.tex" in lines[0], lines
    assert sorted(p.name for p in run.iterdir()) == ["thesis.tex"]
