"""Turning a finished training run into a release: a folder in the Hub repo's layout, its weights
cast (bfloat16 by default) and sharded, re-evaluated, and the registry entry that pins it.

``hscl-zoo release RUN_DIR --name NAME`` calls :func:`build_release`; the folder holds
``config.json``, the weights (``model.safetensors``, or shards + index), ``README.md`` (the card)
and ``eval.json``: the released weights' own linear head and kNN on the run's test split, with
the float32 run's numbers, the budget, the paper's number, the commit, the command and the
hardware. A cast that costs the linear head more than ``MAX_TOP1_DROP`` points is refused before
anything is written (one that gains as much is refused too: its numbers would not be the run's). ``hscl-zoo push releases/NAME`` uploads that folder as it is
(:func:`push_release`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hscl_zoo._provenance import code_commit, cpu_model
from hscl_zoo.data.catalog import DATASETS
from hscl_zoo.zoo import registry
from hscl_zoo.zoo.releases import pin_folder
from hscl_zoo.zoo.shards import dtype_name

__all__ = ["MAX_TOP1_DROP", "EVAL_NAME", "ReleaseRefused", "Release", "check_release_name", "released_scores",
           "build_release", "release_card", "release_entry", "registry_entry_text", "register_release", "push_release",
           "hardware"]

MAX_TOP1_DROP = 0.2
"""Points of linear top-1 the cast weights may differ by from the run's own float32 result, either
way: a cast that moves test images across the head's decision boundary is not the run's model."""
EVAL_NAME = "eval.json"
CARD_NAME = "README.md"
DEFAULT_SHARD_SIZE = "15MiB"
_TAG_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class ReleaseRefused(ValueError):
    """The cast weights score too far below the run's own float32 result."""


@dataclass(frozen=True)
class Release:
    """A written release: its folder, the eval.json contents and the record of ``released.json``
    that pins it."""

    folder: Path
    evaluation: dict[str, Any]
    entry: dict[str, Any]


def check_release_name(name: str) -> tuple[str, str]:
    """``(zoo name, tag)`` of a release name ``<zoo name>.<tag>``; a one-line ValueError otherwise."""
    base, dot, tag = str(name).partition(".")
    if not dot or not _TAG_RE.match(tag):
        raise ValueError(f"release name {name!r} must be '<zoo name>.<tag>' with a tag of lowercase letters, digits "
                         "and '-' saying the budget, e.g. 'hscl-beta-cifar10.gpu-30ep'.")
    if not registry.is_model(base):
        close = registry.closest_names(base)
        raise ValueError(f"release name {name!r}: {base!r} is not a zoo name" +
                         (f" (closest: {', '.join(close)})" if close else "") + "; list them with 'hscl-zoo list'.")
    return base, tag


def hardware(device: torch.device) -> str:
    """The device in words: the GPU's name, or the CPU's model, visible cores and torch threads."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({cpu_model()}, {os.cpu_count()} cores visible, torch threads {torch.get_num_threads()})"


def released_scores(model: nn.Module, recipe: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The model's own linear head (no probe is refitted) and kNN top-1 on the run's test split,
    the data chosen as the run chose it (dataset, data_dir, subset, full_test, seed)."""
    from hscl_zoo.data.datasets import load_splits
    from hscl_zoo.evaluation import extract_features, knn_top1, topk_accuracy

    data = load_splits(recipe["dataset"], recipe.get("data_dir"), subset=recipe.get("subset"), seed=recipe["seed"],
                       full_test=bool(recipe.get("full_test", False))).labelled()
    options = {"device": device, "progress": False}
    train_f, train_y = extract_features(model.encode, data.train, model.transform, **options)
    test_f, test_y = extract_features(model.encode, data.test, model.transform, **options)
    with torch.inference_mode():
        logits = model.classifier(test_f.to(device)).float().cpu()
    top1, top5 = topk_accuracy(logits, test_y, len(data.class_names))
    knn = knn_top1(train_f, train_y, test_f, test_y, k=recipe["knn_k"], device=device)
    return {"dataset": data.spec.name, "data_dir": recipe.get("data_dir"), "test_split": data.spec.test_split,
            "test_images": len(data.test), "train_images": len(data.train), "linear_top1": top1, "linear_top5": top5,
            "knn_top1": knn, "knn_k": recipe["knn_k"]}


