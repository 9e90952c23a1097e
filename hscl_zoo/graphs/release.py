"""Turning a finished graph training run into a release: the run's encoder copied into a folder
in the Hub repo's layout, loaded back from there and evaluated again, with its card and the
registry record that pins it.

``hscl-zoo release RUN_DIR --name hscl-beta-mutag`` calls :func:`build_graph_release` when
RUN_DIR is a graph run (``hscl-zoo train --dataset tu:NAME``). A graph encoder is a few hundred
kilobytes, so it is released in float32 as trained; its name is the paper's own name when it was
trained at Table 2's budget (all of the dataset's graphs, 200 epochs, the paper's GIN), else
``<name>.<tag>``. The folder holds ``config.json``, ``model.safetensors``, ``README.md`` (the card)
and ``eval.json``: the released files' own SVM folds and head accuracy, which must equal the run's
(within ``MAX_ACCURACY_DIFFERENCE`` points) or nothing is written.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from hscl_zoo._provenance import code_commit
from hscl_zoo.graphs.cards import PAPER_SETTING, render_graph_card
from hscl_zoo.graphs.catalog import find_graph_dataset, load_graph_dataset
from hscl_zoo.graphs.recipe import evaluate_graph_encoder
from hscl_zoo.publishing.release import CARD_NAME, EVAL_NAME, Release, ReleaseRefused, hardware
from hscl_zoo.zoo import registry
from hscl_zoo.zoo.releases import pin_folder

__all__ = ["MAX_ACCURACY_DIFFERENCE", "PAPER_EPOCHS", "build_graph_release", "graph_train_command"]

MAX_ACCURACY_DIFFERENCE = 0.2
"""Points of SVM accuracy (and head accuracy) the released files may differ by from the run's own
evaluation: the same float32 weights give the same embeddings, so any difference is a bug."""
PAPER_EPOCHS = 200
WEIGHTS = ("config.json", "model.safetensors")


def method_options(run: dict[str, Any]) -> dict[str, float]:
    """The method's options a graph run was trained with, those left unset (None) dropped."""
    return {key: value for key, value in run["hyperparameters"].items() if value is not None}


def graph_train_command(run: dict[str, Any]) -> str:
    """The ``hscl-zoo train`` line that gives a graph run's eval.json (seed, budget and options)."""
    budget = run["budget"]
    parts = [f"hscl-zoo train --dataset {run['dataset']} --method {run['method']}"]
    parts += [f"--{key} {value:g}" for key, value in method_options(run).items()]
    parts += [f"--temperature {run['temperature']:g}", f"--seed {run['seed']}", f"--epochs {budget['epochs']}",
              f"--lr {budget['lr']:g}", f"--batch_size {budget['batch_size']}", f"--hidden {budget['hidden']}",
              f"--layers {budget['layers']}"]
    return " ".join(parts)


def _budget(run: dict[str, Any], spec_display: str, selection: str | None) -> str:
    budget = run["budget"]
    options = ", ".join(f"{key} = {value:g}" for key, value in method_options(run).items())
    text = (f"all {run['graphs']:,} graphs of {spec_display} (the paper's protocol (a)), GIN {budget['layers']} x "
            f"{budget['hidden']}, {budget['epochs']} epochs of Adam (lr {budget['lr']:g}), batches of "
            f"{budget['batch_size']}, temperature {run['temperature']:g}, seed {run['seed']}")
    if options:
        text += f"; {options}" + (f", {selection}" if selection else "")
    return text


def _check_name(name: str, run: dict[str, Any]) -> registry.ZooEntry | None:
    """The paper entry a release name publishes (None for a method outside Table 2), after
    checking that the run is what the name says."""
    spec = find_graph_dataset(str(run.get("dataset", "")))
    if spec is None:
        raise ValueError(f"the run trained on {run.get('dataset')!r}, not a dataset of the graph table; only table "
                         "datasets are released under zoo names.")
    base, dot, _ = name.partition(".")
    expected = f"{run['method']}-{spec.name}"
    if base != expected:
        raise ValueError(f"release name {name!r}: the run trained {run['method']} on {spec.tu_name}, so its zoo name "
                         f"is {expected!r} (or {expected}.TAG at another budget).")
    at_paper_budget = run["budget"]["epochs"] == PAPER_EPOCHS and run["budget"]["hidden"] == 32 and \
        run["budget"]["layers"] == 3
    if not dot and not at_paper_budget:
        raise ValueError(f"release name {name!r}: the run is not at Table 2's budget (GIN 3 x 32, {PAPER_EPOCHS} "
                         f"epochs); name it {expected}.TAG, the tag saying its budget.")
    return registry.info(base) if registry.is_model(base) else None


