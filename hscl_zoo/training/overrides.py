"""Reading `--key value` settings: the command line's grammar and each value checked against the
type a `PretrainConfig` field is annotated with (`hscl_zoo.training.config` passes the types)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

__all__ = ["coerce", "parse_value", "split_argv"]


def parse_value(key: str, raw: str, allowed: tuple[type, ...]) -> Any:
    """A command-line value: kept as text for text keys (so `--mixed_precision no` stays "no"),
    parsed as a YAML scalar otherwise; `null` / `none` unset a key that may be unset."""
    if raw.strip().lower() in ("null", "none", "~") and type(None) in allowed:
        return None
    if str in allowed:
        return raw
    for number in (int, float):
        if number in allowed or (number is int and float in allowed):
            try:
                return number(raw)
            except ValueError:
                pass
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as error:
        raise ValueError(f"--{key} {raw!r} is not a valid value: {' '.join(str(error).split())}") from None


def coerce(key: str, value: Any, allowed: tuple[type, ...], source: str) -> Any:
    """Check a value against the field's annotated types; ints are accepted where floats are."""
    if value is None and type(None) in allowed:
        return None
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if int in allowed and isinstance(value, float) and value.is_integer() and float not in allowed:
        return int(value)
    if str in allowed and isinstance(value, bool):
        return "yes" if value else "no"  # YAML 1.1 reads `mixed_precision: no` as false
    if str in allowed and isinstance(value, (int, float)):
        return str(value)
    if any(t is not type(None) and isinstance(value, t) and not (t is int and isinstance(value, bool)) for t in allowed):
        return value
    names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
    raise ValueError(f"{source}: {key}={value!r} must be {names}.")


def split_argv(argv: list[str], is_flag: Callable[[str], bool]) -> dict[str, str]:
    """``--key value`` / ``--key=value`` pairs as text; a key for which `is_flag` holds, given bare
    (last, or before the next --key), reads as "true"."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ValueError(f"unexpected argument {arg!r}: settings are given as --key value.")
        key = arg[2:]
        if "=" in key:
            key, value = key.split("=", 1)
        elif is_flag(key) and (i + 1 == len(argv) or argv[i + 1].startswith("--")):
            value = "true"
        elif i + 1 < len(argv):
            value = argv[i + 1]
            i += 1
        else:
            raise ValueError(f"{arg} needs a value: --{key} VALUE.")
        out[key] = value
        i += 1
    return out
