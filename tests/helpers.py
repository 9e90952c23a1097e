"""Helpers the test files share (pytest puts tests/ on the path)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(folder: str, name: str) -> ModuleType:
    """Import `<folder>/<name>.py` of the repository (recipes/, benchmarks/: not packages) from its
    file, once per test session, with its folder first on sys.path while it loads, as when it runs
    as a script (benchmarks import their sibling `provenance`)."""
    module_name = f"_hscl_{folder}_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, REPO / folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        sys.path.insert(0, str(REPO / folder))
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(REPO / folder))
    return sys.modules[module_name]
