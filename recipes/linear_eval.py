"""Linear-probe and kNN evaluation of a frozen encoder.

    python recipes/linear_eval.py --model runs/default/hub
    python recipes/linear_eval.py --model hscl-beta-cifar10 --data_dir ../shared/data/cifar10

The dataset, data_dir, subset, seed, probe epochs and kNN k default to those of the run that
trained the model (the recipe config in its config.json), so evaluating a run's hub folder repeats
the run's own evaluation. Features are extracted once with the model's eval transform; the
protocol (hscl_zoo.evaluation.linear_probe) is written into the output JSON beside top-1 / top-5
and kNN top-1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import hscl_zoo
from hscl_zoo.data.datasets import load_splits
from hscl_zoo.evaluation import evaluate_encoder

# used when neither the command line nor the model's recipe config sets them
DEFAULTS = {"probe_epochs": 100, "knn_k": 20, "seed": 0}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="registry name, hf-hub:owner/repo, local-dir:/path or a folder")
    parser.add_argument("--dataset", help="dataset name (default: the one in the model's training summary)")
    parser.add_argument("--data_dir", help="local parquet folder (default: the training run's, else the Hub)")
    parser.add_argument("--subset", type=int, help="class-balanced number of training images")
    parser.add_argument("--probe_epochs", type=int, help=f"default: the run's, else {DEFAULTS['probe_epochs']}")
    parser.add_argument("--knn_k", type=int, help=f"default: the run's, else {DEFAULTS['knn_k']}")
    parser.add_argument("--seed", type=int, help=f"subset draw and probe seed (default: the run's, else {DEFAULTS['seed']})")
    parser.add_argument("--out", help="JSON file for the results (default: print only)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        model = hscl_zoo.load(args.model, device=device)
    except (ValueError, OSError) as error:
        parser.error(f"cannot load --model {args.model}: {error}")
    training = model.training_summary or {}
    recipe = training.get("recipe_config") or {}
    dataset = args.dataset or training.get("dataset")
    if dataset is None:
        parser.error("the model's config names no training dataset: pass --dataset.")
    # the run's data_dir and subset apply to the run's own dataset only
    same_data = recipe if dataset == training.get("dataset") else {}
    data_dir = args.data_dir
    if data_dir is None and same_data.get("data_dir") is not None:
        data_dir = same_data["data_dir"]
        if not Path(data_dir).is_dir():
            print(f"note: the run's data_dir {data_dir} is not here; reading {dataset} from the Hub "
                  "(pass --data_dir to use a local copy).", file=sys.stderr)
            data_dir = None
    settings = {key: getattr(args, key) if getattr(args, key) is not None else recipe.get(key, default)
                for key, default in DEFAULTS.items()}
    subset = args.subset if args.subset is not None else same_data.get("subset")
    try:
        data = load_splits(dataset, data_dir, subset=subset, seed=settings["seed"])
    except ValueError as error:
        parser.error(str(error))
    if len(data.class_names) != model.num_classes:
        parser.error(f"{dataset} has {len(data.class_names)} classes but the model's head has {model.num_classes}.")
    result = evaluate_encoder(model, data, epochs=settings["probe_epochs"], knn_k=settings["knn_k"],
                              seed=settings["seed"], device=device)
    result.pop("head")
    result.update(model=str(args.model), dataset=dataset, data_dir=data_dir, subset=subset)
    print(f"linear-probe top-1 {result['top1']:.2f}% top-5 {result['top5']:.2f}%, kNN top-1 {result['knn_top1']:.2f}%")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
