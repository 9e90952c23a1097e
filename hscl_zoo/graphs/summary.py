"""The graph table's summary: Table 2 beside what the records measured, best beta chosen two ways,
and verdicts on the paper's claim from paired per-seed differences.

A record's accuracy is the mean test accuracy of its ten SVM folds (%). A method's cell is the mean
and standard deviation over seeds. H-UCL and H-SCL(beta) are reported at the beta chosen

* on test accuracy, as the paper does: the beta of the highest mean over seeds, per dataset;
* on training folds only: in every (seed, fold) the beta whose SVM had the best inner-CV accuracy,
  scored on that fold's test graphs. This one is a held-out estimate; the first is not.

The paper's claim, "H-SCL(beta) is consistently better than the other methods across the five
datasets", is judged per dataset and protocol against UCL, H-UCL and SCL (each at its own chosen
beta) by the 95 % interval of the paired per-seed difference.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hscl_zoo._files import replace_block
from hscl_zoo.graphs.catalog import GRAPH_DATASETS, TABLE_2_METHODS, find_graph_dataset
from hscl_zoo.graphs.protocol import GRAPH_VARIANTS, PLANS
from hscl_zoo.losses.methods import get_method
from hscl_zoo.reproduction.statistics import PairedDifference, mean_std, paired_difference

__all__ = ["load_records", "GraphCell", "method_cells", "claim_rows", "leak_rows", "render_summary", "quote_block",
           "BEATS", "release_variant"]

Record = dict[str, Any]
CHOICES = ("test", "train")
"""How a tuned method's beta is chosen: on test accuracy (the paper's way) or on training folds."""
BEATS = ("ucl", "hucl", "scl")
"""The methods H-SCL(beta) is claimed to beat on graphs."""


def load_records(root: str | Path) -> list[Record]:
    """Every record under `root` (``DATASET/protocol-P/VARIANT/seedK.json``)."""
    return [json.loads(p.read_text()) for p in sorted(Path(root).glob("*/protocol-*/*/seed*.json"))]


def _accuracy(record: Record) -> float:
    return 100.0 * record["mean_test_accuracy"]


@dataclass(frozen=True)
class GraphCell:
    """One method on one dataset under one protocol: per-seed accuracies (%) and how beta was chosen."""

    method: str
    per_seed: dict[int, float]
    variant: str
    choice: str

    @property
    def mean_std(self) -> tuple[float, float]:
        return mean_std(list(self.per_seed.values()))

    @property
    def seeds(self) -> int:
        return len(self.per_seed)


def _by_variant(records: Iterable[Record]) -> dict[str, dict[int, Record]]:
    out: dict[str, dict[int, Record]] = defaultdict(dict)
    for r in records:
        out[r["variant"]][r["seed"]] = r
    return out


def _train_chosen(variants: dict[str, dict[int, Record]], names: list[str]) -> dict[int, float]:
    """Per seed: in each fold the variant of best inner accuracy (first on ties), its test accuracy."""
    seeds = set.intersection(*(set(variants[n]) for n in names)) if names else set()
    out = {}
    for seed in sorted(seeds):
        folds = [variants[n][seed]["folds"] for n in names]
        chosen = [max(range(len(names)), key=lambda k: (folds[k][f]["inner_accuracy"], -k))
                  for f in range(len(folds[0]))]
        out[seed] = 100.0 * sum(folds[k][f]["test_accuracy"] for f, k in enumerate(chosen)) / len(chosen)
    return out


def method_cells(records: list[Record], choice: str = "test") -> dict[str, GraphCell]:
    """The cell of every method present in `records` (one dataset, one protocol)."""
    variants = _by_variant(records)
    cells = {}
    for method in dict.fromkeys(v.method for v in GRAPH_VARIANTS):
        names = [v.name for v in GRAPH_VARIANTS if v.method == method and v.name in variants]
        if not names:
            continue
        if len(names) == 1:
            cells[method] = GraphCell(method, {s: _accuracy(r) for s, r in variants[names[0]].items()}, names[0], "only")
        elif choice == "test":
            best = max(names, key=lambda n: mean_std([_accuracy(r) for r in variants[n].values()])[0])
            cells[method] = GraphCell(method, {s: _accuracy(r) for s, r in variants[best].items()}, best, "test")
        else:
            cells[method] = GraphCell(method, _train_chosen(variants, names), "per fold", "train")
    return cells


def release_variant(records: list[Record], method: str) -> tuple[Any, str]:
    """The variant of `method` a zoo release trains, chosen without the SVM's test folds: the one
    of best mean inner-CV accuracy over every fold of every seed its records share (first on ties),
    and a phrase saying so. `records`: one dataset, protocol (a)."""
    variants = [v for v in GRAPH_VARIANTS if v.method == method]
    if len(variants) == 1:
        return variants[0], ""
    by = _by_variant(records)
    seeds = sorted(set.intersection(*(set(by.get(v.name, {})) for v in variants)))
    if not seeds:
        raise ValueError(f"no seed has protocol-(a) records of every {method} variant "
                         f"({', '.join(v.name for v in variants)}); run recipes/graph_table.py first.")
    inner = {v.name: [f["inner_accuracy"] for s in seeds for f in by[v.name][s]["folds"]] for v in variants}
    scores = {name: sum(values) / len(values) for name, values in inner.items()}
    best = max(variants, key=lambda v: (scores[v.name], -variants.index(v)))
    key = best.hyperparameters[0][0]
    folds = len(inner[best.name])
    shown = ", ".join(f"{dict(v.hyperparameters)[key]:g}: {100 * scores[v.name]:.2f} %" for v in variants)
    phrase = (f"{key} chosen without test folds: the best mean inner-CV SVM accuracy over the {folds} folds of "
              f"protocol (a)'s seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))} ({shown})")
    return best, phrase


def _interval(diff: PairedDifference | None) -> str:
    if diff is None:
        return "no shared seeds"
    if diff.low is None:
        return f"{diff.mean:+.2f} (1 seed)"
    return f"{diff.mean:+.2f} [{diff.low:+.2f}, {diff.high:+.2f}]"


def _verdict(diff: PairedDifference | None) -> str:
    if diff is None:
        return "not testable (no shared seeds)"
    if diff.low is None:
        return f"not testable (1 seed: {diff.mean:+.2f})"
    return f"{'better' if diff.low > 0 else 'worse' if diff.high < 0 else 'tie'} {_interval(diff)}"


def claim_rows(records: list[Record], protocol: str, choice: str) -> list[tuple[str, dict[str, str], str]]:
    """Per rival method: its verdict on each dataset, and whether the claim holds against it.

    The claim is judged on the protocol's planned datasets (`PLANS`) and on any other dataset with
    records under it; it is "not testable yet" while one of them lacks the records for an interval."""
    rows = []
    for rival in BEATS:
        cells, holds = {}, []
        for spec in GRAPH_DATASETS.values():
            mine = [r for r in records if r["dataset"] == spec.tu_name and r["protocol"] == protocol]
            judged = bool(mine) or spec.tu_name in PLANS[protocol].datasets
            by = method_cells(mine, choice)
            if "hscl-beta" not in by or rival not in by:
                cells[spec.tu_name] = "no records" if judged else "not planned"
                if judged:
                    holds.append(None)
                continue
            diff = paired_difference(by["hscl-beta"].per_seed, by[rival].per_seed)
            cells[spec.tu_name] = _verdict(diff)
            holds.append(None if diff is None or diff.low is None else diff.low > 0)
        if any(h is None for h in holds):
            overall = "not testable yet"
        else:
            overall = f"better on {sum(holds)} of {len(holds)} datasets"
        rows.append((rival, cells, overall))
    return rows


def leak_rows(records: list[Record], choice: str = "train") -> list[tuple[str, dict[str, PairedDifference | None]]]:
    """Per method, on each dataset with records under both protocols: accuracy under (a) minus under (b),
    paired by seed. A seed fixes the outer folds, so both protocols score the same test graphs; only
    what trained the encoder differs (under (a) every graph, and for SCL and H-SCL every label)."""
    datasets = [s.tu_name for s in GRAPH_DATASETS.values()
                if {r["protocol"] for r in records if r["dataset"] == s.tu_name} >= {"a", "b"}]
    cells = {(d, p): method_cells([r for r in records if r["dataset"] == d and r["protocol"] == p], choice)
             for d in datasets for p in ("a", "b")}
    rows = []
    for method in dict.fromkeys(v.method for v in GRAPH_VARIANTS):
        diffs = {d: paired_difference(cells[d, "a"][method].per_seed, cells[d, "b"][method].per_seed)
                 for d in datasets if method in cells[d, "a"] and method in cells[d, "b"]}
        if diffs:
            rows.append((method, diffs))
    return rows


def leak_table(rows: list[tuple[str, dict[str, PairedDifference | None]]]) -> str:
    specs = [s for s in GRAPH_DATASETS.values() if any(s.tu_name in diffs for _, diffs in rows)]
    lines = ["| method | " + " | ".join(s.display for s in specs) + " |", "|---|" + "---|" * len(specs)]
    for method, diffs in rows:
        lines.append(f"| {get_method(method).display} | "
                     + " | ".join(_interval(diffs.get(s.tu_name)) if s.tu_name in diffs else "–" for s in specs) + " |")
    return "\n".join(lines)


def _leak_line(rows: list[tuple[str, dict[str, PairedDifference | None]]]) -> str:
    parts = []
    for method, diffs in rows:
        higher = [(d, x) for d, x in diffs.items() if x is not None and x.low is not None and x.low > 0]
        where = ", ".join(f"{find_graph_dataset(d).display} {x.mean:+.2f}" for d, x in higher)
        parts.append(f"{get_method(method).display} on {len(higher)} of {len(diffs)}" + (f" ({where})" if where else ""))
    return "; ".join(parts)


def _cell_text(cell: GraphCell | None) -> str:
    if cell is None:
        return "–"
    mean, std = cell.mean_std
    beta = f" ({cell.variant.rsplit('-', 1)[-1]})" if cell.choice == "test" else ""
    return f"{mean:.1f} ± {std:.1f}{beta}, {cell.seeds} seed{'s' if cell.seeds != 1 else ''}"


def table_two(records: list[Record], protocol: str, choice: str) -> str:
    """Markdown: Table 2's rows (plus H-SCL(tau)) with the paper's number beside each measured cell."""
    specs = list(GRAPH_DATASETS.values())
    lines = ["| method | " + " | ".join(s.display for s in specs) + " |", "|---|" + "---|" * len(specs)]
    per_dataset = {s.tu_name: method_cells([r for r in records if r["dataset"] == s.tu_name
                                            and r["protocol"] == protocol], choice) for s in specs}
    for method in (*TABLE_2_METHODS, "hscl-tau"):
        cells = []
        for s in specs:
            paper = s.paper_accuracy.get(method)
            text = _cell_text(per_dataset[s.tu_name].get(method))
            cells.append(text + (f" (paper {paper:.1f})" if paper is not None else ""))
        lines.append(f"| {get_method(method).display} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def variant_table(records: list[Record], protocol: str) -> str:
    """Markdown: every variant (each beta) on every dataset, mean ± std over seeds."""
    specs = list(GRAPH_DATASETS.values())
    lines = ["| variant | " + " | ".join(s.display for s in specs) + " |", "|---|" + "---|" * len(specs)]
    for variant in GRAPH_VARIANTS:
        cells = []
        for s in specs:
            values = [_accuracy(r) for r in records if r["dataset"] == s.tu_name and r["protocol"] == protocol
                      and r["variant"] == variant.name]
            cells.append(f"{mean_std(values)[0]:.1f} ± {mean_std(values)[1]:.1f} ({len(values)})" if values else "–")
        lines.append(f"| {variant.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def claims_table(records: list[Record], protocol: str, choice: str) -> str:
    specs = list(GRAPH_DATASETS.values())
    lines = ["| H-SCL(β) against | " + " | ".join(s.display for s in specs) + " | claim |",
             "|---|" + "---|" * (len(specs) + 1)]
    for rival, cells, overall in claim_rows(records, protocol, choice):
        lines.append(f"| {get_method(rival).display} | " + " | ".join(cells[s.tu_name] for s in specs)
                     + f" | {overall} |")
    return "\n".join(lines)


PROTOCOL_TEXT = {
    "a": "Protocol (a), the paper's: each encoder is trained on all graphs of the dataset, then the SVM is "
         "cross-validated on its frozen embeddings (test folds' labels shaped SCL's and H-SCL's encoders).",
    "b": "Protocol (b), leak-free: for each outer fold an encoder is trained on the training folds only.",
}
LEAK_TEXT = ("Accuracy under protocol (a) minus under protocol (b), paired by seed (a seed fixes the outer folds, so "
             "both score the same test graphs), 95 % t interval; β chosen on training folds. Only what trained "
             "the encoder differs: under (a) it also saw the test fold's graphs, and for SCL, H-SCL(β) and H-SCL(τ) "
             "their labels. A positive interval is accuracy that protocol (a) credits to the encoder but a "
             "held-out estimate does not.")
CHOICE_TEXT = {"test": "β chosen on test accuracy (the paper's way)",
               "train": "β chosen per fold on training folds only (inner-CV accuracy)"}


def render_summary(records: list[Record]) -> str:
    """summary.md: for each protocol with records, Table 2 both ways, the claim's verdicts, every variant."""
    done = len(records)
    parts = ["# Graphs: the paper's Table 2", "",
             f"{done} records (dataset × protocol × variant × seed), each 10 SVM folds. Cells: mean ± std over "
             "seeds of the 10-fold accuracy (%), the paper's number beside it. Verdicts: paired per-seed "
             "difference of H-SCL(β) minus the rival, 95 % t interval; 'better' when the interval lies above 0.",
             "Generated by `python -m hscl_zoo.graphs.summary` from the records; do not edit. "
             "The figures `figures/table2-protocol-a.png` and `figures/table2-protocol-b.png` (`python -m "
             "hscl_zoo.graphs.figures`) draw Table 2 with β chosen on training folds.", ""]
    for protocol in ("a", "b"):
        mine = [r for r in records if r["protocol"] == protocol]
        if not mine:
            continue
        parts += [f"## Protocol ({protocol})", "", PROTOCOL_TEXT[protocol], ""]
        for choice in CHOICES:
            parts += [f"### Table 2, {CHOICE_TEXT[choice]}", "", table_two(mine, protocol, choice), "",
                      f"The paper's claim, H-SCL(β) better than each rival ({CHOICE_TEXT[choice]}):", "",
                      claims_table(mine, protocol, choice), ""]
        parts += ["### Every variant (records per cell in parentheses)", "", variant_table(mine, protocol), ""]
    leaks = leak_rows(records)
    if leaks:
        parts += ["## What the test folds give the encoder: protocol (a) minus protocol (b)", "", LEAK_TEXT, "",
                  leak_table(leaks), ""]
    return "\n".join(parts)


