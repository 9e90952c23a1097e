"""The zoo table: one row per zoo name, its own measured score first and the paper's beside it,
generated from the registry and shown everywhere a user looks (``hscl-zoo list``, README.md, the
docs home and Models pages, ``results/zoo_metrics.csv``).

    python -m hscl_zoo.zoo.table --quote README.md docs/models.md --csv results/zoo_metrics.csv

rewrites the blocks between ``<!-- results:zoo-releases -->`` and ``<!-- /results:zoo-releases -->``
(and ``zoo-names``) and the CSV, so that no page can name a release that is not pinned, or miss one.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from hscl_zoo._files import replace_block
from hscl_zoo.data.catalog import DATASETS
from hscl_zoo.graphs.catalog import GRAPH_DATASETS
from hscl_zoo.losses.methods import METHODS
from hscl_zoo.zoo import registry

__all__ = ["BLOCK", "NAMES_BLOCK", "ZooRow", "zoo_rows", "render", "markdown_table", "releases_table", "names_grid", "main"]

BLOCK = "zoo-releases"
NAMES_BLOCK = "zoo-names"
FORMATS = ("table", "csv", "json")


@dataclass(frozen=True)
class ZooRow:
    """What a user needs to pick a model: the name to load, what it is, how good it measured, what
    the paper reports for it, and what it was trained with."""

    name: str
    loads: str | None
    """The tagged release a bare name loads (None for a tagged name, or a name with no weights)."""
    method: str
    dataset: str
    backbone: str
    metric: str
    """``linear top-1`` (images: a linear probe on the frozen encoder) or ``SVM accuracy`` (graphs)."""
    score: float | None
    """The release's own measured ``metric`` in %, None when no weights are published."""
    paper: float | None
    """The paper's number for the name (Table 1 at ResNet-50 and 200 epochs; Table 2)."""
    trained_with: str
    status: str
    """``published``, ``smoke test`` (loadable by its tag, never by its bare name) or ``not published``."""
    metrics: dict[str, float]
    """Every metric measured on the weights it loads (``top1``, ``top5``, ``knn_top1``; ``svm_accuracy``,
    ``linear_cv_accuracy``), in %."""


def _row(name: str) -> ZooRow:
    entry = registry.info(name)
    served = registry.resolve(name)
    loads = served.name if served is not entry else None
    metric, score = served.headline
    if served.published:
        status = "smoke test" if entry.tag is not None and not registry.serves_bare_name(entry) else "published"
    else:
        status = "not published"
    return ZooRow(name=name, loads=loads, method=entry.method, dataset=entry.dataset, backbone=served.backbone,
                  metric=metric, score=score, paper=entry.paper_top1, trained_with=served.trained_with, status=status,
                  metrics=dict(served.metrics) if served.published else {})


def zoo_rows(pattern: str = "*", published_only: bool = False) -> list[ZooRow]:
    """The rows of the zoo names matching a wildcard (``hscl_zoo.list_models``'s), sorted by name.

    A bare name that loads one of its tags carries that tag's score; ``published_only`` keeps the
    names whose weights can be loaded."""
    return [_row(name) for name in registry.list_models(pattern)
            if not published_only or registry.resolve(name).published]


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


COLUMNS = ("name", "dataset", "method", "score %", "paper %", "trained with")


def _described(row: ZooRow) -> str:
    """The text table's last cell: what the weights were trained with (and which tag a bare name
    loads), or, with none, that and which smoke-test tags it has."""
    if row.score is not None:
        return row.trained_with + (f" (loads {row.loads})" if row.loads else "")
    smoke = [tag for tag in registry.tags_of(row.name) if registry.info(tag).published]
    return row.status + (f" (smoke test: {', '.join(smoke)})" if smoke else "")


