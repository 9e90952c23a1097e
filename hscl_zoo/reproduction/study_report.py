"""summary.md of a study, rendered from its run records only: a row per variant, a verdict per claim."""

from __future__ import annotations

import io
import statistics
from typing import Any

from hscl_zoo.reproduction.report import RESULTS_BEGIN, RESULTS_END, code_line
from hscl_zoo.reproduction.statistics import PairedDifference, mean_std, paired_difference
from hscl_zoo.reproduction.studies import Comparison, Study, Variant
from hscl_zoo.reproduction.summary import Verdict

Record = dict[str, Any]


def judge(comparison: Comparison, runs: dict[str, list[Record]]) -> Verdict:
    """The verdict on one claim from the variants' records (paired by seed): "holds", "does not
    hold", "undecided" (the 95 % interval straddles the line), "not measured yet"; with one seed
    the verdict says so."""
    a, b = runs.get(comparison.a, []), runs.get(comparison.b, [])
    diff = paired_difference({r["seed"]: r["top1"] for r in a}, {r["seed"]: r["top1"] for r in b})
    if diff is None:
        missing = [name for name, rs in ((comparison.a, a), (comparison.b, b)) if not rs]
        why = f"no finished run of {', '.join(missing)}" if missing else "no seed run by both"
        return Verdict(comparison.claim, "not measured yet", f"{why}.")
    evidence = (f"{comparison.a} minus {comparison.b}, linear top-1: {diff.describe()}; "
                + "; ".join(f"seed {s}: {_top1(a, s):.2f} vs {_top1(b, s):.2f}" for s in diff.seeds) + ".")
    verdict = _beats(diff) if comparison.kind == "beats" else _matches(diff, comparison.margin)
    return Verdict(comparison.claim, verdict + (" (1 seed)" if diff.n == 1 else ""), evidence)


def _top1(records: list[Record], seed: int) -> float:
    return next(r["top1"] for r in records if r["seed"] == seed)


def _beats(diff: PairedDifference) -> str:
    if diff.low is None:
        return "holds" if diff.mean > 0 else "does not hold"
    if diff.low > 0:
        return "holds"
    return "does not hold" if diff.high < 0 else "undecided"


def _matches(diff: PairedDifference, margin: float) -> str:
    if diff.low is None:
        return "holds" if abs(diff.mean) <= margin else "does not hold"
    if -margin <= diff.low and diff.high <= margin:
        return "holds"
    return "does not hold" if diff.low > margin or diff.high < -margin else "undecided"


def render_study(study: Study, runs: dict[str, list[Record]]) -> str:
    """The whole summary.md; `runs` maps a variant's name to its records."""
    text = io.StringIO()
    text.write(f"# Study: `{study.name}`\n\n{study.question}\n\n")
    text.write(f"Budget `{study.budget}` (data, backbone, epochs, probe; `hscl_zoo/reproduction/budgets.py`). ")
    records = [r for rs in runs.values() for r in rs]
    hardware = sorted({r["hardware"] for r in records})
    text.write(f"Hardware: {'; '.join(hardware) or '-'}. Runs: {len(records)}. {code_line(records)}\n\n")
    text.write(RESULTS_BEGIN + "\n")
    text.write("| variant | what it trains | seeds | linear top-1 (%) | top-5 (%) | kNN top-1 (%) | "
               "negatives' median cos, first -> last epoch | train min/run (median) | run files |\n"
               "|---|---|---:|---|---|---|---|---:|---|\n")
    for v in study.variants:
        rs = runs.get(v.name, [])
        if not rs:
            text.write(f"| {v.name} | {v.description} | 0 | not run yet | - | - | - | - | {_run_files(study, v)} |\n")
            continue
        cells = [_mean_sd([r[k] for r in rs]) for k in ("top1", "top5", "knn_top1")]
        minutes = statistics.median(r["train_seconds"] for r in rs) / 60
        text.write(f"| {v.name} | {v.description} | {len(rs)} | {' | '.join(cells)} | {_spread(rs)} | {minutes:.1f} | "
                   f"{_run_files(study, v)} |\n")
    text.write("\n")
    for c in study.comparisons:
        v = judge(c, runs)
        text.write(f"* **{v.claim}: {v.verdict}.** {v.evidence}\n")
    text.write(RESULTS_END + "\n")
    text.write(
        "\n## How to read it\n\nMeans ± sample standard deviations over seeds. A seed fixes the initialisation, "
        "the batch order and the augmentations, so differences are paired by seed: mean of the per-seed "
        "differences, with a two-sided 95 % Student-t interval from two seeds on. A claim \"holds\" when the "
        "interval lies on its side (with one seed: when the single difference does, which decides nothing "
        "against seed noise of a point or two), \"undecided\" when the interval straddles the line. \"Negatives' "
        "median cos\" is the median cosine between a training anchor and its negatives in the batch, from the "
        "per-epoch diagnostics (mean over seeds): it falls as training spreads the classes apart, and a value near 1 "
        "means the embeddings crowd onto one direction. Every number here is recomputed from the run files by "
        "`recipes/study.py`.\n")
    return text.getvalue()


def _run_files(study: Study, variant: Variant) -> str:
    if variant.record_in_budget:
        return f"`results/{study.budget}/runs/{variant.budget_method}-s*.json`"
    return f"`runs/{variant.name}-s*.json`"


def _spread(records: list[Record]) -> str:
    """The median cosine between anchors and their negatives at the first and the last epoch, mean
    over seeds: near 1 the embeddings have collapsed onto one direction ('-' without diagnostics)."""
    if any("neg_cos_q50" not in r["history"][0] or "neg_cos_q50" not in r["history"][-1] for r in records):
        return "-"
    first = statistics.fmean(r["history"][0]["neg_cos_q50"] for r in records)
    last = statistics.fmean(r["history"][-1]["neg_cos_q50"] for r in records)
    return f"{first:.3f} -> {last:.3f}"


def _mean_sd(values: list[float]) -> str:
    mean, sd = mean_std(values)
    return f"{mean:.2f} ± {sd:.2f}"
