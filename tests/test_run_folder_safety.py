"""Issue 27, the training side: a run's output folder loses nothing and lets nothing in.

One lock per folder, every setting checked before anything is written or deleted, --resume
writing only into the folder it is given, --overwrite deleting only a run's own files, a torn
metrics line and a damaged RNG file named, and each bad input refused in one line before
training. Runs are in-process on the embedded digits (one 2-step epoch, a few seconds each).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from hscl_zoo.training.run_folder import LOCK_FILE, RunLock

from helpers import load_script
from test_pretrain import snapshot

TINY = ["--subset", "64", "--batch_size", "32", "--epochs", "1", "--probe_epochs", "1", "--monitor_train_size", "64"]


@pytest.fixture(scope="module")
def recipe():
    return load_script("recipes", "pretrain")


@pytest.fixture(scope="module")
def finished_run(recipe, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("runs") / "run"
    recipe.main([*TINY, "--output_dir", str(run)])
    return run


def refusal(recipe, args, capsys) -> str:
    """The one-line error `main(args)` ends with: its exit message, or argparse's last stderr line
    (after the usage line) for settings refused while parsing."""
    with pytest.raises(SystemExit) as exit_info:
        recipe.main(args)
    code = exit_info.value.code
    assert code not in (0, None)
    message = code if isinstance(code, str) else capsys.readouterr().err.strip().splitlines()[-1]
    assert "error: " in message and "\n" not in message, message
    return message


# ---- the lock ----

def test_a_folder_locked_by_a_live_run_is_refused(recipe, tmp_path, capsys):
    run = tmp_path / "r"
    with RunLock(run):
        before = snapshot(run)
        message = refusal(recipe, [*TINY, "--output_dir", str(run)], capsys)
        assert "in use by process" in message and str(run / LOCK_FILE) in message
        assert snapshot(run) == before
    assert not (run / LOCK_FILE).exists()


def test_a_stale_lock_is_taken_over_and_the_lock_released_at_the_end(recipe, tmp_path, capsys):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run = tmp_path / "r"
    run.mkdir()
    (run / LOCK_FILE).write_text(json.dumps({"host": __import__("socket").gethostname(), "pid": gone.pid}))
    result = recipe.main([*TINY, "--output_dir", str(run)])
    assert "stale lock" in capsys.readouterr().out
    assert Path(result["hub_dir"]).is_dir()
    assert not (run / LOCK_FILE).exists()


def test_a_lock_of_another_host_is_never_taken_over(tmp_path):
    (tmp_path / LOCK_FILE).write_text(json.dumps({"host": "another-node", "pid": 1}))
    with pytest.raises(RuntimeError, match="in use by process 1 on another-node"):
        RunLock(tmp_path).acquire()


@pytest.mark.slow
def test_two_runs_started_at_once_on_one_folder_do_not_mix(tmp_path):
    """The issue's case: two runs, seeds 0 and 1, launched together on one output_dir. One runs,
    the other is refused, and every file in the folder is the winner's."""
    run = tmp_path / "r"
    recipe_path = Path(__file__).resolve().parents[1] / "recipes" / "pretrain.py"
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(recipe_path), *TINY, "--seed", str(seed), "--output_dir", str(run)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for seed in (0, 1)]
    outcomes = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    assert sorted(code for code, _ in outcomes) == [0, 1], outcomes
    seed = [s for s, (code, _) in enumerate(outcomes) if code == 0][0]
    refused = [err for code, err in outcomes if code][0]
    assert "in use by process" in refused or "already holds a run" in refused, refused
    assert json.loads((run / "config.json").read_text())["seed"] == seed
    state = json.loads((run / "checkpoints" / "epoch_0001" / "state.json").read_text())
    assert state["config"]["seed"] == seed
    assert [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1]


# ---- --resume and --overwrite ----

def test_resume_writes_into_the_folder_given_not_the_one_config_json_names(recipe, finished_run, tmp_path, capsys):
    original = snapshot(finished_run)
    for copy_name, named in (("copy", finished_run), ("tampered", tmp_path / "elsewhere")):
        copy = tmp_path / copy_name
        shutil.copytree(finished_run, copy)
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps({**config, "output_dir": str(named)}))
        (copy / "hub" / "model.safetensors").unlink()
        result = recipe.main(["--output_dir", str(copy), "--resume"])
        assert Path(result["hub_dir"]) == copy / "hub" and (copy / "hub" / "model.safetensors").is_file()
        assert f"names output_dir {named}" in capsys.readouterr().out
        assert json.loads((copy / "config.json").read_text())["output_dir"] == str(copy)
    assert snapshot(finished_run) == original
    assert not (tmp_path / "elsewhere").exists()


def test_overwrite_refuses_a_folder_holding_files_no_run_writes(recipe, tmp_path, capsys):
    folder = tmp_path / "thesis"
    folder.mkdir()
    (folder / "thesis.tex").write_text("\\documentclass{article}")
    (folder / "metrics.jsonl").write_text('{"epoch": 1}\n')
    before = snapshot(folder)
    message = refusal(recipe, [*TINY, "--output_dir", str(folder), "--overwrite"], capsys)
    assert "thesis.tex" in message and "no run writes" in message
    assert snapshot(folder) == before


