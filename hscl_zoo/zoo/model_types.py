"""Which class a model folder's config.json builds: one table from ``model_type`` to a class path.

A config without ``model_type`` is an image encoder (``hscl_zoo.models.ContrastiveEncoder``, as
every folder written before model types existed). Any other encoder plugs in with one line,
``"model-type": "package.module:Class"``, whose class has ``from_config(config: dict)`` and a
``state_dict()``; its module is imported only when a folder of that type is loaded, so the zoo
never imports what it does not load.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from torch import nn

__all__ = ["IMAGE_ENCODER", "MODEL_TYPES", "register_model_type", "model_class", "build_model"]

IMAGE_ENCODER = "hscl_zoo.models:ContrastiveEncoder"
"""What a config without ``model_type`` builds."""

MODEL_TYPES: dict[str, str] = {
    "graph-gin": "hscl_zoo.graphs.encoder:GraphEncoder",
}
"""model_type -> "module:Class" of the encoder that ``from_config`` builds."""


def register_model_type(model_type: str, path: str, *, replace: bool = False) -> None:
    """Let folders whose config.json says ``"model_type": model_type`` load as ``path``'s class."""
    module, _, name = path.partition(":")
    if not isinstance(model_type, str) or not model_type or not module or not name.isidentifier():
        raise ValueError(f"register_model_type needs a model_type name and a 'package.module:Class' path, got "
                         f"{model_type!r} -> {path!r}.")
    if model_type in MODEL_TYPES and MODEL_TYPES[model_type] != path and not replace:
        raise ValueError(f"model_type {model_type!r} already loads as {MODEL_TYPES[model_type]}; pass replace=True "
                         "to change it.")
    MODEL_TYPES[model_type] = path


def model_class(config: Mapping[str, Any], where: str) -> type[nn.Module]:
    """The class a config builds; a ``ValueError`` starting with ``where`` for an unknown type."""
    model_type = config.get("model_type")
    if model_type is None:
        path = IMAGE_ENCODER
    elif isinstance(model_type, str) and model_type in MODEL_TYPES:
        path = MODEL_TYPES[model_type]
    else:
        raise ValueError(f"{where}: model_type {model_type!r} is not one hscl_zoo loads (known: "
                         f"{', '.join(sorted(MODEL_TYPES))}; none means an image encoder); register it with "
                         "hscl_zoo.zoo.model_types.register_model_type.")
    module, _, name = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{where}: model_type {model_type!r} loads as {path}, which cannot be imported ({err}); "
                         "install the hscl_zoo version that wrote the folder.") from None
    return cls


def build_model(config: Mapping[str, Any], where: str) -> nn.Module:
    """An untrained module of the config's type, built by its class's ``from_config``; a config
    the class refuses is a ``ValueError`` starting with ``where``."""
    cls = model_class(config, where)
    try:
        return cls.from_config(dict(config))
    except (ValueError, TypeError) as err:
        raise ValueError(f"{where}: {err}") from None
