"""recipes/publish.py, recipes/plot.py and recipes/linear_eval.py on a real finished pretraining run.

One tiny run of recipes/pretrain.py (embedded digits, 300 images, 2 epochs; 40-90 s on two shared
CPU cores) is made once per test session, in-process, and shared by every test here; tests that
change a run work on a copy.
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import pytest
import torch

import hscl_zoo
from hscl_zoo.evaluation import evaluate_model
from hscl_zoo.reproduction import figures

from helpers import PNG_SIGNATURE, load_script

REPO = Path(__file__).resolve().parents[1]
TINY = ["--epochs", "2", "--batch_size", "64", "--subset", "300", "--probe_epochs", "5"]


def _recipe(name: str):
    return load_script("recipes", name)


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> Path:
    """A finished hscl-beta run (the default method): checkpoints, metrics, linear eval, hub folder."""
    run = tmp_path_factory.mktemp("runs") / "digits-hscl-beta"
    result = _recipe("pretrain").main([*TINY, "--output_dir", str(run)])
    assert Path(result["hub_dir"]) == run / "hub"
    return run


@pytest.fixture(scope="session")
def second_run(finished_run: Path, tmp_path_factory) -> Path:
    """The run's metrics under another method's name, for the multi-run figures.

    A second real run would double this module's cost on the shared CPU; the plots only read
    config.json (method, seed) and metrics.jsonl, which are the real run's.
    """
    run = tmp_path_factory.mktemp("runs") / "digits-scl"
    run.mkdir()
    shutil.copy(finished_run / "metrics.jsonl", run / "metrics.jsonl")
    config = json.loads((finished_run / "config.json").read_text())
    config.update(method="scl", seed=1)
    (run / "config.json").write_text(json.dumps(config))
    return run


def _probe_input(model) -> torch.Tensor:
    """A fixed batch at the model's input size."""
    channels, height, width = model.pretrained_cfg["input_size"]
    return torch.randn(6, channels, height, width, generator=torch.Generator().manual_seed(0))


# ---- publish ----------------------------------------------------------------------------------


def test_publish_builds_a_loadable_hub_folder(finished_run: Path, tmp_path: Path, capsys):
    out = tmp_path / "published"
    folder = _recipe("publish").main(["--run", str(finished_run), "--out", str(out),
                                      "--repo-id", "someone/hscl-beta-digits-test", "--name", "hscl-beta-digits"])
    assert folder == out
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "metrics.json", "model.safetensors"]
    assert "Hub-ready folder" in capsys.readouterr().out

    published = hscl_zoo.load(f"local-dir:{out}")
    original = hscl_zoo.load(f"local-dir:{finished_run / 'hub'}")
    x = _probe_input(original)
    with torch.no_grad():
        assert torch.equal(published(x), original(x)), "published weights differ from the run's"
    for key, value in original.state_dict().items():
        assert torch.equal(published.state_dict()[key], value), key

    config = json.loads((out / "config.json").read_text())
    assert config["training"]["method"] == "hscl-beta"
    assert config["training"]["dataset"] == "digits"
    assert config["training"]["epochs"] == 2 and config["training"]["subset"] == 300
    metrics = json.loads((out / "metrics.json").read_text())
    run_eval = json.loads((finished_run / "linear_eval.json").read_text())
    assert metrics["evaluation"]["top1"] == run_eval["top1"]
    assert [row["epoch"] for row in metrics["history"]] == [1, 2]

    card = (out / "README.md").read_text()
    assert "someone/hscl-beta-digits-test" in card
    assert "hscl-beta-digits" in card
    assert f"{run_eval['top1']:.2f}" in card  # the measured top-1, as the card rounds it
    # the recipe's final evaluation adds retrieval and the audit, and the card shows them
    assert run_eval["metrics"] == ["linear", "knn", "retrieval", "audit"]
    assert f"| MAP@R | {run_eval['retrieval']['map_at_r']:.2f} |" in card
    assert f"| uniformity (t 2; lower is better) | {run_eval['audit']['uniformity']:.4f} |" in card
    assert run_eval["audit"]["protocol"]["assumption_hardening"] == "exponential tilt, beta 1"


