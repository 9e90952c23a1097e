"""Model cards: one Markdown card per zoo model, rendered from one template.

``render_card`` takes a registry entry (the checked-in cards under ``model_cards/``) or the config
of a trained model with its training summary and measured metrics (what a publish step uploads
as README.md). The checked-in cards are written by `hscl_zoo.publishing.cards`
(``python -m hscl_zoo.publishing.cards --out model_cards``), which adds each method's runs at the
evidence budgets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

import hscl_zoo.zoo.registry as registry
from hscl_zoo.configs import is_config_name
from hscl_zoo.data.catalog import DATASETS
from hscl_zoo.losses.methods import METHODS
from hscl_zoo.zoo.card_template import CARD_TEMPLATE
from hscl_zoo.zoo.card_evidence import evaluation_sections, markdown_table
from hscl_zoo.zoo.registry import ZooEntry

__all__ = ["CARD_TEMPLATE", "render_card"]

PAPER_TITLE = "Supervised Contrastive Learning with Hard Negative Samples"
PAPER_URL = "https://arxiv.org/abs/2209.00078"

_METRIC_NAMES = {
    "top1": ("accuracy", "Top-1 accuracy (linear probe)"),
    "top5": ("top_5_accuracy", "Top-5 accuracy (linear probe)"),
    "knn_top1": ("knn_accuracy", "Top-1 accuracy (kNN on frozen features)"),
}
_PAPER_RECIPE = (
    "The paper's recipe: ResNet-50 with the CIFAR stem (3x3 stride-1 first conv, no max-pool), projection "
    "head 2048 -> 512 (BatchNorm, ReLU) -> 128, Adam (lr 1e-3, weight decay 1e-6), batch 512, 200 epochs, "
    "temperature 0.5; augmentations crop, flip, colour jitter, grayscale, blur; then a linear probe on the "
    "frozen features."
)
_STL10_STEM = (
    "At STL-10's 96 px the paper does not say which stem it used; this config uses timm's default ResNet "
    "stem (7x7 stride-2 conv and max-pool) at 96 px, as its comments explain."
)


@dataclass(frozen=True)
class _CardFacts:
    name: str
    method: str
    dataset: str
    backbone: str
    hub_repo: str | None
    config: str | None
    entry: ZooEntry | None
    revision: str | None
    training: Mapping[str, Any] | None
    pretrained_cfg: Mapping[str, Any] | None
    proj_dim: int


def hub_dataset_id(dataset: str) -> str | None:
    """The Hub dataset repo a card's ``datasets:`` metadata may name: a registered dataset's
    ``hub_id`` or the ``owner/name`` of ``hf:owner/name``; None for local data (a path must not
    leave the machine in a card) and for datasets that are not on the Hub."""
    if dataset.startswith("hf:"):
        return dataset.removeprefix("hf:")
    spec = DATASETS.get(dataset)
    return spec.hub_id if spec is not None else None


def dataset_label(dataset: str) -> str:
    """A short, path-free name for a card's title and text: the registered name, the Hub id of
    ``hf:`` data, else the kind of local data (``imagefolder``, ``parquet``)."""
    if dataset in DATASETS:
        return dataset
    if dataset.startswith("hf:"):
        return dataset.removeprefix("hf:").rpartition("/")[2]
    return dataset.partition(":")[0] or "local-data"


def _check_results(results: Mapping[str, Any]) -> dict[str, float]:
    if not isinstance(results, Mapping):
        raise ValueError(f"results must map metric names to numbers, e.g. {{'top1': 75.1}}; got {results!r}.")
    checked = {}
    for key, value in results.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"result {key!r} must be a finite number, got {value!r}.")
        if key in _METRIC_NAMES and not 0.0 <= value <= 100.0:
            raise ValueError(f"result {key!r}={value} is not a percentage; give accuracies in % (0-100, e.g. 75.1).")
        checked[str(key)] = float(value)
    return checked


def _facts(source: ZooEntry | Mapping[str, Any], name: str | None, repo_id: str | None) -> _CardFacts:
    if isinstance(source, ZooEntry):
        return _CardFacts(
            name=name or source.name, method=source.method, dataset=source.dataset, backbone=source.backbone,
            hub_repo=repo_id or source.hub_repo, config=source.config, entry=source, revision=source.revision,
            training=None, pretrained_cfg=None, proj_dim=128,
        )
    if not isinstance(source, Mapping):
        raise TypeError(f"render_card takes a ZooEntry or a config dict, got {type(source).__name__}.")
    training = source.get("training")
    if not isinstance(training, Mapping) or not {"dataset", "method"} <= set(training):
        raise ValueError("render_card needs the training summary (with 'dataset' and 'method') under the "
                         "config's 'training' key: pass the config.json written by "
                         "hscl_zoo.save_pretrained(model, dir, training=...).")
    if "architecture" not in source or "pretrained_cfg" not in source:
        raise ValueError("render_card needs a full model config (architecture, pretrained_cfg): pass "
                         "model.model_config() | {'training': ...} or the saved config.json.")
    method, dataset = str(training["method"]), str(training["dataset"])
    entry = registry.info(f"{method}-{dataset}") if registry.is_model(f"{method}-{dataset}") else None
    card_name = name or (entry.name if entry else f"{method}-{dataset_label(dataset)}")
    return _CardFacts(
        name=card_name, method=method, dataset=dataset, backbone=str(source["architecture"]),
        hub_repo=repo_id,
        config=training.get("config"), entry=entry, revision=None,
        training=training, pretrained_cfg=source["pretrained_cfg"],
        proj_dim=int(source.get("model_args", {}).get("proj_dim", 128)),
    )


def _front_matter(facts: _CardFacts, results: Mapping[str, float]) -> str:
    dataset = DATASETS.get(facts.dataset)
    header: dict[str, Any] = {
        "library_name": "hscl_zoo",
        "license": "apache-2.0",
        "pipeline_tag": "image-classification",
        "tags": ["image-classification", "contrastive-learning", "hard-negative-sampling", "hscl_zoo",
                 facts.method, facts.backbone],
    }
    if hub_dataset_id(facts.dataset):
        header["datasets"] = [hub_dataset_id(facts.dataset)]
    header["metrics"] = ["accuracy"]
    if results:
        metrics = []
        for key, value in results.items():
            kind, label = _METRIC_NAMES.get(key, (key, key))
            metrics.append({"type": kind, "value": round(value, 2), "name": label})
        header["model-index"] = [{
            "name": facts.name,
            "results": [{
                "task": {"type": "image-classification", "name": "Image Classification"},
                "dataset": {"name": dataset.display if dataset else dataset_label(facts.dataset),
                            "type": hub_dataset_id(facts.dataset) or dataset_label(facts.dataset)},
                "metrics": metrics,
            }],
        }]
    return yaml.safe_dump(header, sort_keys=False, allow_unicode=True, default_flow_style=False, width=100)


def _status(facts: _CardFacts, results: Mapping[str, float]) -> str:
    if facts.entry is not None and facts.training is None and not facts.entry.published:
        tags = registry.tags_of(facts.entry.name)
        default = registry.resolve(facts.entry.name)
        loads = (f"`hscl_zoo.load(\"{facts.entry.name}\")` loads `{default.name}`." if default.tag is not None else
                 f"`hscl_zoo.load(\"{facts.entry.name}\")` loads none of them: a CPU smoke test loads by its tagged name only.")
        released = (f"\n\nReleased at smaller budgets (each card says which): "
                    f"{', '.join(f'`{t}`' for t in tags)}; {loads}" if tags else "")
        return (f"**Weights not published yet.** This card describes the model the zoo will publish at "
                f"`{facts.hub_repo}`; it claims no results until then. Train it yourself with\n"
                f"`{facts.entry.train_command}`.{released}")
    if facts.revision:
        return f"Published at [`{facts.hub_repo}`](https://huggingface.co/{facts.hub_repo}), revision `{facts.revision}`."
    if facts.entry is not None and facts.training is None and facts.entry.published:
        return (f"Released in the hscl_zoo repository under `releases/{facts.name}/` (not on the Hub yet), every file "
                f"pinned by its sha256 in the zoo's registry; `{facts.hub_repo}` is its home once pushed.")
    if facts.hub_repo is None:
        return ("A model folder from a local hscl_zoo training run; it has not been published on the Hugging Face "
                "Hub (`hscl-zoo push RUN_FOLDER --repo-id owner/name` uploads it).")
    return f"Trained with hscl_zoo and published at [`{facts.hub_repo}`](https://huggingface.co/{facts.hub_repo})."


def _release_status(name: str) -> str:
    return (f"A release of hscl_zoo, loaded by its zoo name: `hscl_zoo.load(\"{name}\")` (`hscl-zoo info {name}` says "
            "where its files are served from).")


def _description(facts: _CardFacts) -> str:
    method = METHODS.get(facts.method)
    dataset = DATASETS.get(facts.dataset)
    method_text = f"{method.display}, {method.summary}" if method else facts.method
    return (f"A `{facts.backbone}` image encoder trained on {dataset.display if dataset else dataset_label(facts.dataset)} "
            f"with {method_text}, as in [\"{PAPER_TITLE}\"]({PAPER_URL}) (Jiang, Nguyen, Ishwar, Aeron). "
            f"It carries the projection head (features -> 512, BatchNorm, ReLU -> {facts.proj_dim}) that "
            "the contrastive loss trains, and a linear classifier fitted on the frozen features.")


def _preprocessing(facts: _CardFacts) -> str:
    cfg = facts.pretrained_cfg
    if cfg is None:
        size = DATASETS[facts.dataset].native_size
        return (f"RGB images ({DATASETS[facts.dataset].display} is {size}x{size} pixels), resized to the "
                "training resolution and normalised per channel. The exact values (mean, std, input size, "
                "interpolation, crop) are stored in the published `config.json` under `pretrained_cfg` and "
                "applied by `model.transform`.")
    _, height, width = cfg["input_size"]
    rows = [
        ("input size", f"3 x {height} x {width}"),
        ("resize interpolation", cfg.get("interpolation", "bicubic")),
        ("crop", f"{cfg.get('crop_mode', 'center')}, crop_pct {cfg.get('crop_pct', 1.0):g}"),
        ("mean", ", ".join(f"{v:.4f}" for v in cfg["mean"])),
        ("std", ", ".join(f"{v:.4f}" for v in cfg["std"])),
    ]
    return markdown_table(("step", "value"), rows)


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_format_value(v) for v in value)
    return str(value)


def _training(facts: _CardFacts) -> str:
    lines = []
    if facts.entry is not None and facts.entry.budget and facts.training is None:
        lines.append(f"Budget: {facts.entry.budget.rstrip('.')}. Not the paper's recipe: the command that trained it is in the "
                     "release's `eval.json` (`train_command`). For comparison, the paper's recipe:")
        lines.append(_PAPER_RECIPE)
        return "\n\n".join(lines)
    if facts.config:
        where = " (shipped with the `hscl-zoo` package)" if is_config_name(facts.config) else ""
        lines.append(f"Config: `{facts.config}`{where}; reproduce with `{registry.pretrain_command(facts.config)}`.")
    if facts.training is None:
        lines.append(_PAPER_RECIPE + (" " + _STL10_STEM if facts.dataset == "stl10" else ""))
        return "\n\n".join(lines)
    if not facts.config:
        lines.append("Trained without a shipped config: the run's settings are below, and in `config.json` under "
                     "`training`.")
    summary = facts.training
    rows = [
        ("dataset", dataset_label(str(summary["dataset"]))),
        ("method", summary["method"]),
        ("epochs", summary.get("epochs", "n/a")),
        ("global batch", summary.get("global_batch_size", "n/a")),
        ("negatives per anchor (expected from the batch size)", summary.get("expected_negatives_per_anchor", "n/a")),
    ]
    hyper = summary.get("hyperparameters") or {}
    rows += [(f"`{key}`", hyper[key]) for key in sorted(hyper)]
    lines.append(markdown_table(("setting", "value"), [(k, _format_value(v)) for k, v in rows]))
    return "\n\n".join(lines)


def _results(facts: _CardFacts, results: Mapping[str, float]) -> str:
    paper = facts.entry.paper_top1 if facts.entry else None
    paper_text = "n/a"
    if paper is not None:
        std = facts.entry.paper_top1_std
        paper_text = f"{paper:.2f}" + (f" ± {std:.2f}" if std is not None else "")
    unpublished = facts.entry is not None and facts.training is None and not facts.entry.published
    ours = f"{results['top1']:.2f}" if "top1" in results else ("not published yet" if unpublished else "not measured")
    budget = facts.entry.budget if facts.entry is not None and facts.training is None else None
    rows = [(f"this model ({budget})" if budget else "this model", ours), ("paper, Table 1", paper_text)]
    text = markdown_table(("", "top-1 %"), rows)
    others = {k: v for k, v in results.items() if k != "top1"}
    if others:
        text += "\n\nOther measured metrics: " + ", ".join(f"{k} = {v:g}" for k, v in others.items()) + "."
    return text


def render_card(
    entry_or_config: ZooEntry | Mapping[str, Any],
    results: Mapping[str, float] | None = None,
    *,
    name: str | None = None,
    repo_id: str | None = None,
    evaluation: Mapping[str, Any] | None = None,
    evidence: str = "",
    release: bool = False,
) -> str:
    """Render the Markdown model card (YAML front matter + body) for a zoo entry or a trained model.

    ``entry_or_config`` is a registry ``ZooEntry`` or a config dict as written by
    ``save_pretrained`` (it must hold the training summary). ``results`` are measured metrics in
    percent (``{"top1": 75.3}``); for an entry they default to its published metrics. The
    ``model-index`` block appears only when there are results. ``name`` and ``repo_id`` override
    the registry's. ``evaluation`` (the recipe's linear_eval.json) adds its retrieval and audit,
    when it has them, under the results. ``evidence`` is a Markdown section added last (the
    registry's cards pass the method's runs at the evidence budgets of the dataset,
    `hscl_zoo.reproduction.report.budget_evidence`). ``release`` renders the card
    of a release folder (``hscl-zoo release``): it loads by its zoo name, and the card claims no Hub
    repository, since the folder is built before anything is pushed.
    """
    facts = _facts(entry_or_config, name, repo_id)
    if results is None:
        results = facts.entry.metrics if isinstance(entry_or_config, ZooEntry) else {}
    results = _check_results(results)
    dataset = DATASETS.get(facts.dataset)
    num_classes = dataset.num_classes if dataset else "num_classes"
    if facts.pretrained_cfg is not None:
        num_classes = facts.pretrained_cfg.get("num_classes", num_classes)
    if release or (facts.training is None and facts.entry is not None and facts.entry.name == facts.name):
        load_source = facts.name
    elif facts.hub_repo:
        load_source = f"hf-hub:{facts.hub_repo}"
    else:
        load_source = "local-dir:/path/to/model"
    return CARD_TEMPLATE.substitute(
        front_matter=_front_matter(facts, results),
        name=facts.name,
        status=_release_status(facts.name) if release else _status(facts, results),
        description=_description(facts),
        load_source=load_source,
        num_classes=num_classes,
        backbone=facts.backbone,
        proj_dim=facts.proj_dim,
        preprocessing=_preprocessing(facts),
        training=_training(facts),
        dataset_display=dataset.display if dataset else dataset_label(facts.dataset),
        native_size=dataset.native_size if dataset else "?",
        results=_results(facts, results) + evaluation_sections(evaluation or {}) + evidence,
    )