def _budget(training: dict[str, Any], recipe: dict[str, Any]) -> str:
    dataset = DATASETS[training["dataset"]].display
    images = f"a class-balanced {recipe['subset']:,}-image subset of {dataset}" if recipe.get("subset") else \
        f"all of {dataset}"
    precision = {"no": "float32"}.get(training.get("mixed_precision"), training.get("mixed_precision"))
    return (f"{recipe['backbone']} ({recipe.get('stem', 'default')} stem), {training['epochs']} epochs on {images}, "
            f"batch {training['global_batch_size']}, {precision}, {training.get('num_processes', 1)} process(es)")


def _train_command(recipe: dict[str, Any]) -> str:
    from hscl_zoo.training.config import PretrainConfig

    defaults = PretrainConfig().to_dict()
    keys = [k for k, v in recipe.items() if k != "output_dir" and defaults.get(k) != v]
    return "hscl-zoo train " + " ".join(f"--{k} {shlex.quote(json.dumps(recipe[k]) if not isinstance(recipe[k], str) else recipe[k])}"
                                        for k in keys)


def _card(config: dict[str, Any], name: str, evaluation: dict[str, Any], entry: registry.ZooEntry) -> str:
    from hscl_zoo.zoo.cards import render_card

    results = {"top1": evaluation["linear_top1"], "top5": evaluation["linear_top5"], "knn_top1": evaluation["knn_top1"]}
    card = render_card(config, results, name=name, repo_id=f"{registry.HUB_ORG}/{name}", release=True)
    paper = "n/a" if entry.paper_top1 is None else f"{entry.paper_top1:.2f} %"
    budget = evaluation["budget"] if evaluation["budget"].endswith(".") else evaluation["budget"] + "."
    built = ", and `release_command` built this folder" if evaluation.get("release_command") else ""
    section = (
        "## This release\n\n"
        f"Budget: {budget} Not the paper's recipe "
        "(ResNet-50, 200 epochs), whose Table 1 top-1 is "
        f"{paper}. Load it with `hscl_zoo.load(\"{name}\")`: the files are in the hscl_zoo repository under "
        f"`releases/{name}/`, every one pinned by its sha256 in the zoo's registry, and `{registry.HUB_ORG}/{name}` "
        "on the Hub is their home once pushed.\n\n"
        f"`eval.json` holds this release's own evaluation: its weights stored in {evaluation['stored_dtype']} and "
        f"loaded in float32, its linear head on the {evaluation['test_images']:,} images of the "
        f"{evaluation['test_split']} split: top-1 {evaluation['linear_top1']:.2f} % (the float32 run: "
        f"{evaluation['float32_run']['top1']:.2f} %), kNN (k = {evaluation['knn_k']}) top-1 "
        f"{evaluation['knn_top1']:.2f} %. Its `train_command` trains the run again (every argument that differs "
        f"from the defaults){built}.\n\n")
    return card.replace("## Limitations\n", section + "## Limitations\n", 1)


