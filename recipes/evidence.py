"""Evidence on a budget's trained encoders: retrieval, transfer, fine-tuning against training from scratch.

    python recipes/evidence.py --budget cpu-cifar100-10k --seed 0 --transfer cifar10 --finetune_epochs 3 \
        --data_root ../shared/data
    python recipes/evidence.py --budget cpu-cifar10-10k --transfer cifar100,tinyimagenet --data_root ../shared/data
    python recipes/evidence.py --budget cpu-cifar100-10k --summary-only --readme docs/results.md  # from the files

For each method whose run `<runs>/<method>-s<seed>/` has its Hub folder's weights, one JSON
`<out>/evidence/<method>-s<seed>.json`; re-running measures only what is missing. Then, from those
files alone, `<out>/evidence/summary.md`. The logic is `hscl_zoo.reproduction.evidence`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hscl_zoo.losses import LOSS_NAMES
from hscl_zoo.reproduction.budgets import BUDGETS, RUN_ORDER
from hscl_zoo.reproduction.evidence import EvidenceSettings, gather, summarise
from hscl_zoo.reproduction.report import update_readme


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description="Retrieval, transfer and fine-tuning evidence on a budget's encoders.")
    parser.add_argument("--budget", required=True, choices=sorted(BUDGETS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", nargs="+", default=list(LOSS_NAMES), choices=LOSS_NAMES)
    parser.add_argument("--transfer", default="", help="comma-separated targets: registered datasets or own data "
                        "(imagefolder:PATH, ...)")
    parser.add_argument("--finetune_epochs", type=int, default=0, help="fine-tune each encoder and a from-scratch "
                        "copy this many epochs (0: no fine-tuning)")
    parser.add_argument("--finetune_batch_size", type=int, help="default: the fine-tuning recipe's")
    parser.add_argument("--data_root", type=Path, help="folder holding each registered dataset as <data_root>/<name> "
                        "(e.g. ../shared/data); default: the run's data folder for its own dataset, the Hub for others")
    parser.add_argument("--out", type=Path, help="results folder (default: results/<budget>)")
    parser.add_argument("--runs", type=Path, help="folder of the trained runs (default: <out>/runs)")
    parser.add_argument("--summary-only", action="store_true",
                        help="measure nothing: rewrite evidence/summary.md from the evidence/*.json files")
    parser.add_argument("--readme", type=Path,
                        help="also rewrite this page's <!-- results:evidence-BUDGET --> block with the summary's table")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.finetune_epochs < 0:
        parser.error(f"--finetune_epochs {args.finetune_epochs} must be >= 0 (0: no fine-tuning).")
    out = args.out or Path("results") / args.budget
    runs, evidence_dir = args.runs or out / "runs", out / "evidence"
    settings = EvidenceSettings(transfer=tuple(t.strip() for t in args.transfer.split(",") if t.strip()),
                                finetune_epochs=args.finetune_epochs, finetune_batch_size=args.finetune_batch_size,
                                data_root=args.data_root)
    try:
        if not args.summary_only:
            gather(runs, evidence_dir, args.budget, [m for m in RUN_ORDER if m in args.methods], args.seed, settings)
        text = summarise(evidence_dir, args.budget)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from error
    if args.readme is not None:
        update_readme(args.readme, f"evidence-{args.budget}", text)
    print(text)
    return text


if __name__ == "__main__":
    main()
