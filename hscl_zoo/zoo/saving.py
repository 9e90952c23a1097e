"""Saving an encoder in the Hub's layout (``model.safetensors``, or shards and their index, in
float32, bfloat16 or float16, + ``config.json`` with its training summary and stored precision)
and pushing it to a Hub model repo; :mod:`hscl_zoo.zoo.hub` loads it back.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi
import torch
from torch import nn

from hscl_zoo._files import sha256_file
from hscl_zoo._version import __version__
from hscl_zoo.zoo.model_types import MODEL_TYPES
from hscl_zoo.zoo.schema import check_config
from hscl_zoo.zoo.shards import INDEX_NAME, WEIGHTS_NAME, cast_state, dtype_name, write_weights
from hscl_zoo.zoo.sources import CONFIG_NAME, check_repo_id

__all__ = ["TRAINING_KEYS", "DEFAULT_MAX_SHARD_SIZE", "PushResult", "save_pretrained", "push_to_hub"]

DEFAULT_MAX_SHARD_SIZE = "5GB"
"""huggingface_hub's default: one file for any encoder the zoo trains; ``"15MiB"`` fits a ResNet-18
in bfloat16 (22 MiB) into files a GPU machine may hand back (16 MiB each)."""

TRAINING_KEYS = ("dataset", "method", "hyperparameters", "epochs", "global_batch_size",
                 "expected_negatives_per_anchor")
"""Keys a training summary must have (others are kept as given). ``expected_negatives_per_anchor``
is the count the global batch size implies
(``hscl_zoo.publishing.hub_folder.expected_negatives_per_anchor``), not a measurement."""


@dataclass(frozen=True)
class PushResult:
    """What a push produced: the commit to pin and the weights' sha256, i.e. a registry line."""

    repo_id: str
    revision: str
    sha256: str
    commit_url: str


def _is_image_encoder(model: nn.Module) -> bool:
    """A ``hscl_zoo.models.ContrastiveEncoder``: its class describes it by ``model_config()`` (read
    on the class: torch.compile's wrapper forwards its inner module's attributes)."""
    return callable(getattr(type(model), "model_config", None))


def _unwrap(model: nn.Module) -> nn.Module:
    """The encoder inside DDP / torch.compile wrappers: a ContrastiveEncoder, or a module of a
    registered model type (one with ``to_config()``)."""
    while not _is_image_encoder(model) and not callable(getattr(type(model), "to_config", None)):
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            raise TypeError(f"save_pretrained expects a hscl_zoo ContrastiveEncoder (optionally wrapped by DDP or "
                            f"torch.compile), got {type(model).__name__}. Build one with hscl_zoo.create_model.")
        model = inner
    return model


