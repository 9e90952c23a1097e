"""The zoo's model cards under model_cards/: one per registry name, written or checked.

    python -m hscl_zoo.publishing.cards --out model_cards [--check]

An image model's card is `hscl_zoo.zoo.cards.render_card`'s, with its method's runs at the evidence
budgets of its dataset (`hscl_zoo.reproduction.report.budget_evidence`, read from the repository's
results/, ``hscl_zoo._roots``); a graph encoder's is `hscl_zoo.graphs.cards.render_graph_card`'s.
``--check`` exits non-zero when the folder differs from what the registry renders.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import hscl_zoo.zoo.registry as registry
from hscl_zoo._roots import results_dir
from hscl_zoo.graphs.cards import render_graph_card
from hscl_zoo.reproduction.report import budget_evidence
from hscl_zoo.zoo.cards import render_card
from hscl_zoo.zoo.registry import ZooEntry

__all__ = ["registry_card", "write_cards", "check_cards", "main"]


def registry_card(entry: ZooEntry, results: Path | None) -> str:
    """The card of a registry entry: a graph encoder's, or an image model's with its method's runs
    at the evidence budgets of its dataset under `results` (the repository's results/ folder; none
    when it is absent, as in a wheel)."""
    if entry.modality == "graph":
        return render_graph_card(entry)
    return render_card(entry, evidence=budget_evidence(entry.method, entry.dataset, results))


def _rendered() -> dict[str, str]:
    results = results_dir()
    return {f"{entry.name}.md": registry_card(entry, results) for entry in registry.entries()}


def write_cards(out: str | Path) -> list[Path]:
    """Write one card per registry name into ``out``; returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, text in _rendered().items():
        path = out / filename
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def check_cards(out: str | Path) -> list[str]:
    """Problems with the cards in ``out``: missing, stale or extra files (empty when all match)."""
    out = Path(out)
    expected = _rendered()
    problems = []
    for filename, text in expected.items():
        path = out / filename
        if not path.is_file():
            problems.append(f"missing: {path}")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"out of date: {path}")
    present = {p.name for p in out.glob("*.md")} if out.is_dir() else set()
    problems += [f"not a zoo name: {out / extra}" for extra in sorted(present - set(expected))]
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m hscl_zoo.publishing.cards --out model_cards [--check]``."""
    parser = argparse.ArgumentParser(prog="python -m hscl_zoo.publishing.cards", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="model_cards", help="folder holding one card per zoo name")
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on differences")
    args = parser.parse_args(argv)
    if args.check:
        problems = check_cards(args.out)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print(f"Regenerate with: python -m hscl_zoo.publishing.cards --out {args.out}", file=sys.stderr)
            return 1
        print(f"{len(_rendered())} cards in {args.out} are up to date.")
        return 0
    written = write_cards(args.out)
    print(f"wrote {len(written)} cards to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
