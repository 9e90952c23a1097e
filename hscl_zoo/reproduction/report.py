"""summary.md and summary.csv of a reproduction budget, rendered from its run records only; and the
model cards' section on a method's runs at the evidence budgets (`budget_evidence`)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hscl_zoo._files import replace_block
from hscl_zoo.losses.methods import METHODS
from hscl_zoo.reproduction.budgets import BUDGETS, Budget
from hscl_zoo.reproduction.summary import (
    KEEPS_EVERYTHING,
    display,
    SAME_LOSS,
    Record,
    by_method,
    mean_curve,
    method_rows,
    verdicts,
)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _diff(row: dict[str, Any], ref: str) -> str:
    mean, ci = row[f"top1_minus_{ref}"], row[f"top1_minus_{ref}_ci"]
    if mean is None:
        return "-"
    return f"{mean:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else " (1 seed)")


def _threshold(row: dict[str, Any]) -> str:
    if row["kept_first"] is None:
        return "-"
    text = (f"l {row['threshold_first']:+.2f} -> {row['threshold_last']:+.2f}, "
            f"keeps {_pct(row['kept_first'])} -> {_pct(row['kept_last'])}")
    return text + (" (keeps every negative: SCL under another name)" if row["keeps_every_negative"] else "")


RESULTS_BEGIN, RESULTS_END = "<!-- results -->", "<!-- /results -->"


def results_block(summary_text: str) -> str:
    """The table and the verdicts of a summary.md (what the README quotes), markers excluded."""
    start, end = summary_text.index(RESULTS_BEGIN), summary_text.index(RESULTS_END)
    return summary_text[start + len(RESULTS_BEGIN):end].strip("\n") + "\n"


def quote_in_readme(readme: str, budget: str, summary_text: str) -> str:
    """`readme` with the block between `<!-- results:BUDGET -->` and `<!-- /results:BUDGET -->`
    replaced by the summary's results block; a ValueError if the markers are missing."""
    return replace_block(readme, budget, results_block(summary_text))


def update_page(page: Path, budget: str, summary_text: str, claims: Callable[[Path], str]) -> None:
    """Rewrite whichever blocks of `page` quote `budget`'s results: `<!-- results:BUDGET -->` (the
    summary's table and verdicts, as docs/results.md holds) and `<!-- results:claims -->` (the
    claims x budgets table, `claims(page)`, as README.md and docs/results.md hold); neither present
    ends the command with the fix."""
    text = page.read_text()
    names = [n for n in (budget, "claims") if f"<!-- results:{n} -->" in text]
    if not names:
        raise SystemExit(f"error: {page}: no <!-- results:{budget} --> or <!-- results:claims --> block to quote the "
                         "results in; add a pair of markers (<!-- results:NAME --> ... <!-- /results:NAME -->).")
    try:
        if budget in names:
            text = quote_in_readme(text, budget, summary_text)
        if "claims" in names:
            text = replace_block(text, "claims", claims(page))
    except ValueError as error:
        raise SystemExit(f"error: {page}: {error}") from error
    page.write_text(text)


def code_line(records: list[Record]) -> str:
    """Which commits of the code trained the runs, e.g. 'Code: commit 1a2b3c4d5e6f (2 runs).'"""
    counts: dict[str, int] = {}
    for r in records:
        key = f"commit {r['commit'][:12]}{'+dirty' if r['commit'].endswith('+dirty') else ''}" if r.get("commit") \
            else "commit not recorded"
        counts[key] = counts.get(key, 0) + 1
    return "Code: " + "; ".join(f"{k} ({n} run{'s' if n > 1 else ''})" for k, n in sorted(counts.items())) + "."


def update_readme(readme: Path, name: str, summary_text: str) -> None:
    """Rewrite the `<!-- results:NAME -->` block of the README file `readme` (the command-line
    form of :func:`quote_in_readme`: missing markers end the command with the fix)."""
    try:
        readme.write_text(quote_in_readme(readme.read_text(), name, summary_text))
    except ValueError as error:
        raise SystemExit(f"error: {readme}: {error}") from error