def build_release(
    run_dir: str | os.PathLike[str],
    name: str,
    *,
    dtype: torch.dtype | str = torch.bfloat16,
    out: str | os.PathLike[str] | None = None,
    max_shard_size: int | str = DEFAULT_SHARD_SIZE,
    budget: str | None = None,
    device: str | torch.device = "cpu",
    cast: Callable[[nn.Module], None] | None = None,
    command: str | None = None,
) -> Release:
    """Write the release folder of a finished run (``run_dir/hub`` and ``run_dir/linear_eval.json``).

    The weights are saved in ``dtype``, loaded back from the written files in float32 and
    evaluated; a linear top-1 more than ``MAX_TOP1_DROP`` points from the run's own is refused
    (``ReleaseRefused``, both numbers in the message) and nothing is kept. ``cast`` (for tests)
    edits the model in place before it is saved. ``out`` defaults to ``releases/<name>`` and must
    not hold anything yet; ``command`` is the command line recorded in eval.json.
    """
    from hscl_zoo.zoo.hub import load
    from hscl_zoo.zoo.saving import save_pretrained

    base, tag = check_release_name(name)
    stored = dtype_name(dtype)
    run = Path(run_dir).expanduser()
    hub_dir, run_eval = run / "hub", run / "linear_eval.json"
    if not hub_dir.is_dir() or not run_eval.is_file():
        raise FileNotFoundError(f"{run} is not a finished run ({hub_dir} and {run_eval} are written at its end); "
                                f"finish it with hscl-zoo train --output_dir {run} --resume.")
    target = Path(out) if out is not None else Path("releases") / name
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{target} already holds files; choose another --out or delete it first.")
    float32_run = json.loads(run_eval.read_text())
    model = load(hub_dir)
    training = model.training_summary or {}
    recipe = training.get("recipe_config")
    if not recipe or training.get("dataset") != registry.info(base).dataset or training.get("method") != registry.info(base).method:
        raise ValueError(f"{hub_dir / 'config.json'} was trained as {training.get('method')} on {training.get('dataset')}, "
                         f"not as the zoo's {base}; name the release after what was trained.")
    if cast is not None:
        cast(model)
    device = torch.device(device)
    with tempfile.TemporaryDirectory(prefix=".release-") as staging:
        folder = save_pretrained(model, Path(staging) / name, training=training, dtype=stored,
                                 max_shard_size=max_shard_size)
        released = load(folder, device=device)
        scores = released_scores(released, recipe, device)
        drop = float32_run["top1"] - scores["linear_top1"]
        if abs(drop) > MAX_TOP1_DROP:
            raise ReleaseRefused(
                f"refusing {name}: its {stored} weights' linear top-1 is {scores['linear_top1']:.2f} %, "
                f"{abs(drop):.2f} points {'under' if drop > 0 else 'over'} the run's own float32 "
                f"{float32_run['top1']:.2f} % (at most {MAX_TOP1_DROP} either way); release it in another precision "
                "(--dtype fp16 or fp32) or find what the cast broke.")
        entry = registry.info(base)
        evaluation = {
            "name": name, "tag": tag, **scores, "stored_dtype": stored, "loaded_dtype": "float32",
            "float32_run": {k: float32_run[k] for k in ("top1", "top5", "knn_top1") if k in float32_run},
            "max_top1_drop": MAX_TOP1_DROP, "budget": budget or _budget(training, recipe),
            "paper_top1": entry.paper_top1, "paper_setting": "Table 1 of the paper: ResNet-50, 200 epochs",
            "train_command": _train_command(recipe),
            "release_command": command,
            "commit": code_commit(mark_dirty=False), "hardware": hardware(device), "torch": torch.__version__,
        }
        config = json.loads((folder / "config.json").read_text())
        (folder / CARD_NAME).write_text(_card(config, name, evaluation, entry), encoding="utf-8")
        (folder / EVAL_NAME).write_text(json.dumps(evaluation, indent=2) + "\n", encoding="utf-8")
        target.mkdir(parents=True, exist_ok=True)
        for path in sorted(folder.iterdir()):
            os.replace(path, target / path.name)
    return Release(target, evaluation, release_entry(target))


