"""The zoo's names: one entry per (method, dataset), each tied to a Hub repo, a pinned revision
and the sha256 of its weights.

The registry knows names, repos, revisions, checksums and published metrics, and nothing of
training. Entries are generated from the method and dataset tables below; publishing a model is
one line in ``_PUBLISHED`` (commit, sha256, metrics), written after ``hscl_zoo.hub.push_to_hub``.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = [
    "ZooEntry",
    "DatasetInfo",
    "MethodInfo",
    "DATASETS",
    "METHODS",
    "HUB_ORG",
    "PAPER_TOP1",
    "list_models",
    "info",
    "is_model",
    "closest_names",
    "entries",
    "find_by_repo",
    "pretrain_command",
]

HUB_ORG = "hscl-zoo"
DEFAULT_BACKBONE = "resnet50"


@dataclass(frozen=True)
class MethodInfo:
    """A training objective of the paper, as named in the zoo and in the paper."""

    key: str
    display: str
    summary: str


@dataclass(frozen=True)
class DatasetInfo:
    """A dataset the zoo trains on: display name, Hub dataset id, classes and native resolution."""

    key: str
    display: str
    hub_id: str
    num_classes: int
    native_size: int


METHODS: Mapping[str, MethodInfo] = MappingProxyType({m.key: m for m in (
    MethodInfo("ucl", "UCL", "unsupervised contrastive learning (SimCLR-style): positives are other views "
               "of the same image, negatives are all other images, weighted uniformly"),
    MethodInfo("hucl", "H-UCL", "hard unsupervised contrastive learning: UCL with negatives re-weighted "
               "towards the hardest ones by an exponential tilt"),
    MethodInfo("scl", "SCL", "supervised contrastive learning: positives share the anchor's label, "
               "negatives are images of other classes, weighted uniformly"),
    MethodInfo("hscl-beta", "H-SCL(β)", "hard supervised contrastive learning: SCL with negatives of other "
               "classes re-weighted by the exponential tilt exp(β·s)"),
    MethodInfo("hscl-tau", "H-SCL(τ)", "hard supervised contrastive learning: SCL keeping only negatives of "
               "other classes whose similarity passes a threshold that rises during training"),
)})

DATASETS: Mapping[str, DatasetInfo] = MappingProxyType({d.key: d for d in (
    DatasetInfo("stl10", "STL-10", "tanganke/stl10", 10, 96),
    DatasetInfo("cifar10", "CIFAR-10", "uoft-cs/cifar10", 10, 32),
    DatasetInfo("cifar100", "CIFAR-100", "uoft-cs/cifar100", 100, 32),
    DatasetInfo("tinyimagenet", "Tiny ImageNet", "zh-plus/tiny-imagenet", 200, 64),
)})

PAPER_TOP1: Mapping[tuple[str, str], tuple[float, float | None]] = MappingProxyType({
    ("ucl", "stl10"): (64.36, 0.92), ("ucl", "cifar10"): (89.16, None),
    ("ucl", "cifar100"): (64.02, None), ("ucl", "tinyimagenet"): (53.40, None),
    ("hucl", "stl10"): (67.82, 1.41), ("hucl", "cifar10"): (90.35, None),
    ("hucl", "cifar100"): (67.77, None), ("hucl", "tinyimagenet"): (56.22, None),
    ("scl", "stl10"): (68.28, 0.92), ("scl", "cifar10"): (93.46, None),
    ("scl", "cifar100"): (71.68, None), ("scl", "tinyimagenet"): (62.06, None),
    ("hscl-beta", "stl10"): (72.52, 1.94), ("hscl-beta", "cifar10"): (93.98, None),
    ("hscl-beta", "cifar100"): (75.11, None), ("hscl-beta", "tinyimagenet"): (65.39, None),
    ("hscl-tau", "stl10"): (71.02, 2.03), ("hscl-tau", "cifar10"): (92.95, None),
    ("hscl-tau", "cifar100"): (72.97, None), ("hscl-tau", "tinyimagenet"): (63.84, None),
})
"""Table 1 of the paper: linear-probe top-1 % (mean, std where the paper gives one)."""

# name: (pinned 40-hex commit of the Hub repo, sha256 of model.safetensors, published metrics in %)
_PUBLISHED: dict[str, tuple[str, str, dict[str, float]]] = {
}

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def pretrain_command(config: str) -> str:
    """The command that trains the model a recipe config describes."""
    return f"accelerate launch recipes/pretrain.py --config {config}"


@dataclass(frozen=True)
class ZooEntry:
    """One zoo model: where its weights live, how they are pinned, and what they scored.

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


def _build_entries() -> dict[str, ZooEntry]:
    entries = {}
    for method in METHODS:
        for dataset in DATASETS:
            name = f"{method}-{dataset}"
            top1, std = PAPER_TOP1[(method, dataset)]
            revision, sha256, metrics = _PUBLISHED.get(name, (None, None, {}))
            entries[name] = ZooEntry(
                name=name,
                method=method,
                dataset=dataset,
                backbone=DEFAULT_BACKBONE,
                hub_repo=f"{HUB_ORG}/{name}",
                config=f"recipes/configs/{dataset}-{method}.yaml",
                paper_top1=top1,
                paper_top1_std=std,
                revision=revision,
                sha256=sha256,
                metrics=metrics,
            )
    unknown = sorted(set(_PUBLISHED) - set(entries))
    if unknown:
        raise ValueError(f"_PUBLISHED names {unknown} are not zoo names.")
    return entries


_ENTRIES: Mapping[str, ZooEntry] = MappingProxyType(_build_entries())


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
