"""The tutorials of docs/tutorials/ as files: jupytext notebooks whose links reach site pages, in
the site's nav, and written so that a reader's `python FILE` and the site's Jupyter kernel run them
the same way. What they print and leave is checked in test_site.py, on the run the site build makes
of each (mkdocs-jupyter executes them)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "docs" / "tutorials"
GENERATED_PAGES = ("config",)  # written at build time by docs/gen_pages.py


def test_every_tutorial_is_checked_on_the_site_and_in_its_nav():
    names = sorted(path.stem for path in TUTORIALS.glob("*.py"))
    checked = re.findall(r'tutorial_output\(site, "(\w+)"\)', (ROOT / "tests" / "test_site.py").read_text())
    assert names and sorted(checked) == names
    nav = (ROOT / "mkdocs.yml").read_text()
    assert all(f"tutorials/{name}.py" in nav for name in names)


@pytest.mark.parametrize("name", sorted(path.name for path in TUTORIALS.glob("*.py")))
def test_a_tutorial_runs_the_same_as_a_script_and_in_a_kernel(name):
    """The site runs the tutorials in a Jupyter kernel; a reader runs them with `python FILE`. They
    behave the same when they read neither the script's path (no `__file__` in a kernel) nor the
    command line (a kernel's `sys.argv` holds its connection file)."""
    tree = ast.parse((TUTORIALS / name).read_text())
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    attributes = {(node.value.id, node.attr) for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)}
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module == "sys"
                for alias in node.names}
    assert "__file__" not in names and ("sys", "argv") not in attributes and "argv" not in imported


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


def test_the_pages_say_the_graphs_tutorial_downloads_and_what_to_do_offline():
    """The docs build runs the tutorials; offline, the graphs tutorial needs HSCL_ZOO_TU_ROOT
    (issue 57: the build failed offline with no word of it on the page)."""
    for page in ("graphs.md", "contributing.md"):
        text = " ".join((Path(__file__).resolve().parents[1] / "docs" / page).read_text().split())
        assert "downloads MUTAG" in text and "HSCL_ZOO_TU_ROOT" in text, page
