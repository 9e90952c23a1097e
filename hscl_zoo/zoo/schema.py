"""The schema of a model folder's ``config.json``, declared once: a folder is data, not code.

``hscl_zoo.load`` checks a config against it before anything is built, and ``save_pretrained``
before anything is written, so a folder that saves always loads. Every key the loader reads is in
one of the tables below with its type and bounds; ``model_args`` and ``pretrained_cfg`` hold those
keys only. In particular no config can hold ``pretrained``, ``pretrained_cfg_overlay``,
``checkpoint_path``, a URL or a file path for timm: loading a folder never touches the network or
a file outside it. Other top-level keys are ignored.

The bounds keep a few hundred bytes of JSON from asking for gigabytes, and each covers every real
use with room to spare:

* ``num_classes`` <= 200,000: the largest label set timm ships a head for is Bamboo's 115,217
  classes (ImageNet-21k has 21,843).
* ``proj_hidden_dim``, ``proj_dim`` <= 16,384: the paper uses 512 and 128; the widest projectors
  in the contrastive literature (Barlow Twins, VICReg) are 8,192.
* ``image_size`` <= 2,048: twice timm's largest pretrained input (1,024 px, Sapiens).
* ``image_size / patch_size`` <= 64: at most 64 x 64 patch tokens, timm's largest grid (Sapiens,
  16-px patches at 1,024 px); attention memory grows with the square of the token count.
* the file itself <= 16 MiB (200,000 class names of 80 characters fit) and nested at most 32
  levels deep (a saved config is 4 deep), checked on the raw text before ``json`` recurses.

Numbers must be finite, ``std`` positive, and a bool is not an int. Each violation is one
``ConfigSchemaError`` (a ``ValueError``) naming the file, the key and the fix.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hscl_zoo.data.transforms import CROP_MODES, INTERPOLATIONS

__all__ = ["CONFIG_LIBRARY_NAME", "ConfigSchemaError", "TIMM_KWARGS", "MAX_CONFIG_BYTES", "MAX_DEPTH", "MAX_NUM_CLASSES",
           "MAX_PROJ_DIM", "MAX_IMAGE_SIZE", "MAX_PATCH_GRID", "check_config", "parse_json", "parse_config",
           "read_config"]

CONFIG_LIBRARY_NAME = "hscl_zoo"
"""Marks a config.json as an hscl_zoo encoder (as opposed to a plain timm checkpoint)."""
MAX_CONFIG_BYTES = 16 * 2**20
MAX_DEPTH = 32
MAX_NUM_CLASSES = 200_000
MAX_PROJ_DIM = 16_384
MAX_IMAGE_SIZE = 2_048
MAX_PATCH_GRID = 64

_RESAVE = "re-save the model with hscl_zoo.save_pretrained"
_ARCHITECTURE = re.compile(r"[a-z0-9_]+(\.[a-z0-9_]+)?")


class ConfigSchemaError(ValueError):
    """A config.json that the schema refuses: the message names the file, the key and the fix."""


Check = Callable[[Any], "str | None"]
"""Returns what is wrong with a value (``"must be ..., got ..."``), or None when it is fine."""


@dataclass(frozen=True)
class Field:
    """One key of config.json: how its value is checked, whether it must be there, and the fix."""

    check: Check
    required: bool = True
    fix: str = _RESAVE


def _show(value: Any) -> str:
    text = json.dumps(value, allow_nan=True) if isinstance(value, (bool, int, float, str, type(None))) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _integer(low: int, high: int) -> Check:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer, got {_show(value)}"
        if not low <= value <= high:
            return f"must be between {low} and {high}, got {value}"
        return None
    return check


def _number(low: float, high: float, *, open_low: bool = False, open_high: bool = False) -> Check:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"must be a finite number, got {_show(value)}"
        if value < low or value > high or (open_low and value == low) or (open_high and value == high):
            return f"must be in {'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}, got {value}"
        return None
    return check


def _triplet(*, positive: bool) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, list) or len(value) != 3:
            return f"must list 3 numbers (one per RGB channel), got {_show(value)}"
        for item in value:
            if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item):
                return f"must hold finite numbers, got {_show(item)}"
            if positive and item <= 0:
                return f"must be positive per channel, got {item}"
        return None
    return check


def _choice(options: tuple[str, ...]) -> Check:
    def check(value: Any) -> str | None:
        return None if isinstance(value, str) and value in options else f"must be one of {list(options)}, got {_show(value)}"
    return check


def _architecture(value: Any) -> str | None:
    if isinstance(value, str) and _ARCHITECTURE.fullmatch(value):
        return None
    return f"must be a timm model name such as 'resnet18' (lowercase letters, digits, '_', one optional '.tag'), got {_show(value)}"


def _optional_bool(value: Any) -> str | None:
    return None if value is None or isinstance(value, bool) else f"must be true, false or null, got {_show(value)}"


def _input_size(value: Any) -> str | None:
    check = _integer(1, MAX_IMAGE_SIZE)
    if not isinstance(value, list) or len(value) != 3 or value[0] != 3 or any(check(v) for v in value):
        return f"must be [3, size, size] with integer sizes up to {MAX_IMAGE_SIZE}, got {_show(value)}"
    return None


def _names(value: Any) -> str | None:
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        return f"must be a list of strings, got {_show(value)}"
    return None


def _object(value: Any) -> str | None:
    return None if isinstance(value, dict) else f"must be a JSON object, got {_show(value)}"


def _optional_object(value: Any) -> str | None:
    return None if value is None else _object(value)


TOP_LEVEL: dict[str, Field] = {
    "library_name": Field(_choice((CONFIG_LIBRARY_NAME,)), required=False),
    "architecture": Field(_architecture),
    "num_classes": Field(_integer(1, MAX_NUM_CLASSES)),
    "num_features": Field(_integer(1, 2**20), required=False),
    "label_names": Field(_names, required=False),
    "pretrained_cfg": Field(_object),
    "model_args": Field(_object),
    "torch_dtype": Field(_choice(("float32", "bfloat16", "float16")), required=False,
                         fix="save_pretrained records the stored precision; re-save the model with it"),
    "training": Field(_optional_object, required=False,
                      fix="give the training summary as an object, or remove it"),
}
"""The top-level keys the loader reads (others are ignored)."""

PRETRAINED_CFG: dict[str, Field] = {
    "input_size": Field(_input_size),
    "mean": Field(_triplet(positive=False)),
    "std": Field(_triplet(positive=True)),
    "interpolation": Field(_choice(tuple(INTERPOLATIONS)), required=False),
    "crop_pct": Field(_number(0.0, 1.0, open_low=True), required=False),
    "crop_mode": Field(_choice(CROP_MODES), required=False),
    "num_classes": Field(_integer(1, MAX_NUM_CLASSES), required=False),
}
"""The preprocessing keys: all that ``pretrained_cfg`` may hold (timm's ``url``, ``file`` or
``hf_hub_id`` would name weights elsewhere)."""

MODEL_ARGS: dict[str, Field] = {
    "image_size": Field(_integer(1, MAX_IMAGE_SIZE)),
    "small_stem": Field(_optional_bool),
    "proj_hidden_dim": Field(_integer(1, MAX_PROJ_DIM)),
    "proj_dim": Field(_integer(1, MAX_PROJ_DIM)),
    "img_size": Field(_integer(1, MAX_IMAGE_SIZE), required=False),
    "patch_size": Field(_integer(1, MAX_IMAGE_SIZE), required=False),
    "drop_rate": Field(_number(0.0, 1.0, open_high=True), required=False),
    "drop_path_rate": Field(_number(0.0, 1.0, open_high=True), required=False),
}
"""All that ``model_args`` may hold: the encoder's own arguments, then ``TIMM_KWARGS``."""

