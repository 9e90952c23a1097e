"""Loading encoders: ``config.json`` + ``model.safetensors`` (or its shards and index), from the
Hub or a folder.

Saving and pushing them is :mod:`hscl_zoo.zoo.saving`; finding a source's files is
:mod:`hscl_zoo.zoo.sources`, whose errors and names this module re-exports as load's public face.
Sources ``hscl_zoo.load`` understands:

* a zoo name (``"hscl-beta-cifar100"``, or a tagged one, ``"hscl-beta-cifar10.cpu-10k-5ep"``): the
  files its registry entry pins, from a release folder, the Hub cache or the Hub
  (:mod:`hscl_zoo.zoo.releases`), every sha256 checked;
* ``"hf-hub:owner/repo"`` or ``"hf-hub:owner/repo@revision"``;
* ``"local-dir:/path"`` or a bare existing directory, as written by ``save_pretrained``, or a
  training run's output_dir (its ``hub/`` subfolder holds the model).

Downloads go through ``huggingface_hub.hf_hub_download`` into the standard Hub cache, so
``HF_HUB_OFFLINE``, ``HF_HUB_CACHE`` and ``local_files_only`` behave as everywhere else. Weights are
loaded strictly: every key the config's architecture expects must be in the files, and nothing
else; sharded weights are checked against their index (:mod:`hscl_zoo.zoo.shards`). The module
built is the one config.json's ``model_type`` names (:mod:`hscl_zoo.zoo.model_types`; none: an image
encoder), in float32 unless ``dtype`` asks for the stored precision or another.

A model folder is data, not code: config.json is checked against :mod:`hscl_zoo.zoo.schema` before
anything is built; the architecture is then built on the meta device and compared with the
safetensors header, so memory is allocated only for tensors the file really holds; and a local
folder's two files must lie inside it (no symlink out of it). Loading a folder never touches the
network or any file outside it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

import hscl_zoo.zoo.registry as registry
from hscl_zoo._files import sha256_file
from hscl_zoo.zoo.model_types import build_model
from hscl_zoo.zoo.releases import ChecksumMismatchError, NotCachedError
from hscl_zoo.zoo.schema import check_config, read_config
from hscl_zoo.zoo.shards import DTYPES, INDEX_NAME, WEIGHTS_NAME, WeightFiles, dtype_name, read_state, tensor_shapes
from hscl_zoo.zoo.sources import CONFIG_NAME, ModelSource, WeightsNotPublishedError, find_files, parse_source

__all__ = [
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "INDEX_NAME",
    "ModelSource",
    "WeightsNotPublishedError",
    "NotCachedError",
    "ChecksumMismatchError",
    "ConfigMismatchError",
    "parse_source",
    "load",
    "check_weights",
    "load_weights",
    "sha256_file",
]
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


class ConfigMismatchError(ValueError):
    """Weights whose keys or shapes differ from what config.json's architecture expects."""


def check_weights(model: nn.Module, weights: WeightFiles | str | os.PathLike[str], *, config_path: str | None = None) -> None:
    """Raise ``ConfigMismatchError`` naming every missing, unexpected or mis-shaped key if the
    weights (a safetensors file, or ``WeightFiles``) do not match ``model``. Reads the headers
    only, so ``model`` may live on the meta device and nothing is allocated for weights that do
    not fit."""
    files = _as_files(weights)
    state = tensor_shapes(files)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = sorted(f"{k}: file {state[k]} vs model {expected[k]}"
                    for k in set(state) & set(expected) if state[k] != expected[k])
    if missing or unexpected or shapes:
        def listing(keys: list[str]) -> str:
            return ", ".join(keys[:8]) + (f", ... ({len(keys)} in all)" if len(keys) > 8 else "")

        parts = [f"missing keys: {listing(missing)}" if missing else "",
                 f"unexpected keys: {listing(unexpected)}" if unexpected else "",
                 f"shape mismatches: {listing(shapes)}" if shapes else ""]
        config = config_path or CONFIG_NAME
        hint = ""
        if unexpected and all(k.startswith(_WRAPPER_PREFIXES) for k in unexpected):
            hint = " The file was saved from a wrapped model (DDP 'module.' or torch.compile '_orig_mod.');"
        what = getattr(model, "backbone_name", None) or type(model).__name__
        raise ConfigMismatchError(
            f"{files} does not match the {what} encoder described by {config} "
            f"({'; '.join(p for p in parts if p)}).{hint} Save the weights and the config from the same model "
            "with hscl_zoo.save_pretrained(model, directory).")


