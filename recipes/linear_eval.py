"""Linear-probe and kNN evaluation of a frozen encoder (the same command as `hscl-zoo eval`).

    python recipes/linear_eval.py --model runs/default/hub
    python recipes/linear_eval.py --model hscl-beta-cifar10 --data_dir ../shared/data/cifar10

The dataset, data_dir, subset, seed, probe epochs and kNN k default to those of the run that
trained the model (the recipe config in its config.json), so evaluating a run's hub folder repeats
the run's own evaluation (see hscl_zoo.evaluation.evaluate_model). The protocol
(hscl_zoo.evaluation.linear_probe) is written into the output JSON beside top-1 / top-5 and kNN
top-1.
"""

from __future__ import annotations

import argparse
import sys

from hscl_zoo.cli import add_eval_options, run_eval


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="registry name, hf-hub:owner/repo, local-dir:/path or a folder")
    add_eval_options(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run_eval(args.model, args)
    except (ValueError, OSError, LookupError) as error:
        parser.error(f"cannot evaluate --model {args.model}: {error}")


if __name__ == "__main__":
    main()