TIMM_KWARGS = ("img_size", "patch_size", "drop_rate", "drop_path_rate")
"""The ``model_args`` passed on to ``timm.create_model``: shapes and regularisation, nothing that
names weights, files or URLs."""

_SECTIONS = {"": TOP_LEVEL, "model_args.": MODEL_ARGS, "pretrained_cfg.": PRETRAINED_CFG}


def _error(where: str, key: str, problem: str, fix: str) -> ConfigSchemaError:
    return ConfigSchemaError(f"{where}: {key} {problem}; {fix}.")


def _check_section(where: str, prefix: str, values: Mapping[str, Any], fields: dict[str, Field]) -> None:
    if prefix:
        unknown = [key for key in values if key not in fields]
        if unknown:
            raise _error(where, f"{prefix}{unknown[0]}", "is not a key a model folder may hold",
                         f"remove it ({prefix[:-1]} may hold only {', '.join(fields)}; a folder's weights are its "
                         "model.safetensors, never a download or another file)")
    for key, field in fields.items():
        if key in values:
            problem = field.check(values[key])
            if problem:
                raise _error(where, f"{prefix}{key}", problem, field.fix)


def _missing(config: Mapping[str, Any]) -> list[str]:
    missing = []
    for prefix, fields in _SECTIONS.items():
        section = config.get(prefix[:-1], {}) if prefix else config
        if isinstance(section, Mapping):
            missing += [f"{prefix}{key}" for key, field in fields.items() if field.required and key not in section]
    return missing


