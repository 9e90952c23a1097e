"""Keyword options gathered into a settings dataclass: a public function keeps the keyword-only
options its users pass (``linear_probe(..., epochs=30)``) while its body reads one object."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["split_options"]


def split_options(cls: type[T], options: dict[str, Any], function: str, *,
                  rest_allowed: bool = False) -> tuple[T, dict[str, Any]]:
    """``cls`` (a dataclass) built from the `options` it names, and the options it does not name.
    Without `rest_allowed`, an option it does not name raises TypeError as Python does for a
    function's unexpected keyword argument (`function` names it)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    rest = {key: value for key, value in options.items() if key not in names}
    if rest and not rest_allowed:
        raise TypeError(f"{function}() got an unexpected keyword argument {sorted(rest)[0]!r}")
    return cls(**{key: value for key, value in options.items() if key in names}), rest
