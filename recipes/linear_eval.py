"""Linear-probe and kNN evaluation of a frozen encoder.

    python recipes/linear_eval.py --model runs/default/hub
    python recipes/linear_eval.py --model hscl-beta-cifar10 --data_dir ../shared/data/cifar10

The dataset defaults to the one the model was trained on (its config.json). Features are
extracted once with the model's eval transform; the protocol (hscl_zoo.evaluation.linear_probe)
is written into the output JSON beside top-1 / top-5 and kNN top-1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import hscl_zoo
from hscl_zoo.data import load_splits
from hscl_zoo.evaluation import evaluate_encoder


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="registry name, hf-hub:owner/repo, local-dir:/path or a folder")
    parser.add_argument("--dataset", help="dataset name (default: the one in the model's training summary)")
    parser.add_argument("--data_dir", help="local parquet folder (default: the training run's, else the Hub)")
    parser.add_argument("--subset", type=int, help="class-balanced number of training images")
    parser.add_argument("--probe_epochs", type=int, default=100)
    parser.add_argument("--knn_k", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="JSON file for the results (default: print only)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = hscl_zoo.load(args.model, device=device)
    training = model.training_summary or {}
    recipe = training.get("recipe_config", {})
    dataset = args.dataset or training.get("dataset")
    if dataset is None:
        parser.error("the model's config names no training dataset: pass --dataset.")
    data_dir = args.data_dir if args.data_dir is not None else recipe.get("data_dir")
    subset = args.subset if args.subset is not None else recipe.get("subset")
    data = load_splits(dataset, data_dir, subset=subset, seed=args.seed)
    if len(data.class_names) != model.num_classes:
        parser.error(f"{dataset} has {len(data.class_names)} classes but the model's head has {model.num_classes}.")
    result = evaluate_encoder(model, data, epochs=args.probe_epochs, knn_k=args.knn_k, seed=args.seed, device=device)
    result.pop("head")
    result.update(model=str(args.model), dataset=dataset, data_dir=data_dir)
    print(f"linear-probe top-1 {result['top1']:.2f}% top-5 {result['top5']:.2f}%, kNN top-1 {result['knn_top1']:.2f}%")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
