"""``hscl-zoo train``, ``eval`` and ``embed`` on graphs: what the command line runs for ``tu:`` datasets
and graph-encoder folders.

Training runs in this process (no Accelerate: a TU dataset trains on one CPU thread) and writes
into a new or empty ``--output_dir``: ``metrics.jsonl`` (epoch, mean loss) as the epochs go, then
``hub/`` (the encoder with a linear head, `save_graph_encoder`'s folder) and ``eval.json`` (the
paper's protocol (a): the RBF SVM's 10-fold accuracy on the frozen embeddings, with the seed's
folds, and the linear head's cross-validated accuracy). Every check of the input (the dataset,
the folds, the method's options, the folder) runs before the first write. This module imports
only the standard library at load time, so the command line stays fast.
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from hscl_zoo.graphs.encoder import GraphEncoder
    from hscl_zoo.graphs.graphset import GraphSet

__all__ = ["build_train_parser", "train_main", "graph_model_folder", "is_graph_command", "svm_summary",
           "evaluate_graph_encoder", "eval_command", "embed_command", "RUN_FILES"]

RUN_FILES = ("metrics.jsonl", "hub", "eval.json")
"""What a graph training run writes into its output_dir."""
LOSS_OPTIONS = ("beta", "threshold", "tau_plus", "temperature")
IMAGE_ONLY_EVAL_OPTIONS = ("subset", "full_test", "labelled_fraction", "probe_epochs", "knn_k")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def build_train_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The options of ``hscl-zoo train --dataset tu:NAME`` (defaults: the paper's Table 2 budget)."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Train a GIN graph encoder with a method's local-global objective, fit its linear "
        "head, and cross-validate an SVM on its embeddings (the paper's Table 2 protocol (a)). See docs/graphs.md.")
    parser.add_argument("--dataset", required=True, help="tu:NAME (MUTAG, ENZYMES, PTC_MR, IMDB-BINARY, IMDB-MULTI; "
                        "read from --data_dir) or tu:/path/NAME, your own TU folder")
    parser.add_argument("--method", required=True, help="ucl, hucl, scl, hscl-beta, hscl-tau, or a registered method")
    parser.add_argument("--beta", type=float, help="tilt strength (hucl, hscl-beta; default: the method table's)")
    parser.add_argument("--threshold", type=float, help="hardening threshold (hscl-tau, or hucl instead of beta)")
    parser.add_argument("--tau_plus", type=float, help="hucl's debiasing class prior (default 0: off)")
    parser.add_argument("--temperature", type=float, help="T of the scaled scores (default 0.5)")
    parser.add_argument("--epochs", type=_positive_int, default=200, help="default: %(default)s (the paper's)")
    parser.add_argument("--seed", type=int, default=0, help="initialisation, batch order and CV folds (default 0)")
    parser.add_argument("--lr", type=_positive_float, default=0.01, help="Adam learning rate (default: %(default)s)")
    parser.add_argument("--batch_size", type=_positive_int, default=128, help="graphs per batch (default: %(default)s)")
    parser.add_argument("--hidden", type=_positive_int, default=32, help="GIN width (default: %(default)s)")
    parser.add_argument("--layers", type=_positive_int, default=3, help="GIN layers (default: %(default)s)")
    parser.add_argument("--folds", type=_positive_int, default=10, help="outer folds of the SVM and the linear "
                        "head's cross-validation (default: %(default)s)")
    parser.add_argument("--data_dir", help="folder holding NAME/raw/ for tu:NAME (default: $HSCL_ZOO_TU_ROOT, else "
                        "~/.cache/hscl_zoo/tudataset, downloaded there with PyTorch Geometric)")
    parser.add_argument("--output_dir", required=True, type=Path, help="a new or empty folder for the run")
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")
    return parser


def _check_output_dir(output_dir: Path) -> None:
    if output_dir.exists() and not output_dir.is_dir():
        raise ValueError(f"output_dir {output_dir} is a file; choose a folder for --output_dir.")
    if output_dir.is_dir():
        contents = sorted(p.name for p in output_dir.iterdir())
        if contents:
            raise ValueError(f"output_dir {output_dir} is not empty ({', '.join(contents[:5])}"
                             f"{' ...' if len(contents) > 5 else ''}): a graph run starts in a new or empty folder. "
                             "Choose another --output_dir.")


def svm_summary(embeddings: np.ndarray, labels: np.ndarray, seed: int, folds: int) -> dict[str, Any]:
    """The SVM's cross-validation (`svm_folds`) with its mean and (population) std test accuracy."""
    import numpy as np

    from hscl_zoo.graphs.svm import svm_folds

    records = svm_folds(embeddings, labels, seed, folds)
    accuracies = np.array([r["test_accuracy"] for r in records])
    return {"accuracy_mean": float(accuracies.mean()), "accuracy_std": float(accuracies.std()),
            "inner_accuracy_mean": float(np.mean([r["inner_accuracy"] for r in records])), "folds": records}


