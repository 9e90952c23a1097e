"""Installing the package (issue 41): the wheel's metadata and the CPU-only route.

The CPU route is: torch from PyTorch's CPU wheel index at the pinned versions, then the package
with ``-c constraints.txt``. That index is not reachable here, so the route is checked as far as
this machine allows: the pins admit a CPU build's version (``2.x.y+cpu``), install.md names the
pinned versions, and with the pinned torch installed, resolving the package with the constraints
(offline, ``--no-index``) installs the package alone and changes no torch package.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
TORCH_FAMILY = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*)$")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _pins() -> dict[str, Requirement]:
    lines = (REPO / "constraints.txt").read_text().splitlines()
    reqs = [Requirement(line.split("#")[0].strip()) for line in lines if line.split("#")[0].strip()]
    return {req.name: req for req in reqs}


def _relative_links(markdown: str) -> list[str]:
    """Targets of Markdown links and images that are not absolute http(s) URLs."""
    targets = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)", markdown)
    targets += re.findall(r"^\[[^\]]+\]:\s*(\S+)", markdown, re.MULTILINE)
    targets += re.findall(r"<(?:a|img)\s[^>]*(?:href|src)=\"([^\"]+)\"", markdown)
    return [t for t in targets if not re.match(r"https?://", t)]


def test_relative_link_finder_finds_each_kind():
    text = "[a](docs/x.md) ![b](img.png) [c](https://x.org/y) <https://z.org>\n[d]: ../e.md\n<a href=\"f.md\">f</a>"
    assert _relative_links(text) == ["docs/x.md", "img.png", "../e.md", "f.md"]


def test_project_urls_are_declared():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    urls = project["urls"]
    assert {"Homepage", "Documentation", "Source", "Issues"} <= set(urls)
    assert all(url.startswith("https://") for url in urls.values())


def test_the_pins_admit_pytorchs_cpu_builds():
    pins = _pins()
    assert {"torch", "torchvision"} <= set(pins)
    for name in ("torch", "torchvision"):
        (spec,) = pins[name].specifier
        assert spec.operator == "==", f"{name} is pinned exactly"
        assert pins[name].specifier.contains(Version(f"{spec.version}+cpu")), f"{name}: a +cpu build would be replaced"


def test_install_page_gives_the_cpu_route_at_the_pinned_versions():
    page = (REPO / "docs" / "install.md").read_text()
    pins = _pins()
    line = next(line for line in page.splitlines() if CPU_INDEX in line)
    for name in ("torch", "torchvision"):
        assert f"{name}=={next(iter(pins[name].specifier)).version}" in line, line
    assert "-c constraints.txt" in page.split(CPU_INDEX, 1)[1], "the package comes after torch, with the constraints"


@pytest.fixture(scope="module")
def dry_run() -> dict:
    """pip's report of installing this checkout with the constraints, offline, into the running
    environment (which holds the pinned torch)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                           "--quiet", "--report", "-", "-c", str(REPO / "constraints.txt"), str(REPO)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and "No module named pip" in proc.stderr:
        pytest.skip("this environment has no pip")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_with_the_pinned_torch_installed_the_package_changes_no_torch_package(dry_run):
    from importlib.metadata import version

    pins = _pins()
    assert pins["torch"].specifier.contains(Version(version("torch"))), "this environment holds the pinned torch"
    installs = [item["metadata"]["name"] for item in dry_run["install"]]
    assert installs == ["hscl-zoo"], installs
    assert not [name for name in installs if TORCH_FAMILY.match(name)]


def test_the_wheels_long_description_has_only_absolute_links(dry_run):
    metadata = dry_run["install"][0]["metadata"]
    assert metadata["description_content_type"] == "text/markdown"
    description = metadata["description"]
    assert "hscl-zoo" in description and _relative_links(description) == []
    assert CPU_INDEX in description
    urls = dict(entry.split(", ", 1) for entry in metadata["project_url"])
    assert urls["Documentation"].startswith("https://")
