"""The docs site as a reader's browser shows it (issue 41): built with ``mkdocs build --strict``,
then every page opened in headless Chromium at 1400 px and 390 px by ``docs/check_site.py``, which
fails on content running out of its column and on any request leaving the site.

The build runs the four tutorials of docs/tutorials/ (mkdocs-jupyter executes them and shows their
outputs), so the tutorials are checked here, on that one run: what each printed, read from its page,
and what it left in its temporary folder (TMPDIR points the tutorials' `tempfile.mkdtemp()` into
the test's folder). The fast tests of docs/tutorials/ (links, format, the same behaviour as a plain
script) are in test_tutorials.py."""

from __future__ import annotations

import html
import importlib.util
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
from helpers import PNG_SIGNATURE

REPO = Path(__file__).resolve().parents[1]
TU_ROOT = REPO.parent / "shared" / "data" / "tudataset"
TUTORIALS = REPO / "docs" / "tutorials"
sys.path.insert(0, str(REPO / "docs"))
import check_site  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    root = tmp_path_factory.mktemp("site")
    out, work = root / "html", root / "tutorials-tmp"
    work.mkdir()
    env = {**os.environ, "TMPDIR": str(work), "HF_HUB_OFFLINE": "1", "HSCL_ZOO_CACHE": str(root / "cache"),
           "MPLBACKEND": "Agg"}
    if TU_ROOT.is_dir():  # the graphs tutorial runs at build; a user's machine downloads MUTAG instead
        env["HSCL_ZOO_TU_ROOT"] = str(TU_ROOT)
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=1800, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def page_text(page: Path) -> str:
    """A built page's text, tags removed and entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def tutorial_output(site: Path, name: str) -> str:
    """The text of a tutorial's page: its code and what each cell printed."""
    return page_text(site / "tutorials" / name / "index.html")


def tutorial_work(site: Path, holding: str) -> Path:
    """The one temporary folder a tutorial made at build that holds ``holding``."""
    found = [path for path in (site.parent / "tutorials-tmp").glob("hscl-zoo-tutorial-*") if (path / holding).exists()]
    assert len(found) == 1, found
    return found[0]


def test_site_has_no_stray_or_near_empty_pages(site):
    assert not list(site.rglob("SUMMARY/index.html")), "the nav file is published as a page"
    assert not (site / "reference" / "hscl_zoo" / "losses" / "pairs").exists()
    for entry in ("hscl-beta-cifar10", "ucl-tinyimagenet"):
        page = (site / "zoo" / entry / "index.html").read_text()
        assert "Weights not published yet" in page
    index = (site / "index.html").read_text()
    assert "zoo/hscl-beta-cifar10/" in index and "<!-- zoo-table -->" not in index


def test_every_page_fits_its_column_and_stays_on_the_site(site):
    chromium = check_site.find_chromium()
    if chromium is None:
        pytest.skip("no Chromium on the PATH (apt-get install chromium)")
    problems = check_site.check_site(site, chromium)
    assert not problems, "\n".join(problems[:40])


def test_tutorials_show_outputs_and_a_download_link(site):
    for name in sorted(p.stem for p in (REPO / "docs" / "tutorials").glob("*.py")):
        page = (site / "tutorials" / name / "index.html").read_text()
        assert f'href="{name}.py" download' in page
        assert (site / "tutorials" / name / f"{name}.py").is_file()
        assert "jp-OutputArea-output" in page, "the tutorial ran at build and its outputs are shown"


def test_no_page_shows_a_traceback(site):
    """A tutorial cell that raises fails the build (mkdocs.yml: allow_errors false); a page that
    prints a traceback some other way, caught and shown, is as broken to its reader."""
    shown = [str(page.relative_to(site)) for page in site.rglob("*.html")
             if "Traceback (most recent call last)" in page_text(page)]
    assert not shown, f"pages showing a traceback: {shown}"