@pytest.mark.parametrize("setting, value, named", [
    ("temperature", "nan", "temperature=nan"),
    ("weight_decay", "-1", "weight_decay=-1"),
    ("M", "-5", "M=-5"),
    ("backbone", "resnet9999", "resnet9999"),
    ("image_size", "0", "image_size=0"),
    ("image_size", "100000", "image_size=100000"),
    ("views", "1000000", "views=1000000"),
])
def test_a_bad_setting_with_overwrite_deletes_nothing(recipe, finished_run, tmp_path, capsys, setting, value, named):
    run = tmp_path / "r"
    shutil.copytree(finished_run, run)
    before = snapshot(run)
    message = refusal(recipe, [*TINY, "--output_dir", str(run), "--overwrite", f"--{setting}", value], capsys)
    assert named in message
    assert snapshot(run) == before


def test_a_torn_last_metrics_line_is_dropped_with_a_warning_naming_the_file(recipe, finished_run, tmp_path, capsys):
    run = tmp_path / "r"
    shutil.copytree(finished_run, run)
    metrics = run / "metrics.jsonl"
    whole = metrics.read_text()
    metrics.write_text(whole + '{"epoch": 2, "train_lo')
    recipe.main(["--output_dir", str(run), "--resume"])
    assert f"warning: {metrics}: dropped its last line" in capsys.readouterr().out
    assert metrics.read_text() == whole


def test_a_damaged_rng_file_warns_on_resume(recipe, finished_run, tmp_path):
    run = tmp_path / "r"
    shutil.copytree(finished_run, run)
    (run / "checkpoints" / "epoch_0001" / "random_states_0.pkl").write_bytes(b"tampered")
    with pytest.warns(UserWarning, match="random_states_0.pkl cannot be read"):
        recipe.main(["--output_dir", str(run), "--resume"])


# ---- bad input: one line before training, nothing written ----

def test_a_yaml_syntax_error_names_the_file(recipe, tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("epochs: 2\nlr: [0.1\n")
    message = refusal(recipe, ["--config", str(config), "--output_dir", str(tmp_path / "r")], capsys)
    assert f"{config} is not valid YAML" in message and "line" in message
    assert not (tmp_path / "r").exists()


def image_folder(root: Path, make) -> Path:
    """An image folder of two classes, 20 images each, `make(class_index, i)` returning (name, image)."""
    for c in range(2):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(20):
            name, image = make(c, i)
            image.save(root / f"class{c}" / name)
    return root


def test_one_pixel_images_are_refused_before_training(recipe, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HSCL_ZOO_CACHE", str(tmp_path / "cache"))
    data = image_folder(tmp_path / "tiny", lambda c, i: (f"{i}.png", Image.new("RGB", (1, 1), (40 * i, 100 * c, 0))))
    message = refusal(recipe, ["--dataset", f"imagefolder:{data}", "--batch_size", "8", "--output_dir",
                               str(tmp_path / "r")], capsys)
    assert "1 px" in message and "--image_size" in message
    assert not (tmp_path / "r").exists()


def test_a_decompression_bomb_is_skipped_with_skip_unreadable(recipe, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HSCL_ZOO_CACHE", str(tmp_path / "cache"))
    data = image_folder(tmp_path / "bomb", lambda c, i: (f"{i}.png", Image.new("RGB", (16, 16), (12 * i, 120 * c, 0))))
    Image.new("1", (15000, 15000)).save(data / "class0" / "bomb.png")
    message = refusal(recipe, ["--dataset", f"imagefolder:{data}", "--output_dir", str(tmp_path / "r")], capsys)
    assert "bomb.png (DecompressionBombError)" in message and "skip_unreadable" in message
    assert not (tmp_path / "r").exists()
    result = recipe.main(["--dataset", f"imagefolder:{data}", "--skip_unreadable", "true", "--batch_size", "16",
                          "--epochs", "1", "--probe_epochs", "1", "--backbone", "resnet10t",
                          "--output_dir", str(tmp_path / "r")])
    assert "skipped 1 unreadable image(s)" in capsys.readouterr().out and Path(result["hub_dir"]).is_dir()


def test_a_file_name_that_is_not_utf8_is_named(recipe, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HSCL_ZOO_CACHE", str(tmp_path / "cache"))
    data = image_folder(tmp_path / "names", lambda c, i: (f"{i}.png", Image.new("RGB", (16, 16), (12 * i, 0, 0))))
    bad = bytes(data / "class1") + b"/caf\xe9.png"
    with open(bad, "wb") as f:
        Image.new("RGB", (16, 16)).save(f, format="PNG")
    message = refusal(recipe, ["--dataset", f"imagefolder:{data}", "--output_dir", str(tmp_path / "r")], capsys)
    assert "caf\\xe9.png" in message and "UTF-8" in message
    assert not (tmp_path / "r").exists()


def test_the_evaluation_the_docs_write_into_a_run_folder_does_not_block_overwrite(recipe, finished_run, tmp_path):
    """install.md's `hscl-zoo eval runs/default --out runs/default/eval.json`, then `--overwrite`:
    the run folder owns eval.json, so the new run starts and the stale evaluation goes with the old
    weights."""
    from hscl_zoo.cli import main as cli

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    assert cli(["eval", str(run), "--metrics", "knn", "--out", str(run / "eval.json")]) == 0
    assert (run / "eval.json").is_file()
    recipe.main([*TINY, "--output_dir", str(run), "--overwrite"])
    assert not (run / "eval.json").exists() and (run / "hub" / "model.safetensors").is_file()
