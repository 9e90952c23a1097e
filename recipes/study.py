"""Answer one question with variants of a method at a reproduction budget, then judge its claims.

    python recipes/study.py --study partial-labels-cifar10-10k --data_dir ../shared/data/cifar10 --seeds 0
    python recipes/study.py --study negatives-cifar10-10k --data_dir ../shared/data/cifar10 --seeds 0
    python recipes/study.py --study negatives-cifar10-10k --summary-only --readme docs/results.md  # from the run files

Studies are declared in `hscl_zoo/reproduction/studies.py`. Each variant trained here is a
`recipes/pretrain.py` run under `<out>/runs/<variant>-s<seed>/` (default out:
`results/studies/<study>`), finished runs skipped and interrupted ones resumed; a variant that
is the budget's own run of a method is read from (or, if missing, trained into) the budget's
results folder, exactly as `recipes/reproduce.py` would, and probed again when the variant says
how (its record then names the run it probed). Then `<out>/summary.md` is rendered from the run
files alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from hscl_zoo.evaluation import evaluate_model
from hscl_zoo.reproduction.budgets import BUDGETS, run_settings
from hscl_zoo.reproduction.report import update_readme
from hscl_zoo.reproduction.runs import run_or_reuse
from hscl_zoo.reproduction.studies import STUDIES, Study, Variant
from hscl_zoo.reproduction.study_report import render_study

PRETRAIN = Path(__file__).resolve().parent / "pretrain.py"


def run_variant(study: Study, variant: Variant, seed: int, out: Path, budget_out: Path, data_dir: str | None) -> None:
    """Train and probe one (variant, seed), or leave a finished run as it is."""
    budget = BUDGETS[study.budget]
    pretrain = [sys.executable, str(PRETRAIN)]
    if variant.budget_method is not None:
        runs, method = budget_out / "runs", variant.budget_method
        record = run_or_reuse(runs, f"{method}-s{seed}", lambda: run_settings(budget, runs, method, seed, data_dir),
                              pretrain=pretrain, fields={"method": method, "seed": seed})
        if variant.probe:
            probe_again(study, variant, seed, record, runs / f"{method}-s{seed}" / "hub", out / "runs", data_dir)
        return

    def settings() -> dict[str, Any]:
        keys = {**budget.settings, **variant.settings, "seed": seed}
        return keys if data_dir is None else {**keys, "data_dir": data_dir}

    run_or_reuse(out / "runs", f"{variant.name}-s{seed}", settings, pretrain=pretrain,
                 fields={"study": study.name, "variant": variant.name, "method": variant.settings["method"],
                         "seed": seed})


def probe_again(study: Study, variant: Variant, seed: int, trained: dict[str, Any], hub: Path, runs: Path,
                data_dir: str | None) -> None:
    """Write the record of a variant that probes the budget's run `trained` (its encoder in `hub`)
    with the variant's probe settings: the training side (history, config, hardware, commit) is
    the budget run's, the scores and protocol the new probe's."""
    path = runs / f"{variant.name}-s{seed}.json"
    if path.is_file():
        return
    if not hub.is_dir():
        raise SystemExit(f"error: {hub} (the budget run's exported encoder) is missing; variant {variant.name} "
                         "probes it again. Re-run that budget run, or restore its folder.")
    print(f"[{variant.name}-s{seed}] probing {hub} with {variant.probe}", flush=True)
    started = time.perf_counter()
    result = evaluate_model(f"local-dir:{hub}", data_dir=data_dir, seed=seed, **variant.probe)
    record = {**trained, "study": study.name, "variant": variant.name, "top1": result["top1"], "top5": result["top5"],
              "knn_top1": result["knn_top1"], "probe_protocol": result["protocol"], "probe": variant.probe,
              "probe_of": f"results/{study.budget}/runs/{variant.budget_method}-s{seed}.json",
              "probe_seconds": time.perf_counter() - started}
    path.write_text(json.dumps(record, indent=2) + "\n")


def summarise(study: Study, out: Path, budget_out: Path) -> str:
    """Rewrite `<out>/summary.md` from the run files; return it."""
    runs = {}
    for v in study.variants:
        folder, stem = (budget_out / "runs", v.budget_method) if v.record_in_budget else (out / "runs", v.name)
        paths = sorted(folder.glob(f"{stem}-s*.json"), key=lambda p: int(p.stem.rsplit("-s", 1)[1]))
        runs[v.name] = [json.loads(p.read_text()) for p in paths]
    text = render_study(study, runs)
    (out / "summary.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description="Run a study's variants over seeds at its budget and judge its claims.")
    parser.add_argument("--study", required=True, choices=sorted(STUDIES))
    parser.add_argument("--data_dir", help="local parquet folder (e.g. ../shared/data/cifar10); default: the Hub")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--variants", nargs="+", help="only these variants (default: all, in the study's order)")
    parser.add_argument("--out", type=Path, help="results folder (default: results/studies/<study>)")
    parser.add_argument("--budget-out", type=Path, help="the budget's results folder (default: results/<budget>)")
    parser.add_argument("--summary-only", action="store_true", help="train nothing: rewrite summary.md from the run files")
    parser.add_argument("--readme", type=Path,
                        help="also rewrite this page's (docs/results.md) <!-- results:STUDY --> block with the table and verdicts")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    study = STUDIES[args.study]
    names = [v.name for v in study.variants]
    if args.variants and (unknown := sorted(set(args.variants) - set(names))):
        raise SystemExit(f"error: study {study.name} has no variant {', '.join(unknown)}; its variants: {', '.join(names)}")
    out = args.out or Path("results") / "studies" / study.name
    budget_out = args.budget_out or Path("results") / study.budget
    (out / "runs").mkdir(parents=True, exist_ok=True)
    if not args.summary_only:
        for seed in args.seeds:
            for variant in study.variants:
                if not args.variants or variant.name in args.variants:
                    run_variant(study, variant, seed, out, budget_out, args.data_dir)
    text = summarise(study, out, budget_out)
    if args.readme is not None:
        update_readme(args.readme, study.name, text)
    print(text)
    return text


if __name__ == "__main__":
    main()
