"""The package as a wheel installs it (hscl_zoo/_roots.py): it finds the committed releases where a
checkout does, in the folder HSCL_ZOO_ROOT names or the checkout it runs in, never next to its own
files, so an installed wheel and a checkout behave alike."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

NAME = "hscl-beta-mutag"  # a published graph release: a few hundred kB

_LOAD = """
import json, sys, traceback
import hscl_zoo
try:
    model = hscl_zoo.load(sys.argv[1])
except Exception as error:
    print(json.dumps({"module": hscl_zoo.__file__, "error": traceback.format_exception_only(error)[-1].strip()}))
else:
    print(json.dumps({"module": hscl_zoo.__file__, "parameters": sum(p.numel() for p in model.parameters())}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel built from a copy of the package's sources, installed (no dependencies: the ones
    this environment has) into a folder of its own, outside any checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(REPO / "hscl_zoo", source / "hscl_zoo", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "DESCRIPTION.md", "LICENSE", "MANIFEST.in"):
        shutil.copy2(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp / "dist"), str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp / "dist").glob("*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp / "site"),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    assert not (tmp / "site" / "releases").exists(), "the wheel carries no releases"
    return tmp / "site"


def _load(site: Path, cwd: Path, **env: str) -> dict:
    """`hscl_zoo.load(NAME)` in a fresh interpreter importing the installed wheel, offline with an
    empty Hub cache and no mirror: only the checkout's releases/ can serve it."""
    environ = {k: v for k, v in os.environ.items() if k not in ("HSCL_ZOO_ROOT", "HSCL_ZOO_RELEASES")}
    environ.update(PYTHONPATH=str(site), HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cwd / "empty-cache"), **env)
    done = subprocess.run([sys.executable, "-c", _LOAD, NAME], capture_output=True, text=True, env=environ,
                          cwd=cwd, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["module"] == str(site / "hscl_zoo" / "__init__.py"), result
    return result


@pytest.mark.slow  # builds and installs the wheel, then three fresh interpreters load a release: about 25 s
def test_the_installed_wheel_loads_a_published_name_from_the_folder_given_and_from_the_checkout(installed, tmp_path):
    given = tmp_path / "given"
    shutil.copytree(REPO / "releases" / NAME, given / "releases" / NAME)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    from_given = _load(installed, elsewhere, HSCL_ZOO_ROOT=str(given))
    assert from_given.get("parameters", 0) > 0, from_given

    nothing = _load(installed, elsewhere)
    assert nothing.get("error", "").startswith("hscl_zoo.zoo.releases.NotCachedError: Cannot load"), nothing
    assert "HSCL_ZOO_ROOT" in nothing["error"] and str(given) not in nothing["error"]

    in_checkout = _load(installed, REPO / "docs")  # a folder inside the checkout, nothing named
    assert in_checkout.get("parameters") == from_given["parameters"], in_checkout