def _check_training(training: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(training, Mapping):
        raise ValueError(f"training must be a dict summarising the run, got {type(training).__name__}.")
    missing = [k for k in TRAINING_KEYS if k not in training]
    if missing:
        raise ValueError(f"training summary lacks {missing}; give all of {list(TRAINING_KEYS)} "
                         "(e.g. dataset='cifar100', method='hscl-beta', hyperparameters={'beta': 1.0, ...}, "
                         "epochs=200, global_batch_size=512, expected_negatives_per_anchor=1022).")
    if not isinstance(training["hyperparameters"], Mapping):
        raise ValueError("training['hyperparameters'] must be a dict of the method's hyperparameters.")
    return dict(training)


def _config_json(model: nn.Module, training: Mapping[str, Any] | None, stored: str) -> str:
    if _is_image_encoder(model):
        config = model.model_config()
    else:
        config = dict(model.to_config())
        if config.get("model_type") not in MODEL_TYPES:
            raise ValueError(f"{type(model).__name__}.to_config() gives model_type {config.get('model_type')!r}, "
                             f"which no loader knows ({', '.join(sorted(MODEL_TYPES))}); register it with "
                             "hscl_zoo.zoo.model_types.register_model_type.")
    config["torch_dtype"] = stored
    if training is not None:
        config["training"] = _check_training(training)
    if _is_image_encoder(model):
        check_config(config, where=f"the {CONFIG_NAME} to save")
    try:
        return json.dumps(config, indent=2, sort_keys=False, allow_nan=False) + "\n"
    except (TypeError, ValueError) as err:
        raise ValueError(f"The config is not JSON-serialisable ({err}): timm keyword arguments and the training "
                         "summary must hold plain numbers, strings, lists and dicts.") from None


def save_pretrained(
    model: nn.Module,
    save_directory: str | os.PathLike[str],
    *,
    training: Mapping[str, Any] | None = None,
    dtype: torch.dtype | str = torch.float32,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write ``model.safetensors`` (or, above ``max_shard_size``, shards
    ``model-0000k-of-0000N.safetensors`` and ``model.safetensors.index.json``, split by
    ``huggingface_hub.split_torch_state_dict_into_shards``) and ``config.json`` (with the training
    summary) to a folder.

    ``dtype`` (``torch.float32``, ``torch.bfloat16`` or ``torch.float16``) is the precision the
    floating-point tensors are stored in, recorded as config.json's ``torch_dtype``; ``load``
    gives float32 modules back unless asked otherwise.

    The config is checked against :mod:`hscl_zoo.zoo.schema` first, so a folder that saves also
    loads (a model built with timm keyword arguments outside ``schema.TIMM_KWARGS`` is refused).
    Both files are written to temporary names first and renamed into place only when both are
    complete, so a failed save never damages a good folder; weight files of an earlier save that
    the new one does not write are then removed, and other files (a README.md card, metrics) are
    left alone. DDP / torch.compile wrappers are unwrapped so keys carry no prefix. ``training``
    needs the keys in ``TRAINING_KEYS``. Returns the folder.
    """
    encoder = _unwrap(model)
    stored = dtype_name(dtype)
    config_text = _config_json(encoder, training, stored)
    state = cast_state({k: v.detach().to("cpu").contiguous() for k, v in encoder.state_dict().items()}, stored)

    target = Path(save_directory).expanduser()
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"{target} exists and is not a directory; choose a folder to save into.")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{target.name}.", dir=target.parent) as staging:
        staging_dir = Path(staging)
        written = write_weights(state, staging_dir, max_shard_size=max_shard_size)
        (staging_dir / CONFIG_NAME).write_text(config_text, encoding="utf-8")
        target.mkdir(exist_ok=True)
        for name in [*written, CONFIG_NAME]:
            os.replace(staging_dir / name, target / name)
    for stale in (p for p in target.glob("model*.safetensors*") if p.name not in written):
        if stale.name == INDEX_NAME or stale.name.endswith(".safetensors"):
            stale.unlink()
    return target


def push_to_hub(
    model: nn.Module,
    repo_id: str,
    *,
    training: Mapping[str, Any] | None = None,
    card: str | None = None,
    extra_files: Mapping[str, str | bytes] | None = None,
    commit_message: str = "Upload hscl_zoo encoder",
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
) -> PushResult:
    """Save the model (as ``save_pretrained``) with an optional README card and extra files, and
    upload the folder to a Hub model repo, creating it if needed.

    Returns the commit and the weights' sha256 (``hf-hub:repo@commit`` loads exactly these files).
    """
    check_repo_id(repo_id, repo_id)
    with tempfile.TemporaryDirectory() as staging:
        folder = save_pretrained(model, Path(staging) / "model", training=training)
        if card is not None:
            (folder / "README.md").write_text(card, encoding="utf-8")
        for name, content in (extra_files or {}).items():
            if Path(name).name in (CONFIG_NAME, WEIGHTS_NAME, INDEX_NAME, "README.md") or Path(name).is_absolute():
                raise ValueError(f"extra file {name!r} would overwrite the model files or leave the repo.")
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        sha256 = sha256_file(folder / WEIGHTS_NAME)
        api = HfApi(token=token, library_name="hscl_zoo", library_version=__version__)
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=repo_id, folder_path=folder, repo_type="model",
                                   commit_message=commit_message, revision=revision)
    return PushResult(repo_id=repo_id, revision=commit.oid, sha256=sha256, commit_url=commit.commit_url)
