"""The measured sections of an image model card: the retrieval and audit results a run's
evaluation wrote, and the method's runs at the evidence budgets of its dataset, from the
repository's results/ (``hscl_zoo._roots``). :mod:`hscl_zoo.zoo.cards` assembles the card."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hscl_zoo.losses.methods import METHODS

__all__ = ["markdown_table", "evaluation_sections", "budget_evidence"]


_RETRIEVAL_ROWS = (("Recall@1", "recall_at_1"), ("Recall@5", "recall_at_5"), ("Recall@10", "recall_at_10"),
                   ("Precision@1", "precision_at_1"), ("MAP@R", "map_at_r"), ("mAP", "map"))


def evaluation_sections(evaluation: Mapping[str, Any]) -> str:
    """The retrieval and audit sections of a card, from the evaluation the recipe writes (empty
    without them)."""
    sections = []
    retrieval = evaluation.get("retrieval")
    if retrieval:
        rows = [(name, f"{retrieval[key]:.2f}") for name, key in _RETRIEVAL_ROWS if key in retrieval]
        sections.append(
            f"### Retrieval\n\nEach of the {retrieval['queries']} test images queries the "
            f"{retrieval['gallery_size']} training images by cosine similarity of the frozen features "
            "(% of queries; MAP@R as in Musgrave et al., 2020).\n\n" + markdown_table(("metric", "%"), rows))
    audit = evaluation.get("audit")
    if audit:
        rows = [("alignment (two views of an image, alpha 2; lower is better)", f"{audit['alignment']:.4f}"),
                ("uniformity (t 2; lower is better)", f"{audit['uniformity']:.4f}"),
                ("Assumption 1 holds (fraction of test anchors)", f"{audit['assumption_fraction']:.4f}")]
        accuracy = sorted(((v, k) for k, v in audit["class_accuracy"].items() if v == v))[:5]
        text = (f"### Representation audit\n\nOn the {audit['images']} images of the {audit['split']} split: "
                "alignment and uniformity of the projections (Wang and Isola, 2020) and the paper's "
                "Assumption 1 on test batches.\n\n" + markdown_table(("quantity", "value"), rows))
        if accuracy:
            text += "\n\nLowest per-class accuracy (linear probe): " + ", ".join(
                f"{name} {value:.1f}%" for value, name in accuracy) + "."
        if audit["confused_pairs"]:
            text += "\n\nMost-confused class pairs: " + ", ".join(
                f"{a} / {b} ({pair['rate']:.1f}%)" for pair in audit["confused_pairs"]
                for a, b in [pair["classes"]]) + "."
        sections.append(text)
    return "".join("\n\n" + section for section in sections)


def budget_evidence(method_name: str, dataset: str, results: Path | None) -> str:
    """The card's section quoting the method's runs at the evidence budgets of its dataset (empty
    when `results`, the repository's results/ folder, is absent or holds none, as in a wheel)."""
    if results is None or not results.is_dir():
        return ""
    from hscl_zoo.reproduction.report import evidence_rows, evidence_table

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


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