def render(rows: list[ZooRow], fmt: str = "table") -> str:
    """``rows`` as an aligned text table, CSV (every field) or JSON (a list of objects)."""
    if fmt == "json":
        return json.dumps([asdict(row) for row in rows], indent=2) + "\n"
    if fmt == "csv":
        keys = sorted({key for row in rows for key in row.metrics})
        fields = [f for f in ZooRow.__dataclass_fields__ if f != "metrics"] + keys
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            cells = {k: v for k, v in asdict(row).items() if k != "metrics"}
            writer.writerow({**cells, "score": _number(row.score), "paper": _number(row.paper),
                             **{key: _number(row.metrics.get(key)) for key in keys}})
        return out.getvalue()
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}.")
    if not rows:
        return ""
    cells = [COLUMNS] + [(row.name, row.dataset, row.method, _number(row.score) or "-", _number(row.paper) or "-",
                          _described(row)) for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS) - 1)]
    return "".join(" ".join(cell.ljust(width) for cell, width in zip(line, widths)) + " " + line[-1] + "\n"
                   for line in cells)


def markdown_table(rows: list[ZooRow], link: Callable[[str], str] | None = None) -> str:
    """``rows`` as a Markdown table (the docs home page's), each name through ``link`` when given."""
    lines = ["| zoo name | dataset | method | score % | paper % | trained with |", "|---|---|---|---|---|---|"]
    for row in rows:
        name = f"[`{row.name}`]({link(row.name)})" if link else f"`{row.name}`"
        lines.append(f"| {name} | {row.dataset} | {row.method} | {_number(row.score) or '-'} | "
                     f"{_number(row.paper) or '-'} | {_described(row)} |")
    return "\n".join(lines) + "\n"


def releases_table() -> str:
    """Markdown: one row per published release, images first (best score first within a dataset),
    then graphs by dataset and method, its own score before the paper's."""
    published = [e for e in registry.entries() if e.published]
    published.sort(key=lambda e: (e.modality != "image", e.dataset, -(e.headline[1] or 0) if e.modality == "image" else 0,
                                  list(METHODS).index(e.method), e.name))
    rows = ["| zoo name | dataset | method | score | paper | trained with |", "|---|---|---|---|---|---|"]
    for entry in published:
        options = "".join(f", {key} = {value:g}" for key, value in entry.hyperparameters.items())
        metric, score = entry.headline
        paper = "-" if entry.paper_top1 is None else f"{entry.paper_top1:.2f}"
        rows.append(f"| `{entry.name}` | {entry.dataset_display} | {METHODS[entry.method].display}{options} | "
                    f"**{score:.2f}** {metric} | {paper} | {entry.trained_with} |")
    return "\n".join(rows) + "\n"


def names_grid() -> str:
    """Markdown: per dataset, the bare names and what each loads (its score), or that it has no weights."""
    lines = ["| dataset | names and their scores, best first |", "|---|---|"]
    by_dataset: dict[str, list[ZooRow]] = {}
    for row in zoo_rows():
        if "." not in row.name:
            by_dataset.setdefault(row.dataset, []).append(row)
    order = [*DATASETS, *GRAPH_DATASETS]
    for dataset, rows in sorted(by_dataset.items(), key=lambda item: order.index(item[0])):
        loadable = sorted((r for r in rows if r.score is not None), key=lambda r: -(r.score or 0))
        missing = [r.method for r in rows if r.score is None]
        cells = [f"`{r.name}` {r.score:.2f}" for r in loadable]
        if missing:
            cells.append(f"no weights yet: {', '.join(missing)}")
        display = registry.info(rows[0].name).dataset_display
        lines.append(f"| {display} | {'; '.join(cells)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hscl_zoo.zoo.table", description=__doc__.splitlines()[0])
    parser.add_argument("--quote", type=Path, nargs="*", default=[],
                        help="pages whose zoo-releases / zoo-names blocks to rewrite")
    parser.add_argument("--csv", type=Path, help="write every zoo name's row here (results/zoo_metrics.csv)")
    args = parser.parse_args(argv)
    blocks = {BLOCK: releases_table(), NAMES_BLOCK: names_grid()}
    for page in args.quote:
        text = page.read_text()
        for block, table in blocks.items():
            if f"<!-- results:{block} -->" in text:
                text = replace_block(text, block, table)
        page.write_text(text)
        print(f"{page}: zoo blocks rewritten")
    if args.csv:
        args.csv.write_text(render(zoo_rows(), "csv"))
        print(f"{args.csv}: {len(zoo_rows())} zoo names")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
