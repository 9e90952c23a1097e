"""Evidence on a budget's encoders beyond their own probe: retrieval, transfer, and fine-tuning
against training from scratch, one JSON per (method, seed) and a table rendered from those files.

For each finished run ``<runs>/<method>-s<seed>/`` of a budget (its Hub folder ``hub/`` holds the
weights), ``<out>/evidence/<method>-s<seed>.json`` gathers:

- ``retrieval`` on the run's own dataset: the block the pretraining recipe's final evaluation wrote
  to the run's ``linear_eval.json``, else measured by :func:`hscl_zoo.evaluation.evaluate_model`;
- ``transfer``: per target, the row :func:`hscl_zoo.evaluation.evaluate_transfer` gives (a linear
  probe, kNN and retrieval of the target's own classes on frozen features);
- ``finetune``: per number of epochs, :mod:`hscl_zoo.training.finetune` on the run's own training
  data, once from the encoder and once from a randomly initialised copy of its architecture with
  the same seed, data and batch size, hence the same steps (the from-scratch run is shared by
  every method of a seed: it does not depend on the method).

Each part is written as soon as it is measured, with the code's commit, the hardware and the
seconds it took, and a later call measures only what is missing. Fine-tuning folders (weights)
live in ``<out>/evidence/<name>/``, which git ignores. :func:`render_summary` turns the JSON files
alone into summary.md.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hscl_zoo.data.catalog import DATASETS
from hscl_zoo.evaluation import evaluate_model, evaluate_transfer
from hscl_zoo.losses.methods import METHODS
from hscl_zoo.models import ContrastiveEncoder
from hscl_zoo.reproduction.report import RESULTS_BEGIN, RESULTS_END, read_records
from hscl_zoo._provenance import code_commit
from hscl_zoo.reproduction.runs import hardware
from hscl_zoo.reproduction.summary import display
from hscl_zoo.training.finetune import METRICS_NAME, build_parser
from hscl_zoo.training.finetune import main as finetune_main
from hscl_zoo.zoo.hub import WEIGHTS_NAME, load
from hscl_zoo.zoo.saving import save_pretrained

Record = dict[str, Any]
TRANSFER_METRICS = ("linear", "knn", "retrieval")
"""What each transfer row measures (the audit is left out: it reads the source run's training
hardening, which means nothing on another dataset's classes)."""


@dataclass(frozen=True)
class EvidenceSettings:
    """What to measure for every encoder: transfer targets (registered names or own data such as
    ``imagefolder:PATH``), fine-tuning epochs (0: none) and batch size (None: the recipe's
    default), and the folder holding each registered dataset's parquet copy as ``<data_root>/<name>``
    (None: the run's own data folder for its dataset, the Hub for others)."""

    transfer: tuple[str, ...] = ()
    finetune_epochs: int = 0
    finetune_batch_size: int | None = None
    data_root: Path | None = None


def dataset_dir(dataset: str, data_root: Path | None) -> str | None:
    """``<data_root>/<dataset>`` for a registered dataset read from parquet files; None for own
    data (its name holds its path), an in-memory dataset (digits) or no data_root."""
    spec = DATASETS.get(dataset)
    if data_root is None or spec is None or spec.builder is not None:
        return None
    folder = Path(data_root) / dataset
    if not folder.is_dir():
        raise ValueError(f"{folder} does not exist: put {dataset}'s parquet files there, or pass the --data_root "
                         f"that holds a {dataset}/ folder.")
    return str(folder)


def finished_methods(runs: Path, methods: Sequence[str], seed: int) -> list[str]:
    """The `methods` whose run of `seed` under `runs` has its Hub folder's weights."""
    return [m for m in methods if (runs / f"{m}-s{seed}" / "hub" / WEIGHTS_NAME).is_file()]


def _measured(measure: Callable[[], Record]) -> Record:
    started = time.perf_counter()
    result = measure()
    return {**result, "seconds": time.perf_counter() - started, "commit": code_commit(), "hardware": hardware()}


def own_retrieval(run_dir: Path, data_root: Path | None) -> Record:
    """Retrieval on the run's own dataset (test queries, training gallery): read from the run's
    linear_eval.json when the recipe measured it, else measured with the run's own settings."""
    evaluation_path = run_dir / "linear_eval.json"
    evaluation = json.loads(evaluation_path.read_text()) if evaluation_path.is_file() else {}
    if "retrieval" in evaluation:
        return {"source": str(evaluation_path), "metrics": evaluation["retrieval"],
                "protocol": evaluation["protocol"]["retrieval"], "commit": _run_commit(run_dir)}

    def measure() -> Record:
        hub = run_dir / "hub"
        trained_on = load(hub).training_summary["dataset"]
        result = evaluate_model(hub, metrics=("retrieval",), data_dir=dataset_dir(trained_on, data_root), progress=False)
        return {"source": "evaluate_model", "metrics": result["retrieval"], "protocol": result["protocol"]["retrieval"]}

    return _measured(measure)


def own_probe(run_dir: Path) -> Record:
    """The encoder's linear probe and kNN top-1 on its own dataset, as the pretraining recipe's final
    evaluation wrote them to the run's linear_eval.json (which encoders the other columns measured)."""
    evaluation = json.loads((run_dir / "linear_eval.json").read_text())
    return {"source": str(run_dir / "linear_eval.json"), "top1": evaluation["top1"], "knn_top1": evaluation["knn_top1"],
            "commit": _run_commit(run_dir)}


def _run_commit(run_dir: Path) -> str | None:
    """The commit that trained the run, from its record ``<runs>/<method>-s<seed>.json`` (None without one)."""
    record_path = run_dir.parent / f"{run_dir.name}.json"
    return json.loads(record_path.read_text()).get("commit") if record_path.is_file() else None


def transfer_row(hub: Path, target: str, data_root: Path | None) -> Record:
    """The :func:`evaluate_transfer` row of `target` for the encoder in `hub`."""
    return evaluate_transfer(hub, [target], data_dirs=[dataset_dir(target, data_root)], metrics=TRANSFER_METRICS,
                             progress=False)["rows"][0]


def scratch_copy(encoder: ContrastiveEncoder, folder: Path, seed: int) -> Path:
    """A randomly initialised encoder of `encoder`'s architecture (timm's initialisation under torch
    seed `seed`) saved in `folder`, or the one already there once checked to be the same architecture."""
    config = encoder.model_config()
    if (folder / WEIGHTS_NAME).is_file():
        if load(folder).model_config() != config:
            raise ValueError(f"{folder} holds an untrained encoder of another architecture than {encoder.backbone_name} "
                             f"with classes {encoder.class_names[:3]}...; evidence of one budget shares it, so use "
                             "another --out for another budget.")
        return folder
    torch.manual_seed(seed)
    fresh = ContrastiveEncoder.from_config(config)
    training = {"dataset": encoder.training_summary["dataset"], "method": "none", "hyperparameters": {}, "epochs": 0,
                "global_batch_size": 0, "expected_negatives_per_anchor": None,
                "initialisation": f"random (timm's), torch seed {seed}"}
    return save_pretrained(fresh, folder, training=training)


def finetune_run(model: Path, options: list[str], folder: Path) -> Record:
    """Fine-tune `model` with the recipe's `options` into `folder` (resumed if interrupted, read
    if finished); its test top-1/top-5, steps and per-epoch history from the files it wrote."""
    argv = [str(model), *options, "--output_dir", str(folder)]
    saved_path = folder / "finetune_config.json"
    if saved_path.is_file():
        given = {k: v for k, v in vars(build_parser().parse_args(argv)).items() if k not in ("resume", "overwrite")}
        saved = json.loads(saved_path.read_text())
        if given["augmentation"] is None:  # the dataset's default, which the run resolved and saved
            given["augmentation"] = saved.get("augmentation")
        changed = sorted(k for k in given if saved.get(k) != given[k])
        if changed:
            raise ValueError(f"{folder} holds a fine-tuning run with other settings ({', '.join(changed)}); delete "
                             "that folder to fine-tune again with these.")
    hub = folder / "hub"
    if not (hub / METRICS_NAME).is_file():
        finetune_main(argv + (["--resume"] if saved_path.is_file() else []))
    metrics = json.loads((hub / METRICS_NAME).read_text())
    protocol = json.loads((hub / "config.json").read_text())["training"]["finetune"]
    history = metrics["history"]
    return {"model": str(model), "output": str(hub), **metrics["evaluation"], "head": protocol["head"],
            "epochs": protocol["epochs"], "batch_size": protocol["batch_size"], "total_steps": protocol["total_steps"],
            "train_seconds": sum(h["epoch_seconds"] for h in history), "history": history}


def finetune_pair(run_dir: Path, evidence_dir: Path, seed: int, settings: EvidenceSettings) -> Record:
    """Fine-tune the run's encoder and a from-scratch copy of it for the same steps on the run's own
    training data (its dataset, subset and seed)."""
    hub = run_dir / "hub"
    encoder = load(hub)
    training = encoder.training_summary
    recipe = training.get("recipe_config") or {}
    dataset = training["dataset"]
    data_dir = dataset_dir(dataset, settings.data_root) or recipe.get("data_dir")
    epochs = settings.finetune_epochs
    options = ["--dataset", dataset, "--epochs", str(epochs), "--seed", str(seed)]
    options += ["--data_dir", data_dir] if data_dir else []
    options += ["--subset", str(recipe["subset"])] if recipe.get("subset") else []
    batch = settings.finetune_batch_size
    options += ["--batch_size", str(batch)] if batch else []
    scratch = scratch_copy(encoder, evidence_dir / f"scratch-s{seed}", seed)
    name = f"e{epochs}" + (f"-b{batch}" if batch else "")
    return {"dataset": dataset, "subset": recipe.get("subset"), "epochs": epochs, "seed": seed,
            "from_encoder": finetune_run(hub, options, evidence_dir / f"finetune-{run_dir.name}-{name}"),
            "from_scratch": finetune_run(scratch, options, evidence_dir / f"scratch-s{seed}-{name}")}


def collect(runs: Path, evidence_dir: Path, budget: str, method: str, seed: int, settings: EvidenceSettings) -> Record:
    """The evidence record of one (method, seed), measuring only what its JSON file lacks and
    writing the file after each part."""
    run_dir = runs / f"{method}-s{seed}"
    path = evidence_dir / f"{method}-s{seed}.json"
    record: Record = json.loads(path.read_text()) if path.is_file() else {
        "budget": budget, "method": method, "seed": seed, "encoder": str(run_dir / "hub"),
        "trained_on": load(run_dir / "hub").training_summary["dataset"], "transfer": {}, "finetune": {}}

    def part(section: Record | None, key: str, measure: Callable[[], Record]) -> None:
        target = record if section is None else section
        if key in target:
            return
        print(f"[{method}-s{seed}] {key}", flush=True)
        target[key] = measure()
        path.write_text(json.dumps(record, indent=2) + "\n")

    evidence_dir.mkdir(parents=True, exist_ok=True)
    part(None, "probe", lambda: own_probe(run_dir))
    part(None, "retrieval", lambda: own_retrieval(run_dir, settings.data_root))
    for target in settings.transfer:
        part(record["transfer"], target, lambda: _measured(lambda: transfer_row(run_dir / "hub", target, settings.data_root)))
    if settings.finetune_epochs:
        part(record["finetune"], str(settings.finetune_epochs),
             lambda: _measured(lambda: finetune_pair(run_dir, evidence_dir, seed, settings)))
    return record


def gather(runs: Path, evidence_dir: Path, budget: str, methods: Sequence[str], seed: int,
           settings: EvidenceSettings) -> list[Record]:
    """:func:`collect` for each of `methods` whose run of `seed` is finished (the others are named
    and skipped); a ValueError when none is."""
    finished = finished_methods(runs, methods, seed)
    if not finished:
        raise ValueError(f"no run of seed {seed} under {runs} has its weights (<method>-s{seed}/hub/{WEIGHTS_NAME}); "
                         f"train them first (python recipes/reproduce.py --budget {budget} --seeds {seed}) or pass "
                         "--runs.")
    for method in methods:
        if method not in finished:
            print(f"[{method}-s{seed}] skipped: {runs / f'{method}-s{seed}'} has no trained weights yet", flush=True)
    return [collect(runs, evidence_dir, budget, method, seed, settings) for method in finished]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render_summary(budget: str, records: list[Record]) -> str:
    """summary.md of a budget's evidence: one row per (method, seed) with retrieval on its own
    data, each transfer target's probe and kNN, and fine-tuned against from-scratch top-1."""
    order = list(METHODS)
    records = sorted(records, key=lambda r: (order.index(r["method"]), r["seed"]))
    targets = list(dict.fromkeys(t for r in records for t in r["transfer"]))
    epochs = sorted({int(e) for r in records for e in r["finetune"]})
    header = ["method", "seed", "linear top-1 (%)", "kNN top-1 (%)", "Recall@1 (%)", "MAP@R (%)"]
    header += [f"{t}: {kind} (%)" for t in targets for kind in ("linear top-1", "kNN top-1", "MAP@R")]
    header += [f"{e}-epoch fine-tune {kind}" for e in epochs for kind in ("from encoder (%)", "from scratch (%)",
                                                                            "difference (points)")]
    text = io.StringIO()
    trained_on = sorted({r["trained_on"] for r in records})
    text.write(f"# Evidence: budget `{budget}`\n\nEncoders trained on {', '.join(trained_on)}; every number below is "
               "read from `evidence/*.json` by `recipes/evidence.py`.\n\n")
    text.write(RESULTS_BEGIN + "\n")
    text.write("| " + " | ".join(header) + " |\n|---|---:|" + "---:|" * (len(header) - 2) + "\n")
    for r in records:
        own = r["retrieval"]["metrics"]
        probe = r.get("probe", {})
        cells = [display(r["method"]), str(r["seed"]), _pct(probe.get("top1")), _pct(probe.get("knn_top1")),
                 _pct(own["recall_at_1"]), _pct(own["map_at_r"])]
        for t in targets:
            row = r["transfer"].get(t)
            cells += [_pct(row["top1"]), _pct(row["knn_top1"]), _pct(row["retrieval"]["map_at_r"])] if row else ["-"] * 3
        for e in epochs:
            pair = r["finetune"].get(str(e))
            if pair is None:
                cells += ["-"] * 3
                continue
            tuned, scratch = pair["from_encoder"]["top1"], pair["from_scratch"]["top1"]
            cells += [_pct(tuned), _pct(scratch), f"{tuned - scratch:+.2f}"]
        text.write("| " + " | ".join(cells) + " |\n")
    if lines := reading(records, targets, epochs):
        text.write("\n" + lines)
    text.write("\n" + _protocol_notes(records, targets))
    text.write(RESULTS_END + "\n")
    return text.getvalue()


def _extremes(values: list[tuple[str, float]]) -> str:
    """'highest A (x), lowest B (y); a spread of z points', naming every method tied at the
    reported two decimals."""
    shown = [(name, round(value, 2)) for name, value in values]
    top, bottom = max(v for _, v in shown), min(v for _, v in shown)

    def names(target: float) -> str:
        return " and ".join(name for name, v in shown if v == target)

    return f"highest {names(top)} ({top:.2f}), lowest {names(bottom)} ({bottom:.2f}); a spread of {top - bottom:.2f} points"


def reading(records: list[Record], targets: list[str], epochs: list[int]) -> str:
    """What the table shows, generated from its rows: per seed, each column's highest and lowest
    methods, and for each fine-tuning schedule how many encoders beat training from scratch."""
    lines = []
    seeds = sorted({r["seed"] for r in records})
    for seed in seeds:
        rows = [r for r in records if r["seed"] == seed]
        prefix = f"Seed {seed}, " if len(seeds) > 1 else ""
        columns: list[tuple[str, Callable[[Record], float | None]]] = [
            ("own-data linear top-1", lambda r: r.get("probe", {}).get("top1")),
            ("own-data Recall@1", lambda r: r["retrieval"]["metrics"]["recall_at_1"]),
            ("own-data MAP@R", lambda r: r["retrieval"]["metrics"]["map_at_r"])]
        for t in targets:
            columns += [(f"{t} linear top-1", lambda r, t=t: r["transfer"][t]["top1"] if t in r["transfer"] else None),
                        (f"{t} kNN top-1", lambda r, t=t: r["transfer"][t]["knn_top1"] if t in r["transfer"] else None),
                        (f"{t} MAP@R", lambda r, t=t: r["transfer"][t]["retrieval"]["map_at_r"]
                         if t in r["transfer"] else None)]
        for label, value in columns:
            values = [(display(r["method"]), v) for r in rows if (v := value(r)) is not None]
            if len(values) > 1:
                lines.append(f"{prefix}{label}: {_extremes(values)}.")
        for e in epochs:
            gains = [r["finetune"][str(e)]["from_encoder"]["top1"] - r["finetune"][str(e)]["from_scratch"]["top1"]
                     for r in rows if str(e) in r["finetune"]]
            if not gains:
                continue
            ahead = sum(g > 0 for g in gains)
            lines.append(f"{prefix}{e}-epoch fine-tune: from the encoder above from scratch for {ahead} of {len(gains)} "
                         f"method{'s' if len(gains) > 1 else ''}, by {min(gains):+.2f} to {max(gains):+.2f} points.")
    if not lines:
        return ""
    return "What the rows show (generated from them):\n\n" + "".join(f"* {line}\n" for line in lines)


def _protocol_notes(records: list[Record], targets: list[str]) -> str:
    """How the columns were measured, what one seed cannot show, and the provenance."""
    notes = io.StringIO()
    notes.write("Linear and kNN top-1: the encoder's own probe, from its run's linear_eval.json. "
                "Retrieval: each test image of the encoder's own dataset queries its training images by cosine "
                "similarity. Transfer: a linear probe, kNN and retrieval of each target's own classes on frozen "
                "features, every target read through the encoder's own preprocessing.")
    for target in targets:
        rows = [r["transfer"][target] for r in records if target in r["transfer"]]
        train = sorted({row["train_images"] for row in rows})
        test = sorted({row["protocol"]["num_test"] for row in rows})
        notes.write(f" {target}: {'/'.join(map(str, train))} training images, {'/'.join(map(str, test))} test "
                    f"images ({rows[0]['test_split']}).")
    pairs = [p for r in records for p in r["finetune"].values()]
    for e in sorted({p["epochs"] for p in pairs}):
        same = [p for p in pairs if p["epochs"] == e]
        steps = sorted({p[side]["total_steps"] for p in same for side in ("from_encoder", "from_scratch")})
        first = same[0]["from_encoder"]
        notes.write(f" Fine-tuning, {e} epoch{'s' if e > 1 else ''}: the whole network and its head with cross-entropy on "
                    f"{same[0]['dataset']} (subset {same[0]['subset']}), batch {first['batch_size']}, "
                    f"{'/'.join(map(str, steps))} steps from the encoder (its probe's head) and from a random "
                    f"initialisation of the same architecture (same seed and data order); top-1 on "
                    f"{first['test_images']} {first['test_split']} images after the last epoch.")
    notes.write("\n\nWhat one seed cannot show: each row is one training run, so a difference between two methods "
                "carries no interval here; the seed-to-seed spread of the budget's own probe (the ± column of its "
                "summary.md) is the scale below which a difference may be noise. A fine-tuning gain over training "
                "from scratch is measured at one short schedule; it says nothing about longer ones.\n\n")
    commits = sorted({_short(part["commit"]) if part.get("commit") else "not recorded" for part in _parts(records)})
    hardware_names = sorted({part["hardware"] for part in _parts(records) if "hardware" in part})
    minutes = sum(part.get("seconds", 0.0) for part in _parts(records)) / 60
    notes.write(f"Code: commit {', '.join(commits)}. Hardware: {'; '.join(hardware_names) or 'not recorded'}. "
                f"Measuring took {minutes:.1f} min in all.\n")
    return notes.getvalue()


def _short(commit: str) -> str:
    return commit[:12] + ("+dirty" if commit.endswith("+dirty") else "")


def _parts(records: list[Record]) -> list[Record]:
    return [part for r in records
            for part in ([r["probe"]] if "probe" in r else []) + [r["retrieval"], *r["transfer"].values(),
                                                                  *r["finetune"].values()]]


def summarise(evidence_dir: Path, budget: str) -> str:
    """Rewrite ``<evidence_dir>/summary.md`` from its ``*.json`` files alone; return its text."""
    records = read_records(evidence_dir)
    if not records:
        raise ValueError(f"{evidence_dir} holds no evidence file (*.json) to summarise yet; run recipes/evidence.py "
                         "without --summary-only first.")
    text = render_summary(budget, records)
    (evidence_dir / "summary.md").write_text(text)
    return text
