"""Keyword options gathered into a settings dataclass: a public function keeps the keyword-only
options its users pass (``linear_probe(..., epochs=30)``) while its body reads one object."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["gather_options", "split_options"]


def split_options(cls: type[T], options: dict[str, Any]) -> tuple[T, dict[str, Any]]:
    """``cls`` (a dataclass) built from the `options` it names, and the options it does not name
    (a function that passes them on, as ``evaluate_model`` does its data source's)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    rest = {key: value for key, value in options.items() if key not in names}
    return cls(**{key: value for key, value in options.items() if key in names}), rest


def gather_options(cls: type[T], options: dict[str, Any], function: str) -> T:
    """``cls`` (a dataclass) built from `options`; an option it does not name raises TypeError as
    Python does for an unexpected keyword argument of `function`."""
    settings, rest = split_options(cls, options)
    if rest:
        raise TypeError(f"{function}() got an unexpected keyword argument {sorted(rest)[0]!r}")
    return settings
