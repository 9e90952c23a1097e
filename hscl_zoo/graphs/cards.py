"""Model cards of graph encoders (the paper's Table 2): what the encoder is, how to load and use
it, what trained it, and how its SVM accuracy compares with the paper's.

`render_graph_card` renders the card of a registry entry (the checked-in ``model_cards/``) and,
given the release's ``eval.json``, the card a release folder carries as README.md. Numbers come
from the entry's metrics or the evaluation, never from the text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from hscl_zoo.graphs.catalog import GRAPH_DATASETS
from hscl_zoo.losses.methods import METHODS
from hscl_zoo.zoo.registry import PAPER_BIBTEX, ZooEntry

__all__ = ["GRAPH_METRICS", "render_graph_card"]

GRAPH_METRICS = {
    "svm_accuracy": "SVM accuracy, 10-fold cross-validation of the frozen embeddings (seed 0's folds)",
    "linear_cv_accuracy": "linear head (logistic regression), 10-fold cross-validated accuracy",
}
"""The metrics a graph release records (%), and what each one is."""

PAPER_SETTING = ("Table 2 of the paper: a 3-layer GIN, 200 epochs of Adam (lr 0.01), an SVM on the frozen "
                 "embeddings, 10-fold cross-validation repeated over seeds")


def _front_matter(entry: ZooEntry, metrics: Mapping[str, float]) -> str:
    header: dict[str, Any] = {
        "library_name": "hscl_zoo",
        "license": "apache-2.0",
        "pipeline_tag": "graph-ml",
        "tags": ["graph-classification", "contrastive-learning", "hard-negative-sampling", "hscl_zoo",
                 entry.method, entry.backbone],
        "metrics": ["accuracy"],
    }
    if metrics:
        spec = GRAPH_DATASETS[entry.dataset]
        header["model-index"] = [{"name": entry.name, "results": [{
            "task": {"type": "graph-classification", "name": "Graph classification"},
            "dataset": {"name": f"TU {spec.tu_name}", "type": spec.tu_name},
            "metrics": [{"type": "accuracy", "value": round(float(metrics[key]), 2), "name": GRAPH_METRICS[key]}
                        for key in GRAPH_METRICS if key in metrics]}]}]
    return "---\n" + yaml.safe_dump(header, sort_keys=False, allow_unicode=True) + "---\n"


def _method_text(entry: ZooEntry) -> str:
    method = METHODS[entry.method]
    options = ", ".join(f"{key} = {value:g}" for key, value in entry.hyperparameters.items())
    return f"{method.display}" + (f" ({options})" if options else "")


def _results(entry: ZooEntry, metrics: Mapping[str, float]) -> str:
    spec = GRAPH_DATASETS[entry.dataset]
    paper = "n/a (the method is not in Table 2)" if entry.paper_top1 is None else f"{entry.paper_top1:.1f}"
    rows = [f"| the paper's Table 2 ({spec.display}, {METHODS[entry.method].display}) | {paper} |"]
    rows += [f"| this model: {GRAPH_METRICS[key]} | {float(metrics[key]):.2f} |" for key in GRAPH_METRICS if key in metrics]
    return ("| | accuracy % |\n|---|---:|\n" + "\n".join(rows) + "\n\n"
            "The paper's number is the mean over 10 seeds of 10-fold SVM accuracy, with the best beta per dataset "
            "chosen on that accuracy. This model's numbers are one encoder (seed 0). The whole table, every method "
            "and beta over seeds and both protocols, is in `results/graphs-paper/summary.md` of the hscl_zoo "
            "repository.\n")


def _evaluation(evaluation: Mapping[str, Any]) -> str:
    svm = evaluation["svm"]
    folds = ", ".join(f"{100 * fold['test_accuracy']:.1f}" for fold in svm["folds"])
    return ("\n## This release's evaluation\n\n"
            f"`eval.json` holds the evaluation of the released files themselves, loaded back from this folder on "
            f"{evaluation['hardware']} with torch {evaluation['torch']}: the SVM's 10 outer folds (accuracy %: "
            f"{folds}; mean {100 * svm['accuracy_mean']:.2f}, std {100 * svm['accuracy_std']:.2f}), each with the C "
            f"its inner cross-validation chose, and the linear head's accuracy on all {evaluation['graphs']} graphs "
            f"it was fitted on ({100 * evaluation['head_accuracy']:.2f} %). Trained at commit "
            f"`{evaluation['commit']}` with `{evaluation['train_command']}`.\n")


def render_graph_card(entry: ZooEntry, evaluation: Mapping[str, Any] | None = None,
                      metrics: Mapping[str, float] | None = None) -> str:
    """The Markdown card (YAML front matter and body) of a graph zoo entry; `metrics` default to
    the entry's, and `evaluation` (a release's eval.json) adds its own section."""
    if entry.modality != "graph":
        raise ValueError(f"{entry.name} is an image model; its card is hscl_zoo.zoo.cards.render_card's.")
    metrics = dict(entry.metrics if metrics is None else metrics)
    spec = GRAPH_DATASETS[entry.dataset]
    status = ("Published: its files are pinned by sha256 in the zoo's registry, in `releases/" + entry.name + "/` of "
              "the hscl_zoo repository (the Hub repo `" + entry.hub_repo + "` is their home once pushed)."
              if entry.published or evaluation is not None else
              "Not published yet: the registry names it, and `" + entry.train_command + " --output_dir DIR` trains it.")
    budget = entry.budget or (evaluation or {}).get("budget") or PAPER_SETTING
    body = f"""
# {entry.name}

A graph encoder trained with {_method_text(entry)}, from "Supervised Contrastive Learning with Hard
Negative Samples" (Jiang, Nguyen, Ishwar, Aeron), on the TU dataset {spec.tu_name} ({spec.num_graphs} graphs,
{spec.num_classes} classes), with a linear head over its classes. {status}

## Use it

```python
import hscl_zoo

encoder = hscl_zoo.load("{entry.name}")
embeddings = encoder.embed("path/to/{spec.tu_name}")   # (graphs, 96): a TU folder, a GraphSet or PyG Data / Batch
probabilities = encoder.predict("path/to/{spec.tu_name}")   # (graphs, {spec.num_classes}): classes in sorted label order
```

`hscl-zoo embed {entry.name} tu:{spec.tu_name} --out {spec.name}.parquet` writes the embeddings, and
`hscl-zoo eval {entry.name}` repeats the SVM and linear-head evaluation.

## The encoder

InfoGraph's GIN ({entry.backbone}): 3 GIN layers of 32 units over one-hot node features, each
layer's nodes summed into the graph, the three sums concatenated into a 96-d embedding. Training
used the local-global objective (nodes of a graph against graphs) with the method's negatives and
hardening; see docs/graphs.md of the hscl_zoo repository for every decision and its source.

## Training

{budget}.

Train it again: `{entry.train_command} --output_dir DIR`.

## Results

{_results(entry, metrics)}{_evaluation(evaluation) if evaluation else ""}
## Limitations

Protocol (a), the paper's: the encoder saw every graph of the dataset during training (and, for
the label-aware methods, every label), so the SVM's test folds are not held out from the encoder.
The leak-free protocol (b) is in the repository's results. The encoder suits {spec.tu_name}'s node
labels (or degrees) only: another dataset's nodes need an encoder trained on it.

## Citation

"""
    return _front_matter(entry, metrics) + body + PAPER_BIBTEX
