"""Loading encoders: ``config.json`` + ``model.safetensors`` (or its shards and index), from the
Hub or a folder.

Saving and pushing them is :mod:`hscl_zoo.zoo.saving`. Sources ``hscl_zoo.load`` understands:

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import constants, hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, HFValidationError, LocalEntryNotFoundError
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import validate_repo_id
from torch import nn

import hscl_zoo.zoo.registry as registry
from hscl_zoo._files import sha256_file
from hscl_zoo._version import __version__
from hscl_zoo.zoo.model_types import build_model
from hscl_zoo.zoo.releases import ChecksumMismatchError, NotCachedError, check_pins, fetch_release
from hscl_zoo.zoo.schema import check_config, read_config
from hscl_zoo.zoo.shards import DTYPES, INDEX_NAME, WEIGHTS_NAME, WeightFiles, dtype_name, read_state, tensor_shapes, weight_files

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

CONFIG_NAME = "config.json"
RUN_MODEL_FOLDER = "hub"
"""The subfolder of a training run's output_dir that holds its model; ``local-dir:RUN`` finds it."""
RUN_SIGNS = ("metrics.jsonl", "checkpoints")
"""What a training run writes into its output_dir before its model."""
_HUB_PREFIX = "hf-hub:"
_LOCAL_PREFIX = "local-dir:"
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


class WeightsNotPublishedError(LookupError):
    """A zoo name whose weights are not on the Hub yet."""


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
        return _zoo_source(registry.resolve(source.name) if source.tag is None and not source.published else source,
                           revision)
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
        return _zoo_source(registry.resolve(source), revision)

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
        smoke = [registry.info(t) for t in registry.tags_of(entry.name) if registry.info(t).published]
        if smoke:
            listed = ", ".join(f"{t.name} (linear top-1 {t.metrics['top1']:.2f} %)" if "top1" in t.metrics else t.name
                               for t in smoke)
            raise WeightsNotPublishedError(
                f"{entry.name} has no full-budget release yet, only CPU smoke tests: {listed}; load one by its "
                f"tagged name, hscl_zoo.load('{smoke[0].name}'), or train it with "
                f"'{entry.train_command} --output_dir {run}'.")
        raise WeightsNotPublishedError(
            f"{entry.name} has no published weights yet ({entry.hub_repo} is not on the Hub): train it with "
            f"'{entry.train_command} --output_dir {run}', then load it with hscl_zoo.load('local-dir:{run}').")
    return ModelSource("zoo", repo_id=entry.hub_repo, revision=entry.revision, entry=entry)


def _local_source(path: Path, revision: str | None) -> ModelSource:
    if revision is not None:
        raise ValueError(f"revision={revision!r} applies to Hub repos only, not to the local directory {path}.")
    return ModelSource("local-dir", path=model_folder(path))


def _holds_weights(folder: Path) -> bool:
    return (folder / WEIGHTS_NAME).is_file() or (folder / INDEX_NAME).is_file()


def model_folder(path: Path) -> Path:
    """``path``, or its ``hub/`` subfolder when ``path`` is a training run's output_dir: the run
    keeps its own config.json at the top and its model (config.json + weights) in ``hub/``."""
    run_model = path / RUN_MODEL_FOLDER
    if not _holds_weights(path) and _holds_weights(run_model):
        return run_model
    return path


def _where_the_model_is(path: Path) -> str:
    """A hint for a folder that holds no model: the model folders just inside it, or where an
    unfinished training run will write its model."""
    inside = sorted(str(sub) for sub in path.iterdir() if sub.is_dir() and (sub / CONFIG_NAME).is_file()
                    and _holds_weights(sub))
    if inside:
        return f" Model folders inside it: {', '.join(inside[:5])}; load one of those."
    if any((path / name).exists() for name in RUN_SIGNS):
        return (f" It looks like a training run that has not finished: the run writes its model to "
                f"{path / RUN_MODEL_FOLDER} at the end (--resume continues it).")
    return ""


def _not_cached(src: ModelSource, filename: str, offline: bool, cache_dir: str | os.PathLike[str] | None,
                err: Exception) -> NotCachedError:
    cache_root = Path(cache_dir if cache_dir is not None else constants.HF_HUB_CACHE).expanduser()
    repo_cache = cache_root / repo_folder_name(repo_id=src.repo_id, repo_type="model")
    revision = src.revision or "main"
    why = ("offline mode is on (HF_HUB_OFFLINE=1 or local_files_only=True)" if offline
           else "the Hub could not be reached")
    local = f"./{src.repo_id.split('/')[-1]}"
    error = NotCachedError(
        f"Cannot load {filename} of {src.repo_id}@{revision}: {why} and it is not in the Hub cache at "
        f"{repo_cache}. Either go online and retry, or on a machine with network run\n"
        f"    hf download {src.repo_id} --revision {revision} --local-dir {local}\n"
        f"copy that folder here and load it with hscl_zoo.load('local-dir:{local}')."
    )
    error.__cause__ = err
    return error