def release_card(folder: str | os.PathLike[str]) -> str:
    """The card (README.md) of an image release folder, rendered from its config.json and eval.json:
    what ``build_release`` writes, so a card can be regenerated after the template changes."""
    folder = Path(folder)
    config, evaluation = (json.loads((folder / f).read_text(encoding="utf-8")) for f in ("config.json", EVAL_NAME))
    name = evaluation["name"]
    return _card(config, name, evaluation, registry.info(registry.info(name).base_name))


def release_entry(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The registry record of an image release folder as it stands (its eval.json, config.json
    and every file's sha256): what ``--register`` adds to ``released.json``, also for a folder
    built on another machine (a GPU sprint's) and brought back byte for byte."""
    folder = Path(folder)
    if not (folder / EVAL_NAME).is_file() or not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} is not a release folder (it lacks {EVAL_NAME} or config.json); build one "
                                "with hscl-zoo release RUN_DIR --name NAME.")
    evaluation = json.loads((folder / EVAL_NAME).read_text())
    if evaluation.get("name") != folder.name or "linear_top1" not in evaluation:
        raise ValueError(f"{folder} holds the release {evaluation.get('name')!r}, not an image release named after "
                         "its folder; keep the folder's name, and register a graph release with hscl-zoo release "
                         "RUN_DIR --register.")
    config = json.loads((folder / "config.json").read_text())
    entry = registry.info(check_release_name(evaluation["name"])[0])
    pins = pin_folder(folder)
    return {"method": entry.method, "dataset": entry.dataset, "backbone": config["architecture"],
            "budget": evaluation["budget"], "revision": None, "files": {k: pin._asdict() for k, pin in pins.items()},
            "metrics": {"top1": round(evaluation["linear_top1"], 2), "top5": round(evaluation["linear_top5"], 2),
                        "knn_top1": round(evaluation["knn_top1"], 2)}}


def registry_entry_text(name: str, entry: dict[str, Any]) -> str:
    """The release's record as it goes into ``hscl_zoo/zoo/released.json`` (``"name": {...}``)."""
    return f"{json.dumps(name)}: {json.dumps(entry, indent=2)}"


def register_release(name: str, entry: dict[str, Any], released: str | os.PathLike[str] | None = None) -> Path:
    """Add (or replace) the release's record in ``released.json`` (the checkout's by default),
    names sorted, so that the next import of the registry publishes it; returns the file."""
    path = Path(released) if released is not None else registry.RELEASED_FILE
    records = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    records[name] = entry
    path.write_text(json.dumps(dict(sorted(records.items())), indent=2) + "\n", encoding="utf-8")
    return path


def push_release(folder: str | os.PathLike[str], repo_id: str | None = None, *, token: str | None = None,
                 private: bool | None = None) -> tuple[str, str]:
    """Upload exactly the files of a release folder to its Hub repo (``hscl-zoo/<folder name>``
    unless ``repo_id`` says otherwise); returns (repo_id, the commit to pin as ``revision``).
    An upload that fails (offline, no token) is one ``OSError`` line."""
    from huggingface_hub import HfApi

    from hscl_zoo._version import __version__
    from hscl_zoo.zoo.sources import check_repo_id

    folder = Path(folder)
    if not (folder / EVAL_NAME).is_file() or not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} is not a release folder (it lacks {EVAL_NAME} or config.json); build one "
                                "with hscl-zoo release RUN_DIR --name NAME.")
    pin_folder(folder)  # refuses a folder holding anything but files
    repo_id = check_repo_id(repo_id or f"{registry.HUB_ORG}/{folder.resolve().name}", repo_id or folder.name)
    api = HfApi(token=token, library_name="hscl_zoo", library_version=__version__)
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=repo_id, folder_path=folder, repo_type="model",
                                   commit_message=f"Release {folder.name} from hscl_zoo")
    except Exception as err:  # noqa: BLE001 - any failure of the upload is reported as one line
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise OSError(f"could not upload {folder} to {repo_id} ({type(err).__name__}: {reason}); check the network "
                      "and the token (hf auth login), then run hscl-zoo push again.") from None
    return repo_id, commit.oid
