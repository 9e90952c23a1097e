"""Helpers the test files share (pytest puts tests/ on the path)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(folder: str, name: str) -> ModuleType:
    """Import `<folder>/<name>.py` of the repository (recipes/, benchmarks/: not packages) from its
    file, once per test session."""
    module_name = f"_hscl_{folder}_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, REPO / folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]