def test_publish_rebuilds_the_run_hub_folder_in_place(finished_run: Path, tmp_path: Path):
    run = tmp_path / "run"
    shutil.copytree(finished_run / "hub", run / "hub")
    before = hscl_zoo.load(f"local-dir:{run / 'hub'}")
    (run / "hub" / "README.md").unlink()  # a lost card is written again
    folder = _recipe("publish").main(["--run", str(run)])
    assert folder == run / "hub"
    assert (folder / "README.md").stat().st_size > 0
    after = hscl_zoo.load(f"local-dir:{folder}")
    x = _probe_input(after)
    with torch.no_grad():
        assert torch.equal(after(x), before(x))


def test_publish_push_needs_repo_id(finished_run: Path, tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as info:
        _recipe("publish").main(["--run", str(finished_run), "--out", str(tmp_path / "x"), "--push"])
    assert info.value.code == 2
    assert "--push needs --repo-id" in capsys.readouterr().err
    assert not (tmp_path / "x").exists(), "nothing is written before the arguments are checked"


def test_publish_refuses_an_unfinished_run(finished_run: Path, tmp_path: Path):
    run = tmp_path / "unfinished"
    run.mkdir()
    shutil.copy(finished_run / "config.json", run / "config.json")
    shutil.copy(finished_run / "metrics.jsonl", run / "metrics.jsonl")
    with pytest.raises(SystemExit) as info:
        _recipe("publish").main(["--run", str(run), "--out", str(tmp_path / "out")])
    message = str(info.value.code)
    assert message.startswith("error:") and "has no finished model" in message
    assert str(run / "hub" / "model.safetensors") in message
    assert "--resume" in message
    assert not (tmp_path / "out").exists()


def test_publish_refuses_a_hub_folder_without_its_evaluation(finished_run: Path, tmp_path: Path):
    run = tmp_path / "no-metrics"
    shutil.copytree(finished_run / "hub", run / "hub")
    (run / "hub" / "metrics.json").unlink()
    with pytest.raises(SystemExit, match=r"metrics.json is missing or has no 'evaluation'"):
        _recipe("publish").main(["--run", str(run), "--out", str(tmp_path / "out")])


def test_publish_refuses_weights_that_do_not_match_the_config(finished_run: Path, tmp_path: Path):
    run = tmp_path / "broken"
    shutil.copytree(finished_run / "hub", run / "hub")
    config_path = run / "hub" / "config.json"
    config = json.loads(config_path.read_text())
    config["model_args"]["proj_dim"] = 64  # the saved projector is 128-d
    config_path.write_text(json.dumps(config))
    with pytest.raises(SystemExit, match="does not load back strictly"):
        _recipe("publish").main(["--run", str(run), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


# ---- plot -------------------------------------------------------------------------------------


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_writes_the_three_figures(finished_run: Path, second_run: Path, tmp_path: Path, capsys):
    out = tmp_path / "figures"
    paths = _recipe("plot").main([str(finished_run), str(second_run), "--out", str(out)])
    assert [p.name for p in paths] == ["fig1_accuracy.png", "fig4_assumption.png", "fig5_losses.png"]
    for path in paths:
        assert path.parent == out
        assert path.stat().st_size > 15_000, f"{path.name} is only {path.stat().st_size} bytes"
        width, height = _png_size(path)
        assert width >= 600 and height >= 400
    # Fig. 5 has one panel per run: two runs side by side are wider than one
    assert _png_size(out / "fig5_losses.png")[0] > _png_size(out / "fig1_accuracy.png")[0]
    assert "wrote" in capsys.readouterr().out

    single = figures.plot_run_dirs([finished_run], tmp_path / "one")
    assert _png_size(single[2])[0] < _png_size(out / "fig5_losses.png")[0]


def test_plot_labels_runs_and_tells_same_method_runs_apart(finished_run: Path, second_run: Path, tmp_path: Path,
                                                           monkeypatch):
    assert figures.read_run_dir(finished_run)[0] == "hscl-beta (seed 0)"
    label, rows = figures.read_run_dir(second_run)
    assert label == "scl (seed 1)"
    assert [r["epoch"] for r in rows] == [1, 2]
    assert all("knn_top1" in r and "assumption_fraction" in r and "loss_hscl" in r for r in rows)

    copy = tmp_path / "digits-hscl-beta-copy"
    copy.mkdir()
    for name in ("config.json", "metrics.jsonl"):
        shutil.copy(finished_run / name, copy / name)
    legends = []  # the legend texts of each figure, read just before it is saved
    save = figures._save

    def recording_save(fig, path):
        legends.append([t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()])
        return save(fig, path)

    monkeypatch.setattr(figures, "_save", recording_save)
    paths = figures.plot_run_dirs([finished_run, copy], tmp_path / "figs")
    assert all(p.stat().st_size > 0 for p in paths)
    assert "hscl-beta (seed 0) [digits-hscl-beta]" in legends[0]
    assert "hscl-beta (seed 0) [digits-hscl-beta-copy]" in legends[0]
    assert legends[1][-1] == "95% (paper's claim)"
    assert legends[2] == ["L_UCL", "L_SCL", "L_HUCL", "L_HSCL"] * 2


def test_plot_refuses_a_directory_without_metrics(tmp_path: Path):
    with pytest.raises(SystemExit, match="has no metrics.jsonl"):
        _recipe("plot").main([str(tmp_path), "--out", str(tmp_path / "figs")])
    empty = tmp_path / "empty-run"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("")
    with pytest.raises(SystemExit, match="holds no epoch yet"):
        _recipe("plot").main([str(empty), "--out", str(tmp_path / "figs")])
    assert not (tmp_path / "figs").exists()


# ---- linear_eval ------------------------------------------------------------------------------


def test_linear_eval_reproduces_the_runs_evaluation(finished_run: Path, tmp_path: Path, capsys):
    out = tmp_path / "eval" / "digits.json"
    result = _recipe("linear_eval").main(["--model", f"local-dir:{finished_run / 'hub'}", "--out", str(out)])
    run_eval = json.loads((finished_run / "linear_eval.json").read_text())
    # same weights, data subset, seed and protocol (taken from the run's recipe config): same numbers
    for key in ("top1", "top5", "train_top1", "knn_top1"):
        assert result[key] == pytest.approx(run_eval[key], abs=1e-6), key
    assert result["protocol"] == run_eval["protocol"]
    assert "linear-probe top-1" in capsys.readouterr().out

    written = json.loads(out.read_text())
    assert written["top1"] == result["top1"]
    assert (written["dataset"], written["subset"], written["data_dir"]) == ("digits", 300, None)
    protocol = written["protocol"]
    assert (protocol["epochs"], protocol["seed"], protocol["num_train"]) == (5, 0, 300)
    assert protocol["knn"]["k"] == 20
    assert protocol["report"] == "last epoch" and protocol["augmentation"] is False


def test_linear_eval_takes_the_labelled_fraction_and_the_whole_test_split(finished_run: Path):
    """300 training digits (30 per class): a fifth of the labels probes on 60 of them; full_test
    evaluates on the whole held-out split instead of the subset's share of it."""
    model = f"local-dir:{finished_run / 'hub'}"
    own = _recipe("linear_eval").main(["--model", model])
    fifth = _recipe("linear_eval").main(["--model", model, "--labelled_fraction", "0.2", "--full_test"])
    assert (own["labelled_fraction"], own["full_test"]) == (1.0, False)
    assert (fifth["labelled_fraction"], fifth["full_test"]) == (0.2, True)
    assert (own["train_images"], own["unlabelled_train_images"]) == (300, 0)
    assert (fifth["train_images"], fifth["unlabelled_train_images"]) == (60, 240)
    assert fifth["protocol"]["num_test"] == 360 > own["protocol"]["num_test"]


def test_linear_eval_command_line_overrides_the_run(finished_run: Path):
    result = _recipe("linear_eval").main(["--model", str(finished_run / "hub"), "--probe_epochs", "1",
                                          "--subset", "200", "--knn_k", "5"])
    assert result["protocol"]["epochs"] == 1
    assert result["protocol"]["num_train"] == 200
    assert result["protocol"]["knn"]["k"] == 5
    same = evaluate_model(str(finished_run / "hub"), probe_epochs=1, subset=200, knn_k=5, progress=False)
    assert (result["top1"], result["knn_top1"]) == (same["top1"], same["knn_top1"]), "the flags are the API's keywords"


def test_linear_eval_needs_a_dataset_for_a_bare_model(tmp_path: Path, capsys):
    model = hscl_zoo.create_model("resnet18", num_classes=10, image_size=16)
    hscl_zoo.save_pretrained(model, tmp_path / "bare")
    with pytest.raises(SystemExit) as info:
        _recipe("linear_eval").main(["--model", f"local-dir:{tmp_path / 'bare'}"])
    assert info.value.code == 2
    assert "names no training dataset: pass --dataset" in capsys.readouterr().err


def test_linear_eval_reports_a_missing_model_clearly(tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as info:
        _recipe("linear_eval").main(["--model", f"local-dir:{tmp_path}"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "cannot evaluate --model" in err and "lacks config.json" in err