def _claim_line(records: list[Record], protocol: str, choice: str) -> str:
    parts = [f"{get_method(rival).display}: {overall}" for rival, _, overall in claim_rows(records, protocol, choice)]
    return "; ".join(parts)


def quote_block(records: list[Record]) -> str:
    """The README's and the Graphs page's quote: record counts and the claim's verdict per protocol."""
    lines = []
    for protocol in ("a", "b"):
        mine = [r for r in records if r["protocol"] == protocol]
        if not mine:
            lines.append(f"* Protocol ({protocol}): no records yet.")
            continue
        plan = PLANS[protocol]
        planned = len(plan.datasets) * len(GRAPH_VARIANTS) * plan.seeds
        datasets = [d for d in plan.datasets if any(r["dataset"] == d for r in mine)]
        datasets += sorted({r["dataset"] for r in mine} - set(plan.datasets))
        scope = f"{len(mine)} of {planned} records ({plan.seeds} seeds planned) on {', '.join(datasets)}"
        lines.append(f"* Protocol ({protocol}), {scope}. H-SCL(β) with β chosen on training folds, against "
                     f"{_claim_line(mine, protocol, 'train')}.")
    leaks = leak_rows(records)
    if leaks:
        lines.append(f"* Protocol (a) minus protocol (b), on the same seeds and folds: accuracy higher under (a) "
                     f"(95 % interval above 0) for {_leak_line(leaks)} datasets.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Write results/graphs-paper/summary.md from its records.")
    parser.add_argument("--root", type=Path, default=Path("results/graphs-paper"))
    parser.add_argument("--quote", type=Path, nargs="*", default=[], help="pages whose graphs-paper block to rewrite")
    args = parser.parse_args(argv)
    records = load_records(args.root / "records")
    (args.root / "summary.md").write_text(render_summary(records))
    print(f"{args.root / 'summary.md'}: {len(records)} records")
    for page in args.quote:
        page.write_text(replace_block(page.read_text(), "graphs-paper", quote_block(records)))
        print(f"{page}: quote updated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
