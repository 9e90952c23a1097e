"""The zoo's names: one entry per published or planned model, each tied to a Hub repo, a pinned
revision and the sha256 of its weights.

The registry knows names, repos, backbones, revisions, checksums and published metrics, and
nothing of training. The paper's grid (every method x dataset of Table 1, on ResNet-50) is
generated from the method table (``hscl_zoo.losses.methods``) and the dataset table
(``hscl_zoo.data.catalog``); any other model is one ``register_model(ZooEntry(...))``.
Publishing a model is one line in ``_PUBLISHED`` (commit, sha256, metrics), written after
``hscl_zoo.push_to_hub``.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from hscl_zoo._table import NamedTable
from hscl_zoo.data.catalog import DATASETS
from hscl_zoo.losses.methods import METHODS

__all__ = [
    "ZooEntry",
    "HUB_ORG",
    "PAPER_BACKBONE",
    "list_models",
    "info",
    "is_model",
    "closest_names",
    "entries",
    "find_by_repo",
    "pretrain_command",
    "register_model",
]

HUB_ORG = "hscl-zoo"
PAPER_BACKBONE = "resnet50"
"""The backbone of the paper's Table 1, and of the zoo's entries for it."""

# name: (pinned 40-hex commit of the Hub repo, sha256 of model.safetensors, published metrics in %)
_PUBLISHED: dict[str, tuple[str, str, dict[str, float]]] = {
}

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def pretrain_command(config: str) -> str:
    """The command that trains the model a recipe config (a shipped config's name or a YAML path)
    describes; it runs wherever the package is installed."""
    return f"hscl-zoo train --config {config}"


@dataclass(frozen=True)
class ZooEntry:
    """One zoo model: what it is (method, dataset, timm backbone), where its weights live, how
    they are pinned, and what they scored. ``config`` is its recipe config as ``--config`` takes it:
    the name of a config shipped in ``hscl_zoo.configs`` (the paper's grid: the zoo name) or the
    path of a YAML file.

    ``revision``, ``sha256`` and ``metrics`` stay empty until the weights are published;
    ``metrics`` holds only measured numbers (top-1 % of the linear probe, ...), never the paper's,
    which are in ``paper_top1`` / ``paper_top1_std``.
    """

    name: str
    method: str
    dataset: str
    backbone: str
    hub_repo: str
    config: str
    paper_top1: float | None = None
    paper_top1_std: float | None = None
    revision: str | None = None
    sha256: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"Unknown method {self.method!r}; expected one of {list(METHODS)}.")
        if self.dataset not in DATASETS:
            raise ValueError(f"Unknown dataset {self.dataset!r}; expected one of {list(DATASETS)}.")
        if not isinstance(self.backbone, str) or not self.backbone:
            raise ValueError(f"{self.name}: backbone must name a timm model (e.g. 'resnet50'), got {self.backbone!r}.")
        if (self.revision is None) != (self.sha256 is None):
            raise ValueError(f"{self.name}: revision and sha256 are published together; got "
                             f"revision={self.revision!r}, sha256={self.sha256!r}.")
        if self.revision is not None and not _COMMIT_RE.match(self.revision):
            raise ValueError(f"{self.name}: revision must pin a full 40-hex commit, got {self.revision!r}.")
        if self.sha256 is not None and not _SHA256_RE.match(self.sha256):
            raise ValueError(f"{self.name}: sha256 must be 64 lowercase hex digits, got {self.sha256!r}.")
        if self.metrics and self.revision is None:
            raise ValueError(f"{self.name}: metrics without published weights; publish revision and sha256 first.")
        for key, value in self.metrics.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{self.name}: metric {key!r} must be a number, got {value!r}.")
        object.__setattr__(self, "metrics", MappingProxyType(dict(self.metrics)))

    @property
    def published(self) -> bool:
        """Whether weights are on the Hub at a pinned revision with a known checksum."""
        return self.revision is not None

    @property
    def num_classes(self) -> int:
        return DATASETS[self.dataset].num_classes

    @property
    def train_command(self) -> str:
        return pretrain_command(self.config)

    def summary(self) -> str:
        """A human-readable, multi-line description (what ``hscl_zoo.info`` shows)."""
        method, dataset = METHODS[self.method], DATASETS[self.dataset]
        paper = "n/a" if self.paper_top1 is None else f"{self.paper_top1:.2f}" + (
            f" ± {self.paper_top1_std:.2f}" if self.paper_top1_std is not None else "")
        lines = [
            self.name,
            f"  method:      {self.method} ({method.display})",
            f"  dataset:     {self.dataset} ({dataset.display}, {dataset.num_classes} classes)",
            f"  backbone:    {self.backbone}",
            f"  hub repo:    {self.hub_repo}",
            f"  config:      {self.config}",
            f"  paper top-1: {paper} %",
        ]
        if self.published:
            metrics = ", ".join(f"{k}={v:g}" for k, v in self.metrics.items()) or "none recorded"
            lines += [
                f"  status:      published at revision {self.revision}",
                f"  sha256:      {self.sha256}",
                f"  metrics:     {metrics}",
            ]
        else:
            lines += [
                "  status:      not published yet (no weights, no metrics)",
                f"  train it:    {self.train_command}",
            ]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


_ENTRIES: NamedTable[ZooEntry] = NamedTable("zoo name", ZooEntry)


def register_model(entry: ZooEntry, *, replace: bool = False) -> ZooEntry:
    """Add an entry to the zoo (``list_models``, ``info``, ``load`` and the cards know it).

    A name that is taken is refused unless ``replace=True``. Returns the entry.
    """
    return _ENTRIES.register(entry, replace=replace)


def paper_entry(method: str, dataset: str, backbone: str = PAPER_BACKBONE) -> ZooEntry:
    """The entry ``<method>-<dataset>`` of the paper's grid, with Table 1's number and, once
    published, its pinned revision, checksum and metrics."""
    name = f"{method}-{dataset}"
    top1, std = METHODS[method].paper_top1[dataset]
    revision, sha256, metrics = _PUBLISHED.get(name, (None, None, {}))
    return ZooEntry(name=name, method=method, dataset=dataset, backbone=backbone, hub_repo=f"{HUB_ORG}/{name}",
                    config=name, paper_top1=top1, paper_top1_std=std, revision=revision,
                    sha256=sha256, metrics=metrics)


for _spec in tuple(METHODS.values()):
    for _dataset in _spec.paper_top1:
        register_model(paper_entry(_spec.name, _dataset))
if set(_PUBLISHED) - set(_ENTRIES):
    raise ValueError(f"_PUBLISHED names {sorted(set(_PUBLISHED) - set(_ENTRIES))} are not zoo names.")


def list_models(pattern: str | Iterable[str] = "*", published_only: bool = False) -> list[str]:
    """Zoo names matching a shell-style wildcard (or any of several), sorted.

    ``list_models("hscl-*-cifar*")`` gives the H-SCL models on CIFAR; ``published_only`` keeps
    those whose weights can be loaded.
    """
    patterns = [pattern] if isinstance(pattern, str) else list(pattern) if isinstance(pattern, Iterable) else []
    if not patterns or not all(isinstance(p, str) for p in patterns):
        raise ValueError(f"pattern must be a wildcard string or a list of them, got {pattern!r}.")
    return sorted(
        name for name, entry in _ENTRIES.items()
        if any(fnmatch.fnmatchcase(name, p) for p in patterns) and (entry.published or not published_only)
    )


def is_model(name: str) -> bool:
    """Whether ``name`` is a zoo name."""
    return name in _ENTRIES


def closest_names(name: str, n: int = 5) -> list[str]:
    """Zoo names closest to a misspelt one."""
    return difflib.get_close_matches(name, list(_ENTRIES), n=n, cutoff=0.5)


def info(name: str) -> ZooEntry:
    """The registry entry for a zoo name; ``print(info(name))`` shows it, publication status included.

    Raises ``ValueError`` listing the closest names when ``name`` is unknown.
    """
    if name in _ENTRIES:
        return _ENTRIES[name]
    close = closest_names(str(name))
    hint = f" Closest names: {', '.join(close)}." if close else ""
    raise ValueError(f"Unknown zoo model {name!r}.{hint} List them with hscl_zoo.list_models(); "
                     "load other weights with 'hf-hub:owner/repo' or 'local-dir:/path'.")


def find_by_repo(repo_id: str, revision: str | None) -> ZooEntry | None:
    """The published entry pinned to exactly this repo and revision, if any (to check its sha256)."""
    for entry in _ENTRIES.values():
        if entry.published and entry.hub_repo == repo_id and entry.revision == revision:
            return entry
    return None


def entries() -> list[ZooEntry]:
    """All entries, sorted by name."""
    return [_ENTRIES[n] for n in sorted(_ENTRIES)]
