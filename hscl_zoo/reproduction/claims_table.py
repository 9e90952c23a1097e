"""The claims x budgets table: the paper's claims as rows, the budgets with finished runs as
columns, each cell the rule's verdict and the figure that decides it (or why the claim is not
testable there). README.md and docs/results.md quote it between `<!-- results:claims -->` markers;
it is built from the run files only, by the rules of `hscl_zoo.reproduction.summary`."""

from __future__ import annotations

import os
from pathlib import Path

from hscl_zoo.reproduction.budgets import BUDGETS
from hscl_zoo.reproduction.report import read_records
from hscl_zoo.reproduction.summary import Verdict, verdicts

BLOCK = "claims"
NOT_TESTABLE = "not testable at this budget"


def cell(verdict: Verdict) -> str:
    """One cell: '**reproduced**: +1.20 [+0.40, +2.00], 3 seeds', or 'not testable: <why>', the why
    being the last sentence of the verdict's evidence."""
    if verdict.verdict == NOT_TESTABLE:
        text = f"not testable: {verdict.evidence.rstrip('.').split('. ')[-1]}"
    else:
        text = f"**{verdict.verdict}**" + (f": {verdict.measure}" if verdict.measure else "")
    return text.replace("|", "\\|")


def claims_table(columns: dict[str, list[Verdict]], summary_link: str) -> str:
    """The Markdown table of `columns` (budget name -> its verdicts, in `verdicts` order), budgets in
    the order given, each header linking to `summary_link.format(budget=NAME)` (the per-budget
    detail). Every budget must judge the same claims in the same order; a ValueError says which not."""
    if not columns:
        raise ValueError("no budget has finished runs: nothing to tabulate (run recipes/reproduce.py first).")
    names = list(columns)
    claims = [v.claim for v in columns[names[0]]]
    for name in names[1:]:
        if [v.claim for v in columns[name]] != claims:
            raise ValueError(f"budget {name} judges other claims than {names[0]}: one table needs the same rules for all.")
    header = "| claim | " + " | ".join(f"[`{n}`]({summary_link.format(budget=n)})" for n in names) + " |"
    lines = [header, "|---|" + "---|" * len(names)]
    for row, claim in enumerate(claims):
        lines.append(f"| {claim} | " + " | ".join(cell(columns[n][row]) for n in names) + " |")
    return "\n".join(lines) + "\n"


def budget_columns(results: Path) -> dict[str, list[Verdict]]:
    """Each registered budget with run files under `results/<budget>/runs`, in the budget table's
    order, and the verdicts its runs give."""
    columns = {}
    for name in BUDGETS:
        records = read_records(results / name / "runs")
        if records:
            columns[name] = verdicts(records)
    return columns


def page_table(results: Path, page: Path) -> str:
    """The table the budgets under `results` give, its headers linking from `page` to each budget's
    summary.md (what `page`'s `<!-- results:claims -->` block quotes)."""
    link = (Path(os.path.relpath(results, page.resolve().parent)) / "{budget}" / "summary.md").as_posix()
    return claims_table(budget_columns(results), link)
