"""The claims x budgets table built from hand-made verdicts: one row per claim in the verdicts'
order, one column per budget in the order given, each cell the verdict with its deciding figure
or, where the claim is not testable, the last sentence of the evidence (the why)."""

from __future__ import annotations

import pytest

from hscl_zoo.reproduction.claims_table import cell, claims_table
from hscl_zoo.reproduction.summary import Verdict

BEATS, LEMMA = "H-SCL(β) beats SCL in linear-probe top-1", "L_HSCL <= L_HUCL at every epoch (Lemma 1, H-SCL runs)"
NOT_TESTABLE = "not testable at this budget"


def columns() -> dict[str, list[Verdict]]:
    return {
        "small": [Verdict(BEATS, "not reproduced", "paired difference ... The interval lies across 0.",
                          "+0.20 [-3.00, +3.40], 3 seeds"),
                  Verdict(LEMMA, "reproduced", "held at 6 of 6 epochs ...", "held at 6 of 6 epochs")],
        "large": [Verdict(BEATS, NOT_TESTABLE, "paired difference +1.55 points (1 seed, no interval). A paired "
                          "interval needs at least 2 seeds."),
                  Verdict(LEMMA, NOT_TESTABLE, "no H-SCL(β) or H-SCL(τ) run yet.")],
    }


def test_rows_are_claims_columns_budgets_and_cells_verdicts_with_their_figure():
    assert claims_table(columns(), "results/{budget}/summary.md") == (
        "| claim | [`small`](results/small/summary.md) | [`large`](results/large/summary.md) |\n"
        "|---|---|---|\n"
        "| H-SCL(β) beats SCL in linear-probe top-1 | **not reproduced**: +0.20 [-3.00, +3.40], 3 seeds | "
        "not testable: A paired interval needs at least 2 seeds |\n"
        "| L_HSCL <= L_HUCL at every epoch (Lemma 1, H-SCL runs) | **reproduced**: held at 6 of 6 epochs | "
        "not testable: no H-SCL(β) or H-SCL(τ) run yet |\n")


def test_columns_follow_the_order_given_and_a_pipe_in_a_cell_is_escaped():
    swapped = dict(reversed(list(columns().items())))
    assert claims_table(swapped, "{budget}.md").splitlines()[0] == "| claim | [`large`](large.md) | [`small`](small.md) |"
    assert cell(Verdict(BEATS, "reproduced", "", "a | b")) == "**reproduced**: a \\| b"
    assert cell(Verdict(BEATS, "reproduced", "")) == "**reproduced**"


def test_budgets_judging_other_claims_or_none_are_refused():
    other = {**columns(), "odd": [Verdict(LEMMA, "reproduced", "", "x"), Verdict(BEATS, "reproduced", "", "y")]}
    with pytest.raises(ValueError, match="budget odd judges other claims than small"):
        claims_table(other, "{budget}")
    with pytest.raises(ValueError, match="no budget has finished runs"):
        claims_table({}, "{budget}")
