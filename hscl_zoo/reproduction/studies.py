"""Named studies: variants of one method trained at a reproduction budget to answer one question.

A study is a budget (data, backbone, epochs, probe) plus variants, each a few pretraining keys
over the budget's, and the claims it judges, each a comparison of two variants' linear-probe
top-1 paired by seed. A variant may instead reuse the budget's own run of a method (no second
training of what the main table already has), as it is or probed again with other evaluation
settings (e.g. UCL, which never reads a label, probed with 10 % of them). `recipes/study.py` trains what is missing and
renders `summary.md` from the run files (`hscl_zoo.reproduction.study_report`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from hscl_zoo.losses.methods import METHODS
from hscl_zoo.reproduction.budgets import BUDGETS

# Evaluation settings a study may change when it probes a budget's run again: ones that do not
# touch the training of a method that reads no label.
PROBE_KEYS = ("labelled_fraction",)


@dataclass(frozen=True)
class Variant:
    """One arm of a study: `settings` over the budget's (method included), or, with
    `budget_method`, the budget's own run of that method, whose encoder is probed again with the
    evaluation settings `probe` (`hscl_zoo.evaluation.evaluate_model` keys) when given."""

    name: str
    description: str
    settings: dict[str, Any] = field(default_factory=dict)
    budget_method: str | None = None
    probe: dict[str, Any] = field(default_factory=dict)

    @property
    def record_in_budget(self) -> bool:
        """Whether the variant's records are the budget's own run files (else the study's)."""
        return self.budget_method is not None and not self.probe


@dataclass(frozen=True)
class Comparison:
    """A claim judged on linear-probe top-1, paired by seed: variant `a` beats variant `b`
    ("beats"), or lies within `margin` points of it ("matches")."""

    claim: str
    a: str
    b: str
    kind: Literal["beats", "matches"] = "beats"
    margin: float = 1.0


@dataclass(frozen=True)
class Study:
    name: str
    budget: str
    question: str
    variants: tuple[Variant, ...]
    comparisons: tuple[Comparison, ...]

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)


STUDIES: dict[str, Study] = {s.name: s for s in (
    Study(
        "negatives-cifar10-10k", "cpu-cifar10-10k",
        "More negatives than the batch holds (issue 16): does H-SCL(β) at a small batch gain from a labelled "
        "memory queue, and does the gradient cache reach the big batch's accuracy in a small batch's memory?",
        (
            Variant("b256", "batch 256, M = 510: the budget's own H-SCL(β) run", budget_method="hscl-beta"),
            Variant("b64", "batch 64, M = 126", dict(method="hscl-beta", batch_size=64)),
            Variant("b64-queue", "batch 64 and a 384-row labelled queue from epoch 1, M = 510",
                    dict(method="hscl-beta", batch_size=64, queue_size=384)),
            Variant("b64-queue-e4", "batch 64 and a 384-row labelled queue from epoch 4 (three epochs without it), "
                    "M = 510 from then", dict(method="hscl-beta", batch_size=64, queue_size=384, queue_start_epoch=4)),
            Variant("b64-queue128", "batch 64 and a 128-row labelled queue (one step old) from epoch 1, M = 254",
                    dict(method="hscl-beta", batch_size=64, queue_size=128)),
            Variant("b256-cache", "batch 256 by the gradient cache, 128 views (64 images) a pass, M = 510; "
                    "BatchNorm statistics per pass", dict(method="hscl-beta", batch_size=256, chunk_size=64)),
        ),
        (
            Comparison("The queue helps H-SCL(β) at batch 64", "b64-queue", "b64"),
            Comparison("The gradient cache beats batch 64", "b256-cache", "b64"),
            Comparison("The gradient cache matches batch 256 (within 1 point)", "b256-cache", "b256", "matches"),
            Comparison("The queue at batch 64 matches batch 256 (within 1 point)", "b64-queue", "b256", "matches"),
            Comparison("Starting the queue at epoch 4 beats starting it at epoch 1", "b64-queue-e4", "b64-queue"),
            Comparison("The queue from epoch 4 helps H-SCL(β) at batch 64", "b64-queue-e4", "b64"),
            Comparison("The queue from epoch 4 matches batch 256 (within 1 point)", "b64-queue-e4", "b256", "matches"),
            Comparison("A 128-row queue from epoch 1 helps H-SCL(β) at batch 64", "b64-queue128", "b64"),
        ),
    ),
    Study(
        "partial-labels-cifar10-10k", "cpu-cifar10-10k",
        "Partly labelled data (issue 17): with 10 % of the training labels (1,000 of 10,000 images, class "
        "balanced, the rest labelled -1), do mixed batches beat training on the labelled images alone and "
        "training without labels? The linear probe and kNN use the 1,000 labelled training images.",
        (
            Variant("scl-labelled-only", "SCL on the 1,000 labelled images only",
                    dict(method="scl", labelled_fraction=0.1, train_on_unlabelled=False)),
            Variant("scl-mixed", "SCL on all 10,000 images, 1,000 labelled",
                    dict(method="scl", labelled_fraction=0.1)),
            Variant("hscl-beta-mixed", "H-SCL(β) on all 10,000 images, 1,000 labelled",
                    dict(method="hscl-beta", labelled_fraction=0.1)),
            Variant("ucl", "UCL on all 10,000 images (the budget's own run: UCL reads no label), probed with the "
                    "1,000 labels", budget_method="ucl", probe=dict(labelled_fraction=0.1)),
        ),
        (
            Comparison("SCL on mixed batches beats SCL on the labelled images only", "scl-mixed", "scl-labelled-only"),
            Comparison("SCL on mixed batches beats UCL", "scl-mixed", "ucl"),
            Comparison("H-SCL(β) on mixed batches beats SCL on mixed batches", "hscl-beta-mixed", "scl-mixed"),
            Comparison("H-SCL(β) on mixed batches beats UCL", "hscl-beta-mixed", "ucl"),
        ),
    ),
)}


def check_study(study: Study) -> None:
    """Raise ValueError if `study` names an unknown budget or variant, or a variant is ill-formed."""
    if study.budget not in BUDGETS:
        raise ValueError(f"study {study.name}: unknown budget {study.budget!r}; budgets: {', '.join(sorted(BUDGETS))}")
    names = [v.name for v in study.variants]
    if len(set(names)) != len(names):
        raise ValueError(f"study {study.name}: duplicate variant names {names}")
    for c in study.comparisons:
        if {c.a, c.b} - set(names):
            raise ValueError(f"study {study.name}: comparison {c.claim!r} names a variant not in {names}")
    for v in study.variants:
        if (v.budget_method is None) == ("method" not in v.settings):
            raise ValueError(f"study {study.name}, variant {v.name}: give either settings with a method or "
                             "budget_method, not both or neither")
        if v.probe and v.budget_method is None:
            raise ValueError(f"study {study.name}, variant {v.name}: probe settings re-evaluate the budget's run of "
                             "budget_method; a variant trained by the study is probed by its own settings")
        if unknown := set(v.probe) - set(PROBE_KEYS):
            raise ValueError(f"study {study.name}, variant {v.name}: probe keys {sorted(unknown)} are not among "
                             f"{', '.join(PROBE_KEYS)}")
        if v.probe and METHODS[v.budget_method].reads_labels:
            raise ValueError(f"study {study.name}, variant {v.name}: {v.budget_method} reads labels in training, so "
                             f"its run with {v.probe} would not be the budget's run; train it as a variant instead")


for _study in STUDIES.values():
    check_study(_study)