def render_markdown(name: str, description: str, settings: dict[str, Any], records: list[Record],
                    paper_top1: dict[str, float]) -> str:
    """The whole summary.md of one budget."""
    rows = method_rows(records)
    text = io.StringIO()
    text.write(f"# Reproduction: budget `{name}`\n\n{description}\n\n")
    text.write("Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()) + "\n\n")
    hardware = sorted({r["hardware"] for r in records})
    counts = ", ".join(f"{display(r['method'])} {r['seeds']}" for r in rows)
    text.write(f"Hardware: {'; '.join(hardware)}. Runs: {len(records)} (seeds per method: {counts}). ")
    minutes = sum(r["train_seconds"] for r in records) / 60
    text.write(f"Training time: {minutes:.1f} min in all. {code_line(records)}\n\n")
    text.write(RESULTS_BEGIN + "\n")
    text.write("| method | seeds | linear top-1 (%) | top-5 (%) | kNN top-1 (%) | paper top-1 (%) | "
               "minus SCL, paired [95% CI] | minus UCL, paired [95% CI] | epochs to SCL's final kNN | "
               "Assumption 1 first -> last (min) | H-SCL(tau) threshold | train min/run (median) | views/s after epoch 1 |\n")
    text.write("|---|---:|---|---|---|---:|---|---|---:|---|---|---:|---:|\n")
    for r in rows:
        reach = r["epochs_to_scl_final_knn"]
        vps = r["views_per_second_after_epoch1"]
        text.write(
            f"| {display(r['method'])} | {r['seeds']} | {r['top1_mean']:.2f} ± {r['top1_std']:.2f} | "
            f"{r['top5_mean']:.2f} ± {r['top5_std']:.2f} | {r['knn_top1_mean']:.2f} ± {r['knn_top1_std']:.2f} | "
            f"{paper_top1.get(r['method'], '-')} | {_diff(r, 'scl')} | {_diff(r, 'ucl')} | "
            f"{reach if reach is not None else 'not reached'} | {_pct(r['assumption_first'])} -> "
            f"{_pct(r['assumption_last'])} ({_pct(r['assumption_min'])}) | {_threshold(r)} | "
            f"{r['train_minutes_median']:.1f} | {'-' if vps is None else f'{vps:.0f}'} |\n"
        )
    for r in rows:
        if r["trains_as"] is not None:
            text.write(f"\n**{display(r['method'])} is {display(r['trains_as'])} in disguise at this budget:** its training "
                       f"loss equals {display(r['trains_as'])}'s to {SAME_LOSS:g} at every epoch of every shared seed.\n")
    text.write("\n### The paper's claims\n\n")
    for v in verdicts(records):
        text.write(f"* **{v.claim}: {v.verdict}.** {v.evidence}\n")
    text.write(RESULTS_END + "\n")
    text.write(_threshold_table(records))
    text.write(
        "\n## How to read it\n\n"
        "Means ± sample standard deviations over seeds. A seed fixes the initialisation, the batch order and the "
        "augmentations for every method, so differences are paired by seed: mean of the per-seed differences with "
        "a two-sided 95 % Student-t interval. Linear probe and final kNN: frozen features of the whole training "
        "subset and test split (each run's `probe_protocol`). 'Epochs to SCL's final kNN' uses the per-epoch kNN "
        "monitor, mean over seeds. Assumption 1 and the Lemma-1 losses are measured on training batches with each "
        "run's own hardening (the threshold for H-SCL(tau), beta otherwise) and label positives. The H-SCL(tau) "
        "threshold l keeps the other-label negatives whose cosine is at least l; 'keeps' is the fraction of "
        f"those negatives it kept (a row that keeps at least {KEEPS_EVERYTHING:.1%} at every epoch is flagged). "
        "Every number here is recomputed from `runs/*.json` by `recipes/reproduce.py`.\n"
    )
    return text.getvalue()


def read_records(folder: Path) -> list[Record]:
    """The JSON records directly under `folder` (a budget's runs/, its evidence/), in name order."""
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def evidence_rows(results: Path, method: str, dataset: str) -> list[tuple[Budget, dict[str, Any]]]:
    """`method`'s summary row (as in summary.md) at every evidence budget of `dataset` that has
    finished runs of it under `results` (the repository's results/ folder), budget table order."""
    rows = []
    for budget in BUDGETS.values():
        if not budget.evidence or budget.settings["dataset"] != dataset:
            continue
        records = read_records(results / budget.name / "runs")
        rows += [(budget, row) for row in method_rows(records) if row["method"] == method] if records else []
    return rows


def evidence_table(rows: list[tuple[Budget, dict[str, Any]]]) -> str:
    """The Markdown table of `evidence_rows`: accuracies over seeds and the paired difference
    against SCL, formatted as in summary.md."""
    lines = ["| budget | seeds | linear top-1 (%) | kNN top-1 (%) | minus SCL, paired [95% CI] |",
             "|---|---:|---|---|---|"]
    lines += [f"| `{budget.name}` | {r['seeds']} | {r['top1_mean']:.2f} ± {r['top1_std']:.2f} | "
              f"{r['knn_top1_mean']:.2f} ± {r['knn_top1_std']:.2f} | {_diff(r, 'scl')} |" for budget, r in rows]
    return "\n".join(lines)


def budget_evidence(method_name: str, dataset: str, results: Path | None) -> str:
    """The card's section quoting the method's runs at the evidence budgets of its dataset (empty
    when `results`, the repository's results/ folder, is absent or holds none, as in a wheel)."""
    if results is None or not results.is_dir():
        return ""
    rows = evidence_rows(results, method_name, dataset)
    if not rows:
        return ""
    method = METHODS[method_name].display if method_name in METHODS else method_name
    budgets = "\n".join(f"- [`{budget.name}`](../results/{budget.name}/summary.md): {budget.description}"
                        + (f" Retrieval, transfer and fine-tuning of its seed-0 encoders: "
                           f"[evidence](../results/{budget.name}/evidence/summary.md)."
                           if (results / budget.name / "evidence" / "summary.md").is_file() else "")
                        for budget, _ in rows)
    hardware = " and ".join(kind for kind in ("CPU", "GPU") if any(b.name.startswith(kind.lower() + "-") for b, _ in rows))
    return (f"\n\n### {method} at {hardware or 'smaller'} budgets (not this model, not the paper's budget)\n\n"
            "Encoders trained with the methods side by side at budgets this project can afford (each budget "
            "below says its data, model, schedule and hardware), to test the paper's claims: linear probe and kNN top-1 on the full test split, "
            "means ± standard deviations over seeds, differences paired by seed. Each budget's runs, summary "
            "and verdicts are in the hscl_zoo repository under `results/<budget>/` (linked below).\n\n"
            f"{evidence_table(rows)}\n\n{budgets}")


def _threshold_table(records: list[Record]) -> str:
    """Per epoch, mean over H-SCL(tau) seeds: the threshold, the fraction of negatives it kept and
    the negative-cosine quartiles it cut; SCL's quartiles beside them for reference."""
    groups = by_method(records)
    tau = groups.get("hscl-tau", [])
    if not tau or "threshold_kept_fraction" not in tau[0]["history"][0]:
        return ""
    columns = {"threshold": "threshold", "threshold_kept_fraction": "kept", "neg_cos_q50": "median cos",
               "neg_cos_q75": "75th pct cos"}
    curves = {key: mean_curve(tau, key) for key in columns}
    scl = groups.get("scl", [])
    scl_curves = {k: mean_curve(scl, k) for k in ("neg_cos_q50", "neg_cos_q75")} if scl and "neg_cos_q50" in scl[0]["history"][0] else {}
    out = io.StringIO()
    out.write(f"\n## {display('hscl-tau')}: what the threshold kept, per epoch\n\n")
    out.write("| epoch | " + " | ".join(columns.values()) + (" | SCL median cos | SCL 75th pct cos" if scl_curves else "") + " |\n")
    out.write("|---:|" + "---:|" * (len(columns) + len(scl_curves)) + "\n")
    for e in range(len(curves["threshold"])):
        cells = [f"{curves['threshold'][e]:+.3f}", _pct(curves["threshold_kept_fraction"][e]),
                 f"{curves['neg_cos_q50'][e]:+.3f}", f"{curves['neg_cos_q75'][e]:+.3f}"]
        cells += [f"{scl_curves[k][e]:+.3f}" for k in scl_curves if e < len(scl_curves[k])]
        out.write(f"| {e + 1} | " + " | ".join(cells) + " |\n")
    return out.getvalue()


def write_csv(path: Path, records: list[Record]) -> None:
    rows = method_rows(records)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
