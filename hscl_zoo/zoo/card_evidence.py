"""The measured sections of an image model card: the retrieval and audit results a run's
evaluation wrote. :mod:`hscl_zoo.zoo.cards` assembles the card; the method's runs at the evidence
budgets of its dataset are `hscl_zoo.reproduction.report.budget_evidence`'s section, which the
registry's cards (`hscl_zoo.publishing.cards`) pass in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["markdown_table", "evaluation_sections"]


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


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