def test_the_browser_check_finds_a_phone_only_overflow_and_a_request_off_the_site(tmp_path):
    """A three-page site where only the phone width overflows one page, and another page asks for an
    image from elsewhere: the check names both, at the right width, and nothing on the clean page."""
    chromium = check_site.find_chromium()
    if chromium is None:
        pytest.skip("no Chromium on the PATH (apt-get install chromium)")
    page = ('<!doctype html><html><head><meta name="viewport" content="width=device-width"><style>'
            'body{{margin:0}} .md-content{{max-width:100%;margin:0 8px}}'
            '@media (max-width:600px){{.wide{{width:500px}}}}</style></head>'
            '<body><div class="md-content"><p>text</p>{}</div></body></html>')
    (tmp_path / "clean.html").write_text(page.format('<div class="wide-on-no-screen">fits</div>'))
    (tmp_path / "narrow.html").write_text(page.format('<div class="wide">a table as wide as a laptop</div>'))
    (tmp_path / "external.html").write_text(page.format('<img src="http://example.invalid/logo.png" alt="">'))
    problems = check_site.check_site(tmp_path, chromium)
    assert any(p.startswith("narrow.html at 390 px: <div> ends at") for p in problems), problems
    assert not any(p.startswith(("narrow.html at 1400", "clean.html")) for p in problems), problems
    assert [p for p in problems if p.startswith("external.html")] == [
        "external.html: requests http://example.invalid/logo.png, outside the site"], problems


def test_the_tutorials_wrote_nothing_beside_themselves(site):
    """The build runs each tutorial in its own folder (docs/tutorials/); they write only under
    their temporary folder."""
    left = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", str(TUTORIALS)], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout
    assert not left.strip(), left


def test_loss_in_your_loop_trains_and_reports_the_diagnostics(site):
    out = tutorial_output(site, "01_loss_in_your_loop")
    epochs = re.findall(r"epoch (\d): loss ([\d.]+), Assumption 1 holds for ([\d.]+)% of anchors, "
                        r"L_HSCL ([\d.]+) <= L_HUCL ([\d.]+): (True|False)", out)
    assert [int(e[0]) for e in epochs] == [1, 2]
    for _, loss, fraction, hscl, _, _ in epochs:
        assert 0 < float(fraction) <= 100
        assert abs(float(loss) - float(hscl)) <= 0.002, "H-SCL(beta)'s loss is L_HSCL of the diagnostics"
    assert float(epochs[1][1]) < float(epochs[0][1])
    after, before = map(float, re.search(r"kNN top-1 after 2 epochs: ([\d.]+)% \(before: ([\d.]+)%\)", out).groups())
    assert after > before


def test_your_image_folder_exports_an_onnx_file_that_matches_the_embeddings(site):
    import onnxruntime

    out, work = tutorial_output(site, "02_your_image_folder"), tutorial_work(site, "digits.parquet")
    assert re.findall(r"^\$ hscl-zoo (\w+)", out, re.M) == ["train", "eval", "embed", "export"]
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


def test_model_folder_tutorial_draws_the_papers_figures(site):
    out, work = tutorial_output(site, "03_model_folder_and_figures"), tutorial_work(site, "figures-cifar10")
    digits = {path.name for path in (work / "figures-digits").iterdir()}
    cifar = {path.name for path in (work / "figures-cifar10").iterdir()}
    assert digits == {"fig1_accuracy.png", "fig4_assumption.png", "fig5_losses.png"}
    assert cifar == digits | {"fig_threshold.png"}
    for path in [*(work / "figures-digits").iterdir(), *(work / "figures-cifar10").iterdir()]:
        assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    committed = sorted((REPO / "results" / "cpu-cifar10-10k" / "runs").glob("*-s0.json"))
    for path in committed:
        record = json.loads(path.read_text())
        assert f"seed 0: {len(record['history'])} epochs, linear-probe top-1 {record['top1']:.2f}%" in out
    assert len(committed) == 5


def test_graphs_tutorial_trains_on_mutag_and_embeds_from_the_command_line(site):
    out, work = tutorial_output(site, "04_graphs_mutag"), tutorial_work(site, "mutag.parquet")
    assert "188 graphs, 3371 nodes, 3721 edges; classes ('-1', '1') with [63, 125] graphs" in out
    losses = [float(x) for x in re.search(r"loss per epoch: ([\d. -]+)\n", out)[1].split()]
    assert len(losses) == 20 and losses[-1] < losses[0]
    svm, majority = map(float, re.search(r"SVM accuracy over 10 folds: ([\d.]+)% .*majority class: ([\d.]+)%", out).groups())
    assert majority == 66.49 and svm > majority
    assert float(re.search(r"linear head: cross-validated ([\d.]+)%", out)[1]) > majority
    table = pq.read_table(work / "mutag.parquet")
    assert table.column_names == ["index", "label", "embedding"] and table.num_rows == 188
    assert sorted(p.name for p in (work / "mutag-hscl-beta").iterdir()) == ["config.json", "model.safetensors"]
