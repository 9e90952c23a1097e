"""The table of published releases that README.md and docs/models.md quote, generated from the
registry so that the pages cannot name a release that is not pinned, or miss one.

    python -m hscl_zoo.zoo.release_table --quote README.md docs/models.md

rewrites the block between ``<!-- results:zoo-releases -->`` and ``<!-- /results:zoo-releases -->``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hscl_zoo.losses.methods import METHODS
from hscl_zoo.reproduction.report import replace_block
from hscl_zoo.zoo import registry

__all__ = ["BLOCK", "releases_table", "main"]

BLOCK = "zoo-releases"


def _scored(entry: registry.ZooEntry) -> str:
    metrics = entry.metrics
    if entry.modality == "graph":
        paper = "" if entry.paper_top1 is None else f" (Table 2: {entry.paper_top1:.1f})"
        return f"SVM {metrics['svm_accuracy']:.2f} %{paper}; linear head {metrics['linear_cv_accuracy']:.2f} %"
    return f"linear top-1 {metrics['top1']:.2f} % (Table 1, ResNet-50 at 200 epochs: {entry.paper_top1:.2f})"


def releases_table() -> str:
    """Markdown: one row per published entry, images first, then graphs by dataset and method."""
    published = [e for e in registry.entries() if e.published]
    published.sort(key=lambda e: (e.modality != "image", e.dataset, list(METHODS).index(e.method), e.name))
    rows = ["| zoo name | method | dataset | scored | trained with |", "|---|---|---|---|---|"]
    for entry in published:
        options = "".join(f", {key} = {value:g}" for key, value in entry.hyperparameters.items())
        budget = (entry.budget or "").split(";")[0]
        rows.append(f"| `{entry.name}` | {METHODS[entry.method].display}{options} | {entry.dataset_display} | "
                    f"{_scored(entry)} | {budget} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hscl_zoo.zoo.release_table", description=__doc__.splitlines()[0])
    parser.add_argument("--quote", type=Path, nargs="+", required=True, help="pages whose zoo-releases block to rewrite")
    args = parser.parse_args(argv)
    table = releases_table()
    for page in args.quote:
        page.write_text(replace_block(page.read_text(), BLOCK, table))
        print(f"{page}: zoo-releases block rewritten ({table.count(chr(10)) - 2} releases)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
