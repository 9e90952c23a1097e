"""The docs site as a reader's browser shows it (issue 41): built with ``mkdocs build --strict``,
then every page opened in headless Chromium at 1400 px and 390 px by ``docs/check_site.py``, which
fails on content running out of its column and on any request leaving the site."""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TU_ROOT = REPO.parent / "shared" / "data" / "tudataset"
sys.path.insert(0, str(REPO / "docs"))
import check_site  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ)
    if TU_ROOT.is_dir():  # the graphs tutorial runs at build; a user's machine downloads MUTAG instead
        env["HSCL_ZOO_TU_ROOT"] = str(TU_ROOT)
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=1800, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


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
             if "Traceback (most recent call last)" in html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))]
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
