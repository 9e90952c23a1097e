"""The tutorials of docs/tutorials/ run as plain scripts, each in a fresh process and folder, and
leave what they promise: trained diagnostics, an ONNX file that agrees with PyTorch, the figures.

Each tutorial writes under a `tempfile.mkdtemp()` folder; TMPDIR points that into the test's
tmp_path so the files can be checked here. Cost, one CPU thread each, on the 2-core development
machine: about 40 s of CPU time for the first three together (16 to 34 s of wall time each, measured
while two training jobs shared the cores); the graphs tutorial about 17 s of CPU time, reading MUTAG
from ../shared/data/tudataset (skipped when that is absent)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

import hscl_zoo
from helpers import missing_data

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "docs" / "tutorials"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
GENERATED_PAGES = ("config",)  # written at build time by docs/gen_pages.py


def run_tutorial(name: str, tmp_path: Path, **extra_env: str) -> tuple[str, Path]:
    """Run docs/tutorials/NAME as a script; return its output and the folder it worked in."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "HSCL_ZOO_CACHE": str(tmp_path / "cache"), "MPLBACKEND": "Agg", **extra_env}
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    done = subprocess.run([sys.executable, str(TUTORIALS / name)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not any(cwd.iterdir()), "a tutorial wrote into the working directory"
    work = sorted(tmp_path.glob("hscl-zoo-tutorial-*"))
    return done.stdout, work[0] if work else tmp_path


def test_every_tutorial_is_tested_and_in_the_site_nav():
    names = sorted(path.name for path in TUTORIALS.glob("*.py"))
    tested = re.findall(r'run_tutorial\("([\w.]+)"', Path(__file__).read_text())
    assert names and sorted(tested) == names
    nav = (ROOT / "mkdocs.yml").read_text()
    assert all(f"tutorials/{name}" in nav for name in names)


@pytest.mark.slow  # 20 to 60 s each on two cores
def test_loss_in_your_loop_trains_and_reports_the_diagnostics(tmp_path):
    out, _ = run_tutorial("01_loss_in_your_loop.py", tmp_path)
    epochs = re.findall(r"epoch (\d): loss ([\d.]+), Assumption 1 holds for ([\d.]+)% of anchors, "
                        r"L_HSCL ([\d.]+) <= L_HUCL ([\d.]+): (True|False)", out)
    assert [int(e[0]) for e in epochs] == [1, 2]
    for _, loss, fraction, hscl, _, _ in epochs:
        assert 0 < float(fraction) <= 100
        assert abs(float(loss) - float(hscl)) <= 0.002, "H-SCL(beta)'s loss is L_HSCL of the diagnostics"
    assert float(epochs[1][1]) < float(epochs[0][1])
    after, before = map(float, re.search(r"kNN top-1 after 2 epochs: ([\d.]+)% \(before: ([\d.]+)%\)", out).groups())
    assert after > before


@pytest.mark.slow  # 20 to 60 s each on two cores
def test_your_image_folder_exports_an_onnx_file_that_matches_the_embeddings(tmp_path):
    import onnxruntime

    _, work = run_tutorial("02_your_image_folder.py", tmp_path)
    hub, export = work / "runs" / "digits" / "hub", work / "export"
    evaluation = json.loads((work / "eval.json").read_text())
    own = json.loads((work / "runs" / "digits" / "linear_eval.json").read_text())
    assert (evaluation["top1"], evaluation["knn_top1"]) == (own["top1"], own["knn_top1"]), "eval repeats the run's own"
    table = pq.read_table(work / "digits.parquet")
    files = table.column("file").to_pylist()
    assert len(files) == 400 and files == sorted(files)
    preprocess = json.loads((export / "preprocess.json").read_text())
    assert preprocess["class_names"] == sorted(path.name for path in (work / "digits").iterdir())
    model = hscl_zoo.load(str(hub))
    rows = [0, 123, 399]
    images = torch.stack([model.transform(Image.open(work / "digits" / files[i])) for i in rows]).numpy()
    session = onnxruntime.InferenceSession(str(export / "features.onnx"), providers=["CPUExecutionProvider"])
    (features,) = session.run(None, {preprocess["input_name"]: images})
    embeddings = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))[rows]
    np.testing.assert_allclose(features, embeddings, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # 20 to 60 s each on two cores
def test_model_folder_tutorial_draws_the_papers_figures(tmp_path):
    out, work = run_tutorial("03_model_folder_and_figures.py", tmp_path)
    digits = {path.name for path in (work / "figures-digits").iterdir()}
    cifar = {path.name for path in (work / "figures-cifar10").iterdir()}
    assert digits == {"fig1_accuracy.png", "fig4_assumption.png", "fig5_losses.png"}
    assert cifar == digits | {"fig_threshold.png"}
    for path in [*(work / "figures-digits").iterdir(), *(work / "figures-cifar10").iterdir()]:
        assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    committed = sorted((ROOT / "results" / "cpu-cifar10-10k" / "runs").glob("*-s0.json"))
    for path in committed:
        record = json.loads(path.read_text())
        assert f"seed 0: {len(record['history'])} epochs, linear-probe top-1 {record['top1']:.2f}%" in out
    assert len(committed) == 5


@pytest.mark.slow  # 20 to 60 s each on two cores
def test_graphs_tutorial_trains_on_mutag_and_embeds_from_the_command_line(shared_data, tmp_path):
    tu_root = shared_data / "tudataset"
    if not (tu_root / "MUTAG").is_dir():
        pytest.skip(missing_data(tu_root / "MUTAG"))
    out, work = run_tutorial("04_graphs_mutag.py", tmp_path, HSCL_ZOO_TU_ROOT=str(tu_root))
    assert "188 graphs, 3371 nodes, 3721 edges; classes ('-1', '1') with [63, 125] graphs" in out
    losses = [float(x) for x in re.search(r"loss per epoch: ([\d. -]+)\n", out)[1].split()]
    assert len(losses) == 20 and losses[-1] < losses[0]
    svm, majority = map(float, re.search(r"SVM accuracy over 10 folds: ([\d.]+)% .*majority class: ([\d.]+)%", out).groups())
    assert majority == 66.49 and svm > majority
    assert float(re.search(r"linear head: cross-validated ([\d.]+)%", out)[1]) > majority
    table = pq.read_table(work / "mutag.parquet")
    assert table.column_names == ["index", "label", "embedding"] and table.num_rows == 188
    assert sorted(p.name for p in (work / "mutag-hscl-beta").iterdir()) == ["config.json", "model.safetensors"]


@pytest.mark.parametrize("name", sorted(path.name for path in TUTORIALS.glob("*.py")))
def test_tutorial_links_reach_site_pages(name):
    """mkdocs-jupyter leaves links as written, so they are the site's URLs, not .md paths: a page
    at tutorials/NAME/ reaches docs/PAGE.md as ../../PAGE/ and a tutorial as ../TUTORIAL/."""
    links = re.findall(r"\]\(([^)]+)\)", (TUTORIALS / name).read_text())
    assert links
    for link in links:
        page = re.fullmatch(r"\.\./\.\./([\w-]+)/(#[\w-]+)?", link)
        tutorial = re.fullmatch(r"\.\./(\w+)/", link)
        assert page or tutorial, f"{name}: {link} is not a site URL"
        if page:
            assert (ROOT / "docs" / f"{page[1]}.md").is_file() or page[1] in GENERATED_PAGES, (name, link)
        else:
            assert (TUTORIALS / f"{tutorial[1]}.py").is_file(), (name, link)


@pytest.mark.parametrize("name", sorted(path.name for path in TUTORIALS.glob("*.py")))
def test_tutorial_is_a_jupytext_percent_notebook(name):
    text = (TUTORIALS / name).read_text()
    assert "formats: py:percent" in text and text.count("# %% [markdown]") >= 3
    assert "# %% [markdown]\n# # " in text, "the first Markdown cell opens with the page title"
