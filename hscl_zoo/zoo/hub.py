"""Loading encoders: ``model.safetensors`` + ``config.json``, from the Hub or a folder.

Saving and pushing them is :mod:`hscl_zoo.zoo.saving`. Sources ``hscl_zoo.load`` understands:

* a zoo name (``"hscl-beta-cifar100"``): the registry's Hub repo at its pinned revision, with the
  weights' sha256 checked;
* ``"hf-hub:owner/repo"`` or ``"hf-hub:owner/repo@revision"``;
* ``"local-dir:/path"`` or a bare existing directory, as written by ``save_pretrained``, or a
  training run's output_dir (its ``hub/`` subfolder holds the model).

Downloads go through ``huggingface_hub.hf_hub_download`` into the standard Hub cache, so
``HF_HUB_OFFLINE``, ``HF_HUB_CACHE`` and ``local_files_only`` behave as everywhere else. Weights are
loaded strictly: every key the config's architecture expects must be in the file, and nothing else.

A model folder is data, not code: config.json is checked against :mod:`hscl_zoo.zoo.schema` before
anything is built; the architecture is then built on the meta device and compared with the
safetensors header, so memory is allocated only for tensors the file really holds; and a local
folder's two files must lie inside it (no symlink out of it). Loading a folder never touches the
network or any file outside it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import constants, hf_hub_download
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import validate_repo_id
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

import hscl_zoo.zoo.registry as registry
from hscl_zoo._version import __version__
from hscl_zoo.models import ContrastiveEncoder
from hscl_zoo.zoo.schema import read_config

__all__ = [
    "CONFIG_NAME",
    "WEIGHTS_NAME",
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

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
RUN_MODEL_FOLDER = "hub"
"""The subfolder of a training run's output_dir that holds its model; ``local-dir:RUN`` finds it."""
RUN_SIGNS = ("metrics.jsonl", "checkpoints")
"""What a training run writes into its output_dir before its model."""
_HUB_PREFIX = "hf-hub:"
_LOCAL_PREFIX = "local-dir:"
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


class WeightsNotPublishedError(LookupError):
    """A zoo name whose weights are not on the Hub yet."""


class NotCachedError(FileNotFoundError):
    """The Hub cannot be reached (or offline mode is on) and the file is not in the cache."""


class ChecksumMismatchError(ValueError):
    """A weights file whose sha256 differs from the one the registry pins."""


class ConfigMismatchError(ValueError):
    """Weights whose keys or shapes differ from what config.json's architecture expects."""


@dataclass(frozen=True)
class ModelSource:
    """Where ``load`` reads a model from: ``kind`` is ``"zoo"``, ``"hf-hub"`` or ``"local-dir"``."""

    kind: str
    repo_id: str | None = None
    revision: str | None = None
    path: Path | None = None
    entry: registry.ZooEntry | None = None


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in blocks (never whole into memory)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _env_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"} or bool(
        constants.HF_HUB_OFFLINE)


