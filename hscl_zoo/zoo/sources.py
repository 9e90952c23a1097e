"""Where a model's files are: what ``hscl_zoo.load`` was given, parsed into a `ModelSource` (a zoo
name, a Hub repo at a revision, or a folder), and the ``config.json`` and weights it points to.

A zoo name's files are its release's, every sha256 checked (:mod:`hscl_zoo.zoo.releases`); a Hub
repo's come through ``huggingface_hub.hf_hub_download`` and the standard cache (``HF_HUB_OFFLINE``,
``HF_HUB_CACHE`` and ``local_files_only`` as everywhere else); a folder's must lie inside it. Building
the encoder from them is :mod:`hscl_zoo.zoo.hub`'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants, hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, HFValidationError, LocalEntryNotFoundError
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import validate_repo_id

import hscl_zoo.zoo.registry as registry
from hscl_zoo._version import __version__
from hscl_zoo.zoo.releases import ChecksumMismatchError, NotCachedError, check_pins, fetch_release
from hscl_zoo.zoo.shards import INDEX_NAME, WEIGHTS_NAME, WeightFiles, weight_files

__all__ = ["CONFIG_NAME", "ModelSource", "WeightsNotPublishedError", "check_repo_id", "parse_source", "model_folder",
           "find_files"]

CONFIG_NAME = "config.json"
RUN_MODEL_FOLDER = "hub"
"""The subfolder of a training run's output_dir that holds its model; ``local-dir:RUN`` finds it."""
RUN_SIGNS = ("metrics.jsonl", "checkpoints")
"""What a training run writes into its output_dir before its model."""
_HUB_PREFIX = "hf-hub:"
_LOCAL_PREFIX = "local-dir:"


class WeightsNotPublishedError(LookupError):
    """A zoo name whose weights are not on the Hub yet."""


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


def _not_cached(src: ModelSource, filename: str, offline: bool, cache_dir: str | os.PathLike[str] | None
                ) -> NotCachedError:
    """The error for a file the Hub cache lacks where it cannot be downloaded (raise it from the
    huggingface_hub error, which stays its cause)."""
    cache_root = Path(cache_dir if cache_dir is not None else constants.HF_HUB_CACHE).expanduser()
    repo_cache = cache_root / repo_folder_name(repo_id=src.repo_id, repo_type="model")
    revision = src.revision or "main"
    why = ("offline mode is on (HF_HUB_OFFLINE=1 or local_files_only=True)" if offline
           else "the Hub could not be reached")
    local = f"./{src.repo_id.split('/')[-1]}"
    return NotCachedError(
        f"Cannot load {filename} of {src.repo_id}@{revision}: {why} and it is not in the Hub cache at "
        f"{repo_cache}. Either go online and retry, or on a machine with network run\n"
        f"    hf download {src.repo_id} --revision {revision} --local-dir {local}\n"
        f"copy that folder here and load it with hscl_zoo.load('local-dir:{local}')."
    )


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
                raise _not_cached(src, WEIGHTS_NAME, offline, cache_dir) from first_error
            raise FileNotFoundError(f"{src.repo_id}@{src.revision or 'main'} has neither {WEIGHTS_NAME} nor "
                                    f"{INDEX_NAME}: it is not a repo written by hscl_zoo.push_to_hub.") from None

    def find(name: str) -> Path | None:
        if name == WEIGHTS_NAME:
            return single
        if name == INDEX_NAME:
            return index if single is None else None
        try:
            return download(name)
        except LocalEntryNotFoundError as err:  # a subclass of EntryNotFoundError: not cached, not absent
            raise _not_cached(src, name, offline, cache_dir) from err
        except EntryNotFoundError:
            return None

    weights = weight_files(find, f"{src.repo_id}@{src.revision or 'main'}")
    try:
        config = download(CONFIG_NAME)
    except LocalEntryNotFoundError as err:
        raise _not_cached(src, CONFIG_NAME, offline, cache_dir) from err
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


def find_files(src: ModelSource, *, local_files_only: bool | None, cache_dir: str | os.PathLike[str] | None
               ) -> tuple[Path, WeightFiles]:
    """config.json and the weights of a parsed source: a folder's own files, a zoo name's pinned
    release (every sha256 checked), or a Hub repo's (checked against the registry when it pins
    that repo and revision)."""
    offline = bool(local_files_only) or _env_offline()
    if src.kind == "local-dir":
        return _local_files(src.path)
    if src.kind == "zoo":
        return _released_files(src.entry, offline=offline, cache_dir=cache_dir)
    config_path, weights = _hub_files(src, local_files_only=bool(local_files_only), cache_dir=cache_dir)
    entry = registry.find_by_repo(src.repo_id, src.revision)
    if entry is not None:
        _check_pins(entry, config_path, weights)
    return config_path, weights

