"""Figures of the paper from runs' metrics.jsonl: Fig. 1 (accuracy vs epoch), Fig. 4 (Assumption 1),
Fig. 5 (the four Lemma-1 losses) and, for H-SCL(tau) runs, what the threshold kept.

    python recipes/plot.py runs/c10-* --out results/figures
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hscl_zoo.reproduction.figures import plot_run_dirs


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="output_dirs of recipes/pretrain.py")
    parser.add_argument("--out", type=Path, default=Path("results/figures"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        paths = plot_run_dirs(args.runs, args.out)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from error
    print("wrote " + ", ".join(str(p) for p in paths))
    return paths


if __name__ == "__main__":
    main()
