"""Linear-probe and kNN evaluation of a frozen encoder.

    python recipes/linear_eval.py --model runs/default/hub
    python recipes/linear_eval.py --model hscl-beta-cifar10 --data_dir ../shared/data/cifar10

The dataset, data_dir, subset, seed, probe epochs and kNN k default to those of the run that
trained the model (the recipe config in its config.json), so evaluating a run's hub folder repeats
the run's own evaluation (see hscl_zoo.evaluation.evaluate_model; `hscl-zoo eval` is the same
command). The protocol (hscl_zoo.evaluation.linear_probe) is written into the output JSON beside
top-1 / top-5 and kNN top-1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hscl_zoo.evaluation import EVAL_DEFAULTS, evaluate_model


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="registry name, hf-hub:owner/repo, local-dir:/path or a folder")
    parser.add_argument("--dataset", help="dataset name (default: the one in the model's training summary)")
    parser.add_argument("--data_dir", help="local parquet folder (default: the training run's, else the Hub)")
    parser.add_argument("--subset", type=int, help="class-balanced number of training images")
    parser.add_argument("--probe_epochs", type=int, help=f"default: the run's, else {EVAL_DEFAULTS['probe_epochs']}")
    parser.add_argument("--knn_k", type=int, help=f"default: the run's, else {EVAL_DEFAULTS['knn_k']}")
    parser.add_argument("--seed", type=int, help=f"subset draw and probe seed (default: the run's, else {EVAL_DEFAULTS['seed']})")
    parser.add_argument("--out", help="JSON file for the results (default: print only)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        result = evaluate_model(args.model, args.dataset, data_dir=args.data_dir, subset=args.subset,
                                probe_epochs=args.probe_epochs, knn_k=args.knn_k, seed=args.seed)
    except (ValueError, OSError) as error:
        parser.error(f"cannot evaluate --model {args.model}: {error}")
    print(f"linear-probe top-1 {result['top1']:.2f}% top-5 {result['top5']:.2f}%, kNN top-1 {result['knn_top1']:.2f}%")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