def check_config(config: Any, where: str = "config") -> dict[str, Any]:
    """``config`` if it is a loadable encoder config; else a one-line ``ConfigSchemaError`` that
    starts with ``where`` (the file) and names the key and the fix."""
    if not isinstance(config, dict):
        raise ConfigSchemaError(f"{where}: must hold a JSON object, got {_show(config)}; {_RESAVE}.")
    missing = _missing(config)
    if missing:
        hint = ""
        if config.get("library_name") != CONFIG_LIBRARY_NAME and "architecture" in config:
            hint = (" It looks like a plain timm checkpoint config; load that with "
                    "timm.create_model('hf-hub:<repo>', pretrained=True) instead.")
        raise ConfigSchemaError(f"{where}: not an hscl_zoo encoder config: missing {', '.join(missing)}.{hint} "
                                "Write configs with hscl_zoo.save_pretrained(model, directory).")
    for prefix, fields in _SECTIONS.items():
        _check_section(where, prefix, config[prefix[:-1]] if prefix else config, fields)

    model_args, image_size = config["model_args"], config["model_args"]["image_size"]
    input_size = config["pretrained_cfg"]["input_size"]
    if input_size != [3, image_size, image_size]:
        raise _error(where, "pretrained_cfg.input_size", f"{input_size} disagrees with model_args.image_size "
                     f"{image_size}", _RESAVE)
    if model_args.get("img_size", image_size) != image_size:
        raise _error(where, "model_args.img_size", f"{model_args['img_size']} disagrees with model_args.image_size "
                     f"{image_size}", "remove it (image_size sets it)")
    if image_size / model_args.get("patch_size", image_size) > MAX_PATCH_GRID:
        raise _error(where, "model_args.patch_size", f"{model_args['patch_size']} gives more than {MAX_PATCH_GRID} "
                     f"patches per side at image_size {image_size}",
                     f"use patch_size >= {math.ceil(image_size / MAX_PATCH_GRID)}")
    return config


def _depth_exceeds(text: str, limit: int) -> bool:
    """Whether JSON text nests arrays/objects deeper than ``limit``, strings skipped; checked on
    the raw text because ``json.loads`` recurses once per level."""
    depth = 0
    for token in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]', text):
        bracket = token.group()
        if bracket in "[{":
            depth += 1
            if depth > limit:
                return True
        elif bracket in "]}":
            depth -= 1
    return False


def parse_json(text: str, where: str = "config") -> Any:
    """Parse config.json text, its nesting bounded before ``json`` recurses; no schema check."""
    if _depth_exceeds(text, MAX_DEPTH):
        raise ConfigSchemaError(f"{where}: nests deeper than {MAX_DEPTH} levels (a saved config is 4 deep); {_RESAVE}.")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigSchemaError(f"{where}: is not valid JSON ({err}); {_RESAVE}.") from None


def parse_config(text: str, where: str = "config") -> dict[str, Any]:
    """Parse config.json text (nesting bounded before parsing) and check it against the schema."""
    return check_config(parse_json(text, where), where)


def read_config(path: str | os.PathLike[str], *, check: bool = True) -> Any:
    """Read a config.json, reading at most ``MAX_CONFIG_BYTES`` (+1) bytes of it, and check it
    against the image encoder's schema (``check=False``: parse only, for a config with a
    ``model_type`` whose own class checks it)."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigSchemaError(f"{path}: is larger than {MAX_CONFIG_BYTES // 2**20} MiB (a saved config is a few "
                                f"KiB); {_RESAVE}.")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigSchemaError(f"{path}: is not valid JSON ({err}); {_RESAVE}.") from None
    return parse_config(text, str(Path(path))) if check else parse_json(text, str(Path(path)))