def build_graph_release(
    run_dir: str | os.PathLike[str],
    name: str,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    out: str | os.PathLike[str] | None = None,
    selection: str | None = None,
    command: str | None = None,
) -> Release:
    """Write the release folder of a finished graph run (``run_dir/hub`` and ``run_dir/eval.json``).

    The encoder's files are copied, loaded back and evaluated again on the dataset (read from
    ``data_dir`` as ``tu:NAME`` reads it); an SVM or head accuracy more than
    ``MAX_ACCURACY_DIFFERENCE`` points from the run's is refused (``ReleaseRefused``) and nothing
    is kept. ``selection`` says how the method's options were chosen (it goes into the budget);
    ``out`` defaults to ``releases/<name>`` and must not hold anything yet.
    """
    from hscl_zoo.zoo.hub import load

    run_path = Path(run_dir).expanduser()
    hub_dir, run_eval = run_path / "hub", run_path / "eval.json"
    if not (hub_dir / "config.json").is_file() or not run_eval.is_file():
        raise FileNotFoundError(f"{run_path} is not a finished graph run ({hub_dir} and {run_eval} are written at its "
                                "end); train it with hscl-zoo train --dataset tu:NAME --output_dir DIR.")
    run = json.loads(run_eval.read_text(encoding="utf-8"))
    paper = _check_name(name, run)
    target = Path(out) if out is not None else Path("releases") / name
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{target} already holds files; choose another --out or delete it first.")
    spec = find_graph_dataset(run["dataset"])
    budget = _budget(run, spec.display, selection)
    entry = registry.ZooEntry(name=name, method=run["method"], dataset=spec.name, backbone=registry.GRAPH_BACKBONE,
                              hub_repo=f"{registry.HUB_ORG}/{name}", paper_top1=None if paper is None else paper.paper_top1,
                              tag=name.partition(".")[2] or None, budget=budget, hyperparameters=method_options(run))
    graphs = load_graph_dataset(run["dataset"], data_dir)
    with tempfile.TemporaryDirectory(prefix=".release-") as staging:
        folder = Path(staging) / name
        folder.mkdir()
        for file in WEIGHTS:
            shutil.copyfile(hub_dir / file, folder / file)
        released = evaluate_graph_encoder(load(folder), graphs, seed=run["seed"], folds=len(run["svm"]["folds"]))
        checks = {"SVM accuracy": (released["svm"]["accuracy_mean"], run["svm"]["accuracy_mean"]),
                  "head accuracy": (released["head_accuracy"], run["linear_head"]["train_accuracy"])}
        for what, (now, then) in checks.items():
            if now is None or abs(100 * (now - then)) > MAX_ACCURACY_DIFFERENCE:
                shown = "none" if now is None else f"{100 * now:.2f} %"
                raise ReleaseRefused(f"refusing {name}: the released files' {what} is {shown}, the run's was "
                                     f"{100 * then:.2f} % (at most {MAX_ACCURACY_DIFFERENCE} points apart); the "
                                     f"files in {hub_dir} are not the run's encoder.")
        metrics = {"svm_accuracy": round(100 * released["svm"]["accuracy_mean"], 2),
                   "linear_cv_accuracy": round(100 * run["linear_head"]["cv_accuracy"], 2)}
        evaluation = {
            "name": name, "dataset": spec.name, "tu_name": spec.tu_name, "graphs": released["graphs"],
            "method": run["method"], "hyperparameters": method_options(run), "seed": run["seed"],
            "svm": released["svm"], "linear_head": run["linear_head"], "head_accuracy": released["head_accuracy"],
            "metrics": metrics, "budget": budget,
            "paper_accuracy": None if paper is None else paper.paper_top1, "paper_setting": PAPER_SETTING,
            "train_command": graph_train_command(run), "release_command": command,
            "commit": code_commit(mark_dirty=False), "hardware": hardware(torch.device("cpu")), "torch": torch.__version__,
        }
        (folder / CARD_NAME).write_text(render_graph_card(entry, evaluation, metrics), encoding="utf-8")
        (folder / EVAL_NAME).write_text(json.dumps(evaluation, indent=2) + "\n", encoding="utf-8")
        target.mkdir(parents=True, exist_ok=True)
        for path in sorted(folder.iterdir()):
            os.replace(path, target / path.name)
    pins = pin_folder(target)
    record = {"method": run["method"], "dataset": spec.name, "backbone": registry.GRAPH_BACKBONE,
              "hyperparameters": method_options(run), "budget": evaluation["budget"], "revision": None,
              "files": {k: pin._asdict() for k, pin in pins.items()}, "metrics": metrics}
    return Release(target, evaluation, record)