def _as_files(weights: WeightFiles | str | os.PathLike[str]) -> WeightFiles:
    if isinstance(weights, WeightFiles):
        return weights
    path = Path(weights)
    return WeightFiles({path.name: path})


def load_weights(model: nn.Module, weights: WeightFiles | str | os.PathLike[str], *, config_path: str | None = None) -> None:
    """Load safetensors weights (a file, or ``WeightFiles``) into ``model`` strictly, each tensor
    cast to the dtype of the model's own; weights that do not match are refused by
    ``check_weights`` before any tensor is read."""
    check_weights(model, weights, config_path=config_path)
    model.load_state_dict(read_state(_as_files(weights)), strict=True)


def _stored_dtype(config: dict[str, Any], config_path: Path) -> str:
    stored = config.get("torch_dtype", "float32")
    if stored not in DTYPES:
        raise ValueError(f"{config_path}: torch_dtype {stored!r} is not one of {list(DTYPES)}; re-save the model "
                         "with hscl_zoo.save_pretrained.")
    return stored


def _scored_name(entry: registry.ZooEntry) -> str:
    """``hscl-beta-cifar100.gpu-30ep: linear top-1 56.97 % (ResNet-18, 30 epochs on one GPU)``."""
    metric, value = entry.headline
    score = f": {metric} {value:.2f} %" if value is not None else ""
    return f"{entry.name}{score} ({entry.trained_with})"


def _target_device(device: str | torch.device | None) -> torch.device:
    """Where ``load`` puts the model, checked before anything is read: the CPU by default; a device
    torch does not know, or an accelerator this machine lacks, is a one-line ValueError."""
    if device is None:
        return torch.device("cpu")
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {device!r} is not a device torch knows; pass 'cpu', 'cuda', 'cuda:1', 'mps' or a "
                         "torch.device.") from None
    present = {"cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available}.get(target.type)
    if present is not None and not present():
        raise ValueError(f"device {device!r}: this machine has no {target.type.upper()} device that torch can use; "
                         "leave device out to load on the CPU.")
    return target


def load(
    source: str | os.PathLike[str] | registry.ZooEntry,
    device: str | torch.device | None = None,
    *,
    revision: str | None = None,
    local_files_only: bool | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    dtype: torch.dtype | str | None = None,
) -> nn.Module:
    """Load a trained encoder in eval mode; an image encoder comes with ``model.transform`` and
    ``model.class_names``.

    ``source`` is a zoo name (tagged, or bare for its default tag), ``hf-hub:owner/repo[@revision]``,
    ``local-dir:/path`` or an existing directory. A zoo name's files come from the first source
    that holds them with every sha256 matching (:mod:`hscl_zoo.zoo.releases`); Hub files come from
    the standard cache (``cache_dir`` overrides it); offline mode (``HF_HUB_OFFLINE=1`` or
    ``local_files_only=True``) never touches the network. Weights stored in bfloat16 or float16
    load into float32 modules unless ``dtype`` says otherwise (``"stored"``: as stored).
    ``device`` defaults to CPU; one torch does not know, or CUDA/MPS on a machine without it, is a
    ValueError before anything is read.

    Example::

        model = hscl_zoo.load("hscl-beta-cifar100")         # its best published tag
        probs = model.predict(PIL.Image.open("cat.png"))   # (1, 100) class probabilities
    """
    target_device = _target_device(device)
    src = parse_source(source, revision)
    config_path, weights = find_files(src, local_files_only=local_files_only, cache_dir=cache_dir)

    config = read_config(config_path, check=False)
    if not isinstance(config, dict) or "model_type" not in config:
        config = check_config(config, str(config_path))
    stored = _stored_dtype(config, config_path)
    target = DTYPES[stored if dtype == "stored" else dtype_name(dtype if dtype is not None else torch.float32)]
    with torch.device("meta"):
        check_weights(build_model(config, str(config_path)), weights, config_path=str(config_path))
    model = build_model(config, str(config_path))
    load_weights(model, weights, config_path=str(config_path))
    if hasattr(model, "training_summary"):
        model.training_summary = config.get("training")
    if src.kind == "zoo":
        print(f"hscl_zoo: loaded {_scored_name(src.entry)}", file=sys.stderr)
    return model.to(device=target_device, dtype=target).eval()