def check_repo_id(repo_id: str, source: str) -> str:
    """``repo_id`` if it names a Hub repo (owner/name); else a ValueError quoting ``source``."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise ValueError(f"{source!r} does not name a Hub repo ({err}). Use 'hf-hub:owner/name[@revision]'.") from None
    if "/" not in repo_id:
        raise ValueError(f"{source!r} does not name a Hub repo: expected 'hf-hub:owner/name[@revision]'.")
    return repo_id


def parse_source(source: str | os.PathLike[str] | registry.ZooEntry, revision: str | None = None) -> ModelSource:
    """Resolve what ``load`` was given into a zoo entry, a Hub repo (+ revision) or a local directory.

    Raises ``ValueError`` for an unknown name (listing the closest zoo names), for conflicting
    revisions, and ``FileNotFoundError`` for a ``local-dir:`` that does not exist.
    """
    if isinstance(source, registry.ZooEntry):
        return _zoo_source(source, revision)
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str) or not source:
        raise ValueError(f"A model source must be a zoo name, 'hf-hub:owner/name' or a directory; got {source!r}.")

    if source.startswith(_HUB_PREFIX):
        repo_id, _, pinned = source[len(_HUB_PREFIX):].partition("@")
        if "@" in pinned:
            raise ValueError(f"{source!r} has more than one '@'; use 'hf-hub:owner/name@revision'.")
        if pinned and revision and pinned != revision:
            raise ValueError(f"{source!r} pins revision {pinned!r} but revision={revision!r} was passed; give one.")
        return ModelSource("hf-hub", repo_id=check_repo_id(repo_id, source), revision=pinned or revision)

    if source.startswith(_LOCAL_PREFIX):
        path = Path(os.path.expanduser(source[len(_LOCAL_PREFIX):]))
        if not path.is_dir():
            raise FileNotFoundError(f"{source!r}: no such directory {path}. Point local-dir: at a folder written by "
                                    "hscl_zoo.save_pretrained (config.json + model.safetensors).")
        return _local_source(path, revision)

    if registry.is_model(source):
        return _zoo_source(registry.info(source), revision)

    path = Path(os.path.expanduser(source))
    if path.is_dir():
        return _local_source(path, revision)
    if source.startswith((os.sep, ".", "~")) or source.count("/") > 1 or (os.altsep and os.altsep in source):
        raise FileNotFoundError(f"{source!r} is neither a zoo name nor an existing directory ({path.resolve()} does "
                                "not exist). Check the path, or use 'hf-hub:owner/name' for a Hub repo.")
    if "/" in source:
        raise ValueError(f"{source!r} is neither a zoo name nor an existing directory. For the Hub repo, write "
                         f"'hf-hub:{source}'; for a folder, 'local-dir:{source}'.")
    registry.info(source)
    raise AssertionError("unreachable: registry.info raises for unknown names")


def _zoo_source(entry: registry.ZooEntry, revision: str | None) -> ModelSource:
    if revision is not None and revision != entry.revision:
        raise ValueError(f"{entry.name} is pinned to revision {entry.revision}; to load another revision use "
                         f"'hf-hub:{entry.hub_repo}@{revision}' (no checksum is checked then).")
    if not entry.published:
        run = f"runs/{entry.name}"
        raise WeightsNotPublishedError(
            f"{entry.name} has no published weights yet ({entry.hub_repo} is not on the Hub): train it with "
            f"'{entry.train_command} --output_dir {run}', then load it with hscl_zoo.load('local-dir:{run}').")
    return ModelSource("zoo", repo_id=entry.hub_repo, revision=entry.revision, entry=entry)


def _local_source(path: Path, revision: str | None) -> ModelSource:
    if revision is not None:
        raise ValueError(f"revision={revision!r} applies to Hub repos only, not to the local directory {path}.")
    return ModelSource("local-dir", path=model_folder(path))


def model_folder(path: Path) -> Path:
    """``path``, or its ``hub/`` subfolder when ``path`` is a training run's output_dir: the run
    keeps its own config.json at the top and its model (config.json + weights) in ``hub/``."""
    run_model = path / RUN_MODEL_FOLDER
    if not (path / WEIGHTS_NAME).is_file() and (run_model / WEIGHTS_NAME).is_file():
        return run_model
    return path


def _where_the_model_is(path: Path) -> str:
    """A hint for a folder that holds no model: the model folders just inside it, or where an
    unfinished training run will write its model."""
    inside = sorted(str(sub) for sub in path.iterdir() if sub.is_dir() and (sub / CONFIG_NAME).is_file()
                    and (sub / WEIGHTS_NAME).is_file())
    if inside:
        return f" Model folders inside it: {', '.join(inside[:5])}; load one of those."
    if any((path / name).exists() for name in RUN_SIGNS):
        return (f" It looks like a training run that has not finished: the run writes its model to "
                f"{path / RUN_MODEL_FOLDER} at the end (--resume continues it).")
    return ""


def _hub_file(src: ModelSource, filename: str, *, local_files_only: bool, cache_dir: str | os.PathLike[str] | None) -> Path:
    offline = local_files_only or _env_offline()
    try:
        return Path(hf_hub_download(
            src.repo_id, filename, revision=src.revision, cache_dir=cache_dir, local_files_only=offline,
            library_name="hscl_zoo", library_version=__version__,
        ))
    except LocalEntryNotFoundError as err:
        cache_root = Path(cache_dir if cache_dir is not None else constants.HF_HUB_CACHE).expanduser()
        repo_cache = cache_root / repo_folder_name(repo_id=src.repo_id, repo_type="model")
        revision = src.revision or "main"
        why = ("offline mode is on (HF_HUB_OFFLINE=1 or local_files_only=True)" if offline
               else "the Hub could not be reached")
        local = f"./{src.repo_id.split('/')[-1]}"
        raise NotCachedError(
            f"Cannot load {filename} of {src.repo_id}@{revision}: {why} and it is not in the Hub cache at "
            f"{repo_cache}. Either go online and retry, or on a machine with network run\n"
            f"    hf download {src.repo_id} --revision {revision} --local-dir {local}\n"
            f"copy that folder here and load it with hscl_zoo.load('local-dir:{local}')."
        ) from err


def _local_files(path: Path) -> tuple[Path, Path]:
    missing = [name for name in (CONFIG_NAME, WEIGHTS_NAME) if not (path / name).is_file()]
    if missing:
        hint = ""
        if WEIGHTS_NAME in missing and any(p.suffix in (".bin", ".pt", ".pth") for p in path.iterdir()):
            hint = " Pickled checkpoints are not loaded; re-save the model with hscl_zoo.save_pretrained."
        raise FileNotFoundError(f"{path} lacks {' and '.join(missing)}: it is not a folder written by "
                                f"hscl_zoo.save_pretrained(model, directory).{hint}{_where_the_model_is(path)}")
    folder = path.resolve()
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        target = (path / name).resolve()
        if not target.is_relative_to(folder):
            raise ValueError(f"{path / name} links to {target}, outside the model folder {folder}; a folder's files "
                             "must lie inside it: copy the file in (cp -L) instead of linking to it.")
    return path / CONFIG_NAME, path / WEIGHTS_NAME


def _check_sha256(path: Path, expected: str, what: str) -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise ChecksumMismatchError(
            f"Refusing {path}: its sha256 is {actual}, but {what} pins {expected}. The cached file is corrupt or "
            "was replaced; delete it (and the blob it links to) and load again with network access.")


def _file_shapes(weights_path: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """The tensor shapes a safetensors file declares, read from its header alone."""
    try:
        with safe_open(os.fspath(weights_path), framework="pt", device="cpu") as handle:
            return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{weights_path} is not a readable safetensors file ({err}); re-save it with "
                         "hscl_zoo.save_pretrained.") from None


def check_weights(model: ContrastiveEncoder, weights_path: str | os.PathLike[str], *, config_path: str | None = None) -> None:
    """Raise ``ConfigMismatchError`` naming every missing, unexpected or mis-shaped key if the
    safetensors file does not match ``model``. Reads the file's header only, so ``model`` may live
    on the meta device and nothing is allocated for a file that does not fit."""
    state = _file_shapes(weights_path)
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
        raise ConfigMismatchError(
            f"{weights_path} does not match the {model.backbone_name} encoder described by {config} "
            f"({'; '.join(p for p in parts if p)}).{hint} Save the weights and the config from the same model "
            "with hscl_zoo.save_pretrained(model, directory).")


def load_weights(model: ContrastiveEncoder, weights_path: str | os.PathLike[str], *, config_path: str | None = None) -> None:
    """Load a safetensors file into ``model`` strictly; a file that does not match is refused by
    ``check_weights`` before any tensor is read."""
    check_weights(model, weights_path, config_path=config_path)
    try:
        state = load_file(os.fspath(weights_path), device="cpu")
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{weights_path} is not a readable safetensors file ({err}); re-save it with "
                         "hscl_zoo.save_pretrained.") from None
    model.load_state_dict(state, strict=True)


def _build(config: dict[str, Any], config_path: Path) -> ContrastiveEncoder:
    try:
        return ContrastiveEncoder.from_config(config)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{config_path}: {err}") from None


def load(
    source: str | os.PathLike[str] | registry.ZooEntry,
    device: str | torch.device | None = None,
    *,
    revision: str | None = None,
    local_files_only: bool | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> ContrastiveEncoder:
    """Load a trained encoder in eval mode, with ``model.transform`` and ``model.class_names``.

    ``source`` is a zoo name, ``hf-hub:owner/repo[@revision]``, ``local-dir:/path`` or an existing
    directory. Hub files come from the standard cache (``cache_dir`` overrides it); offline mode
    (``HF_HUB_OFFLINE=1`` or ``local_files_only=True``) never touches the network. The weights'
    sha256 is checked whenever the registry pins it. ``device`` defaults to CPU.

    Example::

        model = hscl_zoo.load("hscl-beta-cifar100")
        probs = model.predict(PIL.Image.open("cat.png"))   # (1, 100) class probabilities
    """
    src = parse_source(source, revision)
    if src.kind == "local-dir":
        config_path, weights_path = _local_files(src.path)
        entry = None
    else:
        offline = bool(local_files_only)
        weights_path = _hub_file(src, WEIGHTS_NAME, local_files_only=offline, cache_dir=cache_dir)
        config_path = _hub_file(src, CONFIG_NAME, local_files_only=offline, cache_dir=cache_dir)
        entry = src.entry or registry.find_by_repo(src.repo_id, src.revision)
    if entry is not None:
        _check_sha256(weights_path, entry.sha256, f"the registry entry {entry.name} ({entry.hub_repo}@{entry.revision})")

    config = read_config(config_path)
    with torch.device("meta"):
        check_weights(_build(config, config_path), weights_path, config_path=str(config_path))
    model = _build(config, config_path)
    load_weights(model, weights_path, config_path=str(config_path))
    model.training_summary = config.get("training")
    return model.to(torch.device(device) if device is not None else "cpu").eval()