def _hub_files(src: ModelSource, *, local_files_only: bool, cache_dir: str | os.PathLike[str] | None
               ) -> tuple[Path, WeightFiles]:
    """config.json and the weights of a Hub repo: model.safetensors, or (when the repo has none)
    the index and every shard it names."""
    offline = local_files_only or _env_offline()

    def download(filename: str) -> Path:
        return Path(hf_hub_download(src.repo_id, filename, revision=src.revision, cache_dir=cache_dir,
                                    local_files_only=offline, library_name="hscl_zoo", library_version=__version__))

    try:
        single: Path | None = download(WEIGHTS_NAME)
    except (EntryNotFoundError, LocalEntryNotFoundError) as err:
        single, first_error = None, err
    if single is None:
        try:
            index = download(INDEX_NAME)
        except (EntryNotFoundError, LocalEntryNotFoundError):
            if isinstance(first_error, LocalEntryNotFoundError):
                raise _not_cached(src, WEIGHTS_NAME, offline, cache_dir, first_error) from None
            raise FileNotFoundError(f"{src.repo_id}@{src.revision or 'main'} has neither {WEIGHTS_NAME} nor "
                                    f"{INDEX_NAME}: it is not a repo written by hscl_zoo.push_to_hub.") from None

    def find(name: str) -> Path | None:
        if name == WEIGHTS_NAME:
            return single
        if name == INDEX_NAME:
            return index if single is None else None
        try:
            return download(name)
        except EntryNotFoundError:
            return None
        except LocalEntryNotFoundError as err:
            raise _not_cached(src, name, offline, cache_dir, err) from None

    weights = weight_files(find, f"{src.repo_id}@{src.revision or 'main'}")
    try:
        config = download(CONFIG_NAME)
    except LocalEntryNotFoundError as err:
        raise _not_cached(src, CONFIG_NAME, offline, cache_dir, err) from None
    return config, weights


def _local_files(path: Path) -> tuple[Path, WeightFiles]:
    has_weights = (path / WEIGHTS_NAME).is_file() or (path / INDEX_NAME).is_file()
    missing = [name for name, there in ((CONFIG_NAME, (path / CONFIG_NAME).is_file()), (WEIGHTS_NAME, has_weights))
               if not there]
    if missing:
        hint = ""
        if WEIGHTS_NAME in missing and any(p.suffix in (".bin", ".pt", ".pth") for p in path.iterdir()):
            hint = " Pickled checkpoints are not loaded; re-save the model with hscl_zoo.save_pretrained."
        raise FileNotFoundError(f"{path} lacks {' and '.join(missing)}: it is not a folder written by "
                                f"hscl_zoo.save_pretrained(model, directory).{hint}{_where_the_model_is(path)}")
    folder = path.resolve()

    def inside(name: str) -> Path | None:
        if not (path / name).is_file():
            return None
        target = (path / name).resolve()
        if not target.is_relative_to(folder):
            raise ValueError(f"{path / name} links to {target}, outside the model folder {folder}; a folder's files "
                             "must lie inside it: copy the file in (cp -L) instead of linking to it.")
        return path / name

    config = inside(CONFIG_NAME)
    return config, weight_files(inside, str(path))


def _released_files(entry: registry.ZooEntry, *, offline: bool, cache_dir: str | os.PathLike[str] | None
                    ) -> tuple[Path, WeightFiles]:
    files = fetch_release(entry, offline=offline, cache_dir=cache_dir).files
    if CONFIG_NAME not in files:
        raise ValueError(f"The registry entry {entry.name} pins no {CONFIG_NAME}; a release pins every file of its "
                         "folder (hscl-zoo release prints them).")
    return files[CONFIG_NAME], weight_files(files.get, entry.name)


def _check_pins(entry: registry.ZooEntry, config: Path, weights: WeightFiles) -> None:
    """A Hub repo loaded at a revision the registry pins: every file read must match its pin."""
    read = {CONFIG_NAME: config, **dict(weights.paths)}
    if weights.index is not None:
        read[INDEX_NAME] = weights.index
    refusal = check_pins(entry, read, "The cached file is corrupt or was replaced; delete it (and the blob it links "
                                      "to) and load again with network access.")
    if refusal is not None:
        raise ChecksumMismatchError(refusal)


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
    return WeightFiles({path.name: path}, {})


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
    ``device`` defaults to CPU.

    Example::

        model = hscl_zoo.load("hscl-beta-cifar100")         # its best published tag
        probs = model.predict(PIL.Image.open("cat.png"))   # (1, 100) class probabilities
    """
    src = parse_source(source, revision)
    offline = bool(local_files_only) or _env_offline()
    if src.kind == "local-dir":
        config_path, weights = _local_files(src.path)
    elif src.kind == "zoo":
        config_path, weights = _released_files(src.entry, offline=offline, cache_dir=cache_dir)
    else:
        config_path, weights = _hub_files(src, local_files_only=bool(local_files_only), cache_dir=cache_dir)
        entry = registry.find_by_repo(src.repo_id, src.revision)
        if entry is not None:
            _check_pins(entry, config_path, weights)

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
    return model.to(device=torch.device(device) if device is not None else "cpu", dtype=target).eval()