def train_main(argv: Sequence[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    """Run ``hscl-zoo train --dataset tu:...``; returns what it wrote to eval.json."""
    args = build_train_parser(prog).parse_args(argv)
    from hscl_zoo.graphs.catalog import load_graph_dataset
    from hscl_zoo.graphs.objective import build_graph_loss
    from hscl_zoo.graphs.svm import check_folds
    from hscl_zoo.losses.methods import get_method, hyperparameter_values

    _check_output_dir(args.output_dir)
    loss_kwargs = {key: getattr(args, key) for key in LOSS_OPTIONS if getattr(args, key) is not None}
    build_graph_loss(args.method, **loss_kwargs)
    spec = get_method(args.method)
    graphs = load_graph_dataset(args.dataset, args.data_dir)
    check_folds(graphs.labels.numpy(), args.folds)
    return _train_and_write(args, graphs, spec.name, hyperparameter_values(spec, loss_kwargs), loss_kwargs)


def _train_and_write(args: argparse.Namespace, graphs: GraphSet, method: str, hyperparameters: dict[str, Any],
                     loss_kwargs: dict[str, Any]) -> dict[str, Any]:
    from tqdm.auto import tqdm

    from hscl_zoo.graphs.heads import fit_linear_head
    from hscl_zoo.graphs.saving import save_graph_encoder
    from hscl_zoo.graphs.training import train_graph_encoder

    budget = {"epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size, "hidden": args.hidden,
              "layers": args.layers}
    args.output_dir.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=args.epochs, desc=f"{method} on {graphs.name}", unit="epoch", disable=args.no_progress)
    losses: list[float] = []
    start = time.perf_counter()
    with (args.output_dir / "metrics.jsonl").open("w", encoding="utf-8") as metrics:
        def on_epoch(epoch: int, loss: float) -> None:
            losses.append(loss)
            metrics.write(json.dumps({"epoch": epoch, "loss": loss}) + "\n")
            metrics.flush()
            bar.set_postfix(loss=f"{loss:.4f}")
            bar.update()

        try:
            encoder = train_graph_encoder(graphs, method, args.seed, loss_kwargs=loss_kwargs, on_epoch=on_epoch,
                                          **budget)
        finally:
            bar.close()
    trained = time.perf_counter()
    linear_head = fit_linear_head(encoder, graphs, seed=args.seed, folds=args.folds)
    svm = svm_summary(encoder.embed(graphs).double().numpy(), graphs.labels.numpy(), args.seed, args.folds)
    hub = save_graph_encoder(encoder, args.output_dir / "hub")
    result = {"dataset": args.dataset, "graphs": graphs.num_graphs, "classes": list(graphs.class_names),
              "method": method, "hyperparameters": hyperparameters,
              "temperature": loss_kwargs.get("temperature", 0.5), "seed": args.seed, "budget": budget,
              "protocol": "a", "final_loss": losses[-1], "svm": svm, "linear_head": linear_head,
              "seconds": {"train": round(trained - start, 2), "evaluate": round(time.perf_counter() - trained, 2)}}
    (args.output_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"{graphs.name}: SVM accuracy {100 * svm['accuracy_mean']:.2f} +- {100 * svm['accuracy_std']:.2f}% "
          f"({args.folds} folds), linear head {100 * linear_head['cv_accuracy']:.2f}% cross-validated; "
          f"wrote {hub} and {args.output_dir / 'eval.json'}")
    return result


def graph_model_folder(model: str) -> Path | None:
    """The folder of a saved graph encoder (config.json with model_type "graph-gin"), else None."""
    folder = Path(model.removeprefix("local-dir:")).expanduser()
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or "model_type" not in config:
        return None
    from hscl_zoo.graphs.encoder import MODEL_TYPE

    return folder if config["model_type"] == MODEL_TYPE else None


def is_graph_command(model: str, dataset: str | None) -> bool:
    """Whether ``eval``/``embed`` of `model` on `dataset` is a graph command: a ``tu:`` dataset, a
    graph-encoder folder or a graph zoo name (``hscl-beta-mutag``)."""
    if (isinstance(dataset, str) and dataset.startswith("tu:")) or graph_model_folder(model) is not None:
        return True
    from hscl_zoo.zoo import registry

    return registry.is_model(model) and registry.info(model).modality == "graph"


def _load_encoder(model: str) -> GraphEncoder:
    from hscl_zoo.graphs.encoder import GraphEncoder
    from hscl_zoo.graphs.saving import load_graph_encoder

    folder = graph_model_folder(model)
    if folder is not None:
        return load_graph_encoder(folder)
    if Path(model).expanduser().is_dir():
        raise ValueError(f"{model} is not a graph encoder folder (its config.json has no model_type 'graph-gin'); "
                         "tu: datasets need a graph encoder, such as the hub/ folder of hscl-zoo train --dataset tu:NAME.")
    from hscl_zoo.zoo.hub import load

    encoder = load(model, device="cpu")
    if not isinstance(encoder, GraphEncoder):
        raise ValueError(f"{model} is an image encoder; tu: datasets need a graph encoder.")
    return encoder


def _trained_on(encoder: GraphEncoder) -> str | None:
    """``tu:NAME`` of the table dataset the encoder was trained on, else None."""
    from hscl_zoo.graphs.catalog import GRAPH_DATASETS

    trained_on = str(encoder.metadata.get("dataset", ""))
    if trained_on and any(trained_on.lower() in (s.name, s.tu_name.lower()) for s in GRAPH_DATASETS.values()):
        return f"tu:{trained_on}"
    return None


def _dataset_for(encoder: GraphEncoder, dataset: str | None) -> str:
    if dataset is None:
        if (trained_on := _trained_on(encoder)) is not None:
            return trained_on
        raise ValueError("this graph encoder was not trained on a table dataset; pass --dataset tu:NAME or "
                         "tu:/path/NAME.")
    if not dataset.startswith("tu:"):
        raise ValueError(f"a graph encoder reads graphs, not {dataset!r}; pass --dataset tu:NAME or tu:/path/NAME.")
    return dataset


def evaluate_graph_encoder(encoder: GraphEncoder, graphs: GraphSet, seed: int = 0, folds: int = 10) -> dict[str, Any]:
    """The SVM's and a fresh linear head's cross-validated accuracy on `graphs`, and the accuracy of
    the encoder's own head when it has one for the same classes (None otherwise)."""
    from hscl_zoo.graphs.heads import fit_linear_head
    from hscl_zoo.graphs.svm import check_folds

    labels = graphs.labels.numpy()
    check_folds(labels, folds)
    svm = svm_summary(encoder.embed(graphs).double().numpy(), labels, seed, folds)
    linear = fit_linear_head(copy.deepcopy(encoder), graphs, seed=seed, folds=folds)
    head_accuracy = None
    if encoder.head is not None and tuple(encoder.class_names) == tuple(graphs.class_names):
        head_accuracy = float((encoder.predict(graphs).argmax(1).numpy() == labels).mean())
    return {"graphs": graphs.num_graphs, "classes": list(graphs.class_names), "seed": seed, "svm": svm,
            "linear_cv": {k: linear[k] for k in ("cv_accuracy", "cv_std", "folds")}, "head_accuracy": head_accuracy}


def eval_command(args: argparse.Namespace) -> dict[str, Any]:
    """``hscl-zoo eval MODEL --dataset tu:...``: print one line, write ``--out``; returns the result."""
    from hscl_zoo.graphs.catalog import load_graph_dataset

    given = [f"--{key}" for key in IMAGE_ONLY_EVAL_OPTIONS if getattr(args, key, None) is not None]
    if given:
        raise ValueError(f"{', '.join(given)} apply to image encoders; a graph encoder is evaluated by the SVM and "
                         "a linear head (--seed, --folds).")
    if args.out is not None and args.out.suffix.lower() != ".json":
        raise ValueError(f"--out {args.out}: the results are JSON; name a .json file.")
    encoder = _load_encoder(args.model)
    dataset = _dataset_for(encoder, args.dataset)
    graphs = load_graph_dataset(dataset, args.data_dir)
    result = {"model": args.model, "dataset": dataset,
              **evaluate_graph_encoder(encoder, graphs, 0 if args.seed is None else args.seed, args.folds or 10)}
    head = result["head_accuracy"]
    print(f"{graphs.name}: SVM accuracy {100 * result['svm']['accuracy_mean']:.2f} +- "
          f"{100 * result['svm']['accuracy_std']:.2f}%, linear head {100 * result['linear_cv']['cv_accuracy']:.2f}% "
          "cross-validated" + ("" if head is None else f", the model's own head {100 * head:.2f}%"))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")
    return result


def embed_command(args: argparse.Namespace) -> list[Path]:
    """``hscl-zoo embed MODEL tu:... --out FILE``: one row per graph (index, label, embedding)."""
    from hscl_zoo.embedding import Embeddings, check_output_path, save_embeddings
    from hscl_zoo.graphs.catalog import load_graph_dataset

    check_output_path(args.out)
    if args.projection:
        raise ValueError("--projection applies to image encoders; a graph encoder's embedding is its GIN readout.")
    encoder = _load_encoder(args.model)
    if not args.images.startswith("tu:"):
        trained_on = _trained_on(encoder)
        fix = (f": {shlex.join(['hscl-zoo', 'embed', args.model, trained_on, '--out', str(args.out)])}"
               if trained_on else " (tu:NAME or tu:/path/NAME)")
        raise ValueError(f"a graph encoder reads graphs, not {args.images!r}; give a tu: dataset as IMAGES{fix}")
    graphs = load_graph_dataset(args.images, args.data_dir)
    features = encoder.embed(graphs, batch_size=args.batch_size).numpy()
    written = save_embeddings(Embeddings(features, list(range(graphs.num_graphs)), "index",
                                         graphs.labels.numpy()), args.out)
    print(f"embedded {graphs.num_graphs} graphs to {features.shape[1]}-d embeddings: "
          + ", ".join(str(p) for p in written))
    return written
