"""Package attributes imported on first use (PEP 562), so that importing a package costs only the
modules its caller touches: ``hscl-zoo list`` reads the registry without loading torch, and
``import hscl_zoo.losses`` does not load timm or datasets."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, giving each name of ``exports`` (name ->
    module that defines it) from its module when first asked for, and a submodule by its name."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
        elif importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
