"""Measure the paper's claims: the five methods x N seeds at a named budget, probed and summarised.

    python recipes/reproduce.py --budget cpu-cifar10-10k --data_dir ../shared/data/cifar10
    python recipes/reproduce.py --budget cpu-tinyimagenet-20k --data_dir ../shared/data/tinyimagenet --seeds 0
    python recipes/reproduce.py --budget cpu-cifar10-10k --summary-only --readme docs/results.md README.md  # from the run files
    python recipes/reproduce.py --budget gpu-cifar10 --data_dir ../shared/data/cifar10 --seeds 0

Each run is `recipes/pretrain.py` in its own process under `<out>/runs/<method>-s<seed>/`; a
finished run is skipped and an interrupted one resumed, so re-running the command only does
what is missing. Per run a JSON (`<out>/runs/<method>-s<seed>.json`), then from those files
alone: `<out>/summary.md` (tables, verdicts on the paper's claims), `<out>/summary.csv` and the
figures in `<out>/figures/`. Budgets are defined in `hscl_zoo/reproduction/budgets.py`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hscl_zoo.losses import LOSS_NAMES, METHODS
from hscl_zoo.reproduction.budgets import BUDGETS, RUN_ORDER, Budget, run_settings
from hscl_zoo.reproduction.figures import plot_histories
from hscl_zoo.reproduction.claims_table import page_table
from hscl_zoo.reproduction.report import read_records, render_markdown, update_page, write_csv
from hscl_zoo.reproduction.runs import run_or_reuse
from hscl_zoo.reproduction.summary import by_method, display

PRETRAIN = Path(__file__).resolve().parent / "pretrain.py"


def run_one(out: Path, budget: Budget, method: str, seed: int, data_dir: str | None,
            compile: bool = False) -> dict[str, Any]:
    """Train and probe one (method, seed), or reuse a finished run; return its result record.
    `compile`: torch.compile the model and the augmentation (a speed switch; the budget's settings
    are unchanged)."""
    runs = out / "runs"
    settings = lambda: {**run_settings(budget, runs, method, seed, data_dir), **({"compile": True} if compile else {})}  # noqa: E731
    return run_or_reuse(runs, f"{method}-s{seed}", settings,
                        pretrain=[sys.executable, str(PRETRAIN)], fields={"method": method, "seed": seed})


def summarise(out: Path, budget: Budget) -> str:
    """Rewrite summary.md, summary.csv and the figures of `out` from its runs/*.json; return summary.md."""
    records = read_records(out / "runs")
    if not records:
        raise SystemExit(f"error: {out / 'runs'} holds no finished run (*.json) to summarise yet.")
    dataset = budget.settings["dataset"]
    paper = {m: spec.paper_top1[dataset][0] for m, spec in METHODS.items() if dataset in spec.paper_top1}
    text = render_markdown(budget.name, budget.description, budget.settings, records, paper)
    (out / "summary.md").write_text(text)
    write_csv(out / "summary.csv", records)
    first_seed = {m: rs[0] for m, rs in by_method(records).items()}
    plot_histories([(f"{display(m)} (seed {r['seed']})", r["history"]) for m, r in first_seed.items()], out / "figures")
    return text


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description="Run the paper's five methods over seeds at a budget and summarise.")
    parser.add_argument("--budget", required=True, choices=sorted(BUDGETS))
    parser.add_argument("--data_dir", help="local parquet folder (e.g. ../shared/data/cifar10); default: the Hub")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(LOSS_NAMES), choices=LOSS_NAMES)
    parser.add_argument("--out", type=Path, help="results folder (default: results/<budget>)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the model and the augmentation (speed only: the budget's settings stay)")
    parser.add_argument("--summary-only", action="store_true",
                        help="train nothing: rewrite the summary and figures from the finished runs/*.json")
    parser.add_argument("--readme", type=Path, nargs="+", default=[],
                        help="also rewrite these pages' blocks: <!-- results:BUDGET --> (docs/results.md) with the "
                             "summary's table and verdicts, <!-- results:claims --> (README.md, docs/results.md) with "
                             "the claims x budgets table of every budget beside --out")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    out = args.out or Path("results") / args.budget
    (out / "runs").mkdir(parents=True, exist_ok=True)
    budget = BUDGETS[args.budget]
    if not args.summary_only:
        for seed in args.seeds:
            for method in (m for m in RUN_ORDER if m in args.methods):
                run_one(out, budget, method, seed, args.data_dir, compile=args.compile)
    text = summarise(out, budget)
    for page in args.readme:
        update_page(page, budget.name, text, lambda quoted: page_table(out.resolve().parent, quoted))
    print(text)
    return text


if __name__ == "__main__":
    main()
