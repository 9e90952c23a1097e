"""What each entry point imports, checked in a fresh interpreter through sys.modules (timings are
benchmarks/import_time.py's job): the loss modules need torch and nothing heavier, and the
command line's list, info and --help need no torch at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hscl_zoo.zoo import registry

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "torchvision", "timm", "datasets", "pandas", "accelerate", "sklearn", "PIL")


def imported_after(code: str) -> tuple[set[str], str]:
    """The HEAVY top-level modules a fresh interpreter holds after running ``code``, and its stdout."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300, check=True)
    out, _, last = done.stdout.rstrip("\n").rpartition("\n")
    return set(json.loads(last)) & set(HEAVY), out


def test_the_losses_import_torch_and_nothing_heavier():
    loaded, _ = imported_after(
        "from hscl_zoo.losses import *\n"
        "from hscl_zoo.losses import ContrastiveLoss, build_loss, METHODS\n"
        "import hscl_zoo.losses.diagnostics, hscl_zoo.losses.distributed, hscl_zoo.losses.fused, "
        "hscl_zoo.losses.reference\n"
        "build_loss('hscl-beta')\n"
    )
    assert loaded == {"torch"}


@pytest.mark.parametrize("argv", [["list"], ["info", "hscl-beta-tinyimagenet"], ["list", "scl-*", "--published"]])
def test_list_and_info_import_no_torch(argv):
    code = f"from hscl_zoo.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass"
    loaded, out = imported_after(code)
    assert loaded == set()
    if argv == ["list"]:
        table_1, table_2 = 5 * 4, 4 * 5  # methods x datasets of the paper's two tables
        own_names = [n for n, r in registry._RELEASES.items() if "." in n or r["method"] == "hscl-tau"]
        assert len(out.splitlines()) == 1 + table_1 + table_2 + len(own_names)  # a header, then a row per name
        assert any(line.split()[0] == "hscl-tau-tinyimagenet" and line.endswith("not published") for line in out.splitlines())
    elif argv[0] == "info":
        assert "train it:    hscl-zoo train --config hscl-beta-tinyimagenet" in out


def test_help_imports_no_torch():
    loaded, out = imported_after("from hscl_zoo.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass")
    assert loaded == set() and "hscl-zoo list" in out


@pytest.mark.slow  # three fresh interpreters importing torch: 11 s on two cores
def test_package_root_loads_names_on_first_use():
    loaded, out = imported_after("import hscl_zoo\nprint(hscl_zoo.list_models('ucl-*'))")
    assert loaded == set() and "ucl-cifar10" in out
    loaded, out = imported_after("import hscl_zoo\nprint(hscl_zoo.ContrastiveLoss.__module__)")
    assert loaded == {"torch"} and out == "hscl_zoo.losses.objective"
    loaded, _ = imported_after("import hscl_zoo\nhscl_zoo.load")
    assert "torch" in loaded  # the loader itself; timm comes only with the model class a folder names
