"""The zoo's names: one entry per published or planned model, each tied to a Hub repo and, once
published, to the sha256 of every file of its release.

The registry knows names, repos, backbones, revisions, checksums and published metrics, and
nothing of training. The paper's grid is generated from its tables: every method x dataset of
Table 1 (images, ResNet-50) from the method table (``hscl_zoo.losses.methods``) and the dataset
table (``hscl_zoo.data.catalog``), and every method x dataset of Table 2 (graphs, InfoGraph's GIN)
from the graph dataset table (``hscl_zoo.graphs.catalog``); any other model is one
``register_model(ZooEntry(...))``.

Names say what was trained, as timm's tags do: ``hscl-beta-cifar10`` is the paper's model (Table
1's number, the paper's recipe), ``hscl-beta-cifar10.cpu-10k-5ep`` a release of it trained at a
named smaller budget. A graph encoder trained at Table 2's own budget is published under the
paper's name itself (``hscl-beta-mutag``). Publishing a release is one record in ``released.json``,
from what ``hscl-zoo release`` prints: per-file sha256 and size, the budget, the measured metrics,
and the Hub commit once ``hscl-zoo push`` has uploaded it. An entry is published when it pins its files;
where they are read from (a release folder, the Hub cache, the Hub) is
:mod:`hscl_zoo.zoo.releases`. The bare name loads its best published tag (``resolve``).
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hscl_zoo._table import NamedTable
from hscl_zoo.data.catalog import DATASETS
from hscl_zoo.graphs.catalog import GRAPH_DATASETS, TABLE_2_METHODS
from hscl_zoo.losses.methods import METHODS
from hscl_zoo.zoo.pins import FilePin, checked_pins

__all__ = [
    "ZooEntry",
    "FilePin",
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
    "resolve",
    "tags_of",
]

HUB_ORG = "hscl-zoo"
PAPER_BACKBONE = "resnet50"
"""The backbone of the paper's Table 1, and of the zoo's entries for it."""
PAPER_BIBTEX = """```bibtex
@article{jiang2022hscl,
  title   = {Supervised Contrastive Learning with Hard Negative Samples},
  author  = {Jiang, Ruijie and Nguyen, Thuan and Ishwar, Prakash and Aeron, Shuchin},
  journal = {arXiv preprint arXiv:2209.00078},
  year    = {2022}
}
```
"""
"""How every card cites the paper."""
GRAPH_BACKBONE = "gin-3x32"
"""The encoder of the paper's Table 2: InfoGraph's GIN, 3 layers of 32 units (hscl_zoo.graphs.encoder)."""

RELEASED_FILE = Path(__file__).with_name("released.json")
RELEASE_TAGS: dict[str, str] = {
    "gpu-30ep": "ResNet-18, 30 epochs on one GPU",
    "gpu-200ep": "ResNet-18, 200 epochs on one GPU",
}
"""What each release tag means, in a user's words (the tag names a training budget, as open_clip's
pretrained tags do); a new tag gets its line here."""
GRAPH_RECIPE = "GIN 3 x 32, the paper's 200 epochs"
"""The published releases, one record per zoo name: what ``hscl-zoo release`` printed (method,
dataset, backbone, budget, per-file sha256 and size, metrics) and the Hub commit ``hscl-zoo push``
printed (null until pushed)."""
_RELEASES: dict[str, dict[str, Any]] = json.loads(RELEASED_FILE.read_text(encoding="utf-8"))

_TAG_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def pretrain_command(config: str) -> str:
    """The command that trains the model a recipe config (a shipped config's name or a YAML path)
    describes; it runs wherever the package is installed."""
    return f"hscl-zoo train --config {config}"


@dataclass(frozen=True)
class ZooEntry:
    """One zoo model: what it is (method, dataset, backbone), where its weights live, how they are
    pinned, and what they scored. An image model's ``config`` is its recipe config as ``--config``
    takes it: the name of a config shipped in ``hscl_zoo.configs`` (the paper's grid: the zoo name)
    or the path of a YAML file. A graph model (its dataset in the graph dataset table) has no
    config: its command line is built from the dataset, the method and ``hyperparameters``, the
    method's options its weights were trained with (``{"beta": 2.0}``).

    A tagged entry (``name`` = ``<paper name>.<tag>``) is a release trained at ``budget``, a
    sentence saying what it was trained with. ``files`` pins every file of the release (name ->
    ``FilePin``) and stays empty until it is published; ``revision`` is the Hub commit holding the
    files, once pushed. ``metrics`` holds only measured numbers (top-1 % of the linear probe, ...),
    never the paper's, which are in ``paper_top1`` / ``paper_top1_std`` (for a graph model, Table
    2's SVM accuracy %).
    """

    name: str
    method: str
    dataset: str
    backbone: str
    hub_repo: str
    config: str | None = None
    paper_top1: float | None = None
    paper_top1_std: float | None = None
    revision: str | None = None
    files: Mapping[str, FilePin] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)
    tag: str | None = None
    budget: str | None = None
    hyperparameters: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"Unknown method {self.method!r}; expected one of {list(METHODS)}.")
        if self.dataset not in DATASETS and self.dataset not in GRAPH_DATASETS:
            raise ValueError(f"Unknown dataset {self.dataset!r}; expected one of {list(DATASETS)} (images) or "
                             f"{list(GRAPH_DATASETS)} (graphs).")
        if not isinstance(self.backbone, str) or not self.backbone:
            raise ValueError(f"{self.name}: backbone must name a timm model (e.g. 'resnet50') or "
                             f"{GRAPH_BACKBONE!r} for graphs, got {self.backbone!r}.")
        if self.modality == "image" and not self.config:
            raise ValueError(f"{self.name}: an image model names its recipe config (a shipped config or a YAML path).")
        options = [h.name for h in METHODS[self.method].hyperparameters]
        unknown = sorted(set(self.hyperparameters) - set(options))
        if unknown:
            raise ValueError(f"{self.name}: {self.method} takes no {', '.join(unknown)}; its options are {options}.")
        object.__setattr__(self, "hyperparameters", MappingProxyType(dict(self.hyperparameters)))
        if self.tag is not None:
            if not isinstance(self.tag, str) or not _TAG_RE.match(self.tag) or not self.name.endswith(f".{self.tag}"):
                raise ValueError(f"{self.name}: tag {self.tag!r} must be lowercase letters, digits and '-', and end "
                                 "the name after a '.' (e.g. 'hscl-beta-cifar10.cpu-10k').")
            if not self.budget:
                raise ValueError(f"{self.name}: a tagged release states its budget (what it was trained with).")
        elif "." in self.name:
            raise ValueError(f"{self.name}: a name with a '.' is a tagged release; give tag={self.name.split('.')[-1]!r}.")
        files, metrics = checked_pins(self.name, self.files, self.revision, self.metrics)
        object.__setattr__(self, "files", files)
        object.__setattr__(self, "metrics", metrics)

    @property
    def published(self) -> bool:
        """Whether the entry pins the sha256 of every file of its release (so it can be loaded)."""
        return bool(self.files)

    @property
    def headline(self) -> tuple[str, float | None]:
        """The metric users compare entries by and this entry's value of it in %: ``("linear
        top-1", top1)`` for an image encoder, ``("SVM accuracy", svm_accuracy)`` for a graph one
        (the paper's Tables 1 and 2); None when no weights are published."""
        key, label = ("svm_accuracy", "SVM accuracy") if self.modality == "graph" else ("top1", "linear top-1")
        return label, self.metrics.get(key) if self.published else None

    @property
    def trained_with(self) -> str:
        """What the release was trained with, in a few words (``ResNet-18, 30 epochs on one GPU``):
        its tag's words from ``RELEASE_TAGS``, the paper's recipe for a graph release, else the first
        clause of its budget; empty for a name with no weights."""
        if not self.published:
            return ""
        if self.tag in RELEASE_TAGS:
            return RELEASE_TAGS[self.tag]
        if self.modality == "graph" and self.tag is None:
            return GRAPH_RECIPE
        return (self.budget or "").split(";")[0].split(":")[0]

    @property
    def base_name(self) -> str:
        """The name without its tag: the paper's model this release is of."""
        return self.name.partition(".")[0]

    @property
    def modality(self) -> str:
        """``"graph"`` for a dataset of the graph dataset table, else ``"image"``."""
        return "graph" if self.dataset in GRAPH_DATASETS else "image"

    @property
    def num_classes(self) -> int:
        return self._dataset_spec.num_classes

    @property
    def dataset_display(self) -> str:
        return self._dataset_spec.display

    @property
    def _dataset_spec(self) -> Any:
        return (GRAPH_DATASETS if self.modality == "graph" else DATASETS)[self.dataset]

    @property
    def train_command(self) -> str:
        """The command that trains this model (add ``--output_dir DIR``)."""
        if self.modality == "image":
            return pretrain_command(str(self.config))
        options = "".join(f" --{key} {value:g}" for key, value in self.hyperparameters.items())
        return (f"hscl-zoo train --dataset tu:{GRAPH_DATASETS[self.dataset].tu_name} --method {self.method}"
                f"{options} --seed 0")

    def summary(self) -> str:
        """A human-readable, multi-line description (what ``hscl_zoo.info`` shows): the weights a
        load of this name reads and their own measured scores first, then the paper's number."""
        method = METHODS[self.method]
        default = resolve(self.name) if self.tag is None and not self.published and is_model(self.name) else self
        served = default if default.published else self
        paper = "n/a" if self.paper_top1 is None else f"{self.paper_top1:.2f}" + (
            f" ± {self.paper_top1_std:.2f}" if self.paper_top1_std is not None else "")
        lines = [self.name]
        if served is not self:
            lines.append(f"  loads:       {served.name} (its best published tag)")
        if served.published:
            metrics = ", ".join(f"{k}={v:g}" for k, v in served.metrics.items()) or "none recorded"
            lines += [f"  scores:      {metrics} (measured on these weights)",
                      f"  trained:     {served.trained_with}"]
        if self.modality == "image":
            lines += [f"  paper top-1: {paper} % (Table 1: ResNet-50, 200 epochs)"]
        else:
            lines += [f"  paper:       {paper} % (Table 2: SVM accuracy on the frozen embeddings)"]
        lines += [
            f"  method:      {self.method} ({method.display})"
            + "".join(f", {key} = {value:g}" for key, value in served.hyperparameters.items()),
            f"  dataset:     {self.dataset} ({self.dataset_display}, {self.num_classes} classes)",
            f"  backbone:    {served.backbone}",
        ]
        if served.revision:
            lines += [f"  hub repo:    {served.hub_repo}"]
        if self.modality == "image":
            lines += [f"  config:      {self.config}"]
        if served.budget:
            lines.append(f"  budget:      {served.budget}")
        if served.published:
            where = f"the Hub at revision {served.revision}" if served.revision else "releases/ (not on the Hub yet)"
            lines += [f"  status:      published: {where}"]
            lines += [f"  file:        {name} sha256 {pin.sha256} ({pin.size:,} bytes)" for name, pin in served.files.items()]
        elif tags_of(self.name):
            lines += ["  status:      no weights serve this name; load a tag by its full name",
                      f"  train it:    {self.train_command}"]
        else:
            lines += [
                "  status:      not published yet (no weights, no metrics)",
                f"  train it:    {self.train_command}",
            ]
        tags = tags_of(self.name)
        if tags:
            lines += [f"  tags:        {', '.join(t + (' (default)' if t == served.name else '') for t in tags)}"]
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
    return ZooEntry(name=name, method=method, dataset=dataset, backbone=backbone, hub_repo=f"{HUB_ORG}/{name}",
                    config=name, paper_top1=top1, paper_top1_std=std)


def graph_paper_entry(method: str, dataset: str) -> ZooEntry:
    """The entry ``<method>-<graph dataset>`` of Table 2, with its SVM accuracy."""
    name = f"{method}-{dataset}"
    return ZooEntry(name=name, method=method, dataset=dataset, backbone=GRAPH_BACKBONE, hub_repo=f"{HUB_ORG}/{name}",
                    paper_top1=GRAPH_DATASETS[dataset].paper_accuracy.get(method))


def release_entry(name: str, release: Mapping[str, Any]) -> ZooEntry:
    """The entry of a release record of ``released.json``.

    A tagged name ``<paper name>.<tag>`` is a release at a budget of its own: the paper entry's
    Table number, the release's backbone, budget, files and metrics, and its own Hub repo
    (``hscl-zoo/<name>``, one repo per tag as timm does). An untagged name is trained at the
    paper's budget and publishes that name itself (a method the table lacks, such as H-SCL(tau) on
    graphs, gets an entry of its own with no paper number)."""
    base, _, tag = name.partition(".")
    paper = _ENTRIES[base] if base in _ENTRIES else None
    if tag and paper is None:
        raise ValueError(f"released.json names {name!r}, whose {base!r} is not a zoo name.")
    if paper is not None and (paper.method, paper.dataset) != (release["method"], release["dataset"]):
        raise ValueError(f"released.json: {name!r} was trained as {release['method']} on {release['dataset']}, "
                         f"but {base!r} is {paper.method} on {paper.dataset}.")
    return ZooEntry(name=name, method=release["method"], dataset=release["dataset"], backbone=release["backbone"],
                    hub_repo=f"{HUB_ORG}/{name}", config=paper.config if paper else None,
                    paper_top1=paper.paper_top1 if paper else None,
                    paper_top1_std=paper.paper_top1_std if paper else None, revision=release.get("revision"),
                    files={k: (v["sha256"], v["size"]) for k, v in release["files"].items()},
                    metrics=release["metrics"], tag=tag or None, budget=release["budget"],
                    hyperparameters=release.get("hyperparameters", {}))


for _spec in tuple(METHODS.values()):
    for _dataset in _spec.paper_top1:
        register_model(paper_entry(_spec.name, _dataset))
for _graphs in tuple(GRAPH_DATASETS.values()):
    for _method in TABLE_2_METHODS:
        register_model(graph_paper_entry(_method, _graphs.name))
for _name, _release in _RELEASES.items():
    register_model(release_entry(_name, _release), replace=not _name.partition(".")[2])


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
    """The published entry pinned to exactly this repo and revision, if any (to check its files)."""
    for entry in _ENTRIES.values():
        if entry.published and entry.revision is not None and entry.hub_repo == repo_id and entry.revision == revision:
            return entry
    return None


def tags_of(name: str) -> list[str]:
    """The tagged names of a zoo name (``hscl-beta-cifar10`` -> ``[hscl-beta-cifar10.cpu-10k-5ep]``), sorted."""
    return sorted(n for n, e in _ENTRIES.items() if e.tag is not None and e.base_name == name)


SMOKE_TAG_PREFIX = "cpu-"
"""Tags of CPU smoke-test and subset budgets (``hscl-beta-cifar10.cpu-10k-5ep``): published, loadable
by their tagged name, and never what the bare name loads."""


def serves_bare_name(entry: ZooEntry) -> bool:
    """Whether a published tag may be what its bare name loads: any but a CPU smoke or subset tag."""
    return entry.published and entry.tag is not None and not entry.tag.startswith(SMOKE_TAG_PREFIX)


def resolve(name: str) -> ZooEntry:
    """The entry ``load(name)`` reads: a tagged name's own; for a bare name, its default tag (the
    published tag of its method and dataset with the best measured score, its ``headline``: linear
    top-1, SVM accuracy for a graph encoder; smoke-test tags left out) when it has one, else the
    bare entry itself. A name with a longer budget's release serves it only when it scores more."""
    entry = info(name)
    serving = [_ENTRIES[t] for t in tags_of(name) if serves_bare_name(_ENTRIES[t])] if entry.tag is None else []
    if not entry.published and serving:
        return max(serving, key=lambda e: (e.headline[1] if e.headline[1] is not None else float("-inf"), e.name))
    return entry


def entries() -> list[ZooEntry]:
    """All entries, sorted by name."""
    return [_ENTRIES[n] for n in sorted(_ENTRIES)]
