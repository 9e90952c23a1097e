"""The graph summary from hand-made records: beta chosen on test accuracy and on training folds,
and the claim's verdicts from intervals worked out by hand."""

import math

from hscl_zoo.graphs.summary import claim_rows, leak_rows, method_cells, quote_block, render_summary


def _record(variant, method, seed, tests, inners=None, dataset="MUTAG", protocol="a"):
    inners = inners or [0.5] * len(tests)
    return {"dataset": dataset, "protocol": protocol, "variant": variant, "method": method, "seed": seed,
            "folds": [{"fold": f, "C": 1.0, "inner_accuracy": i, "test_accuracy": t}
                      for f, (t, i) in enumerate(zip(tests, inners))],
            "mean_test_accuracy": sum(tests) / len(tests)}


def test_beta_chosen_on_test_accuracy_takes_the_best_mean_and_on_training_folds_the_best_inner_score():
    records = [
        # beta 1: mean 0.70; beta 2: mean 0.75 -> test-chosen beta 2.
        _record("hscl-beta-b1", "hscl-beta", 0, [0.6, 0.8], inners=[0.9, 0.1]),
        _record("hscl-beta-b2", "hscl-beta", 0, [0.7, 0.8], inners=[0.2, 0.3]),
    ]
    test = method_cells(records, "test")["hscl-beta"]
    assert test.variant == "hscl-beta-b2" and math.isclose(test.per_seed[0], 75.0)
    # fold 0: inner 0.9 (b1) -> test 0.6; fold 1: inner 0.3 (b2) -> test 0.8; mean 70 %.
    train = method_cells(records, "train")["hscl-beta"]
    assert math.isclose(train.per_seed[0], 70.0)


def test_the_claim_is_judged_by_the_paired_interval():
    records = []
    for seed, (mine, rival) in enumerate([(0.80, 0.78), (0.82, 0.79), (0.84, 0.80)]):
        records += [_record("hscl-beta-b1", "hscl-beta", seed, [mine]), _record("ucl", "ucl", seed, [rival]),
                    _record("scl", "scl", seed, [mine + 0.01 * (seed - 1)]),
                    _record("hucl-b1", "hucl", seed, [mine + 0.05])]
    rows = {rival: (cells, overall) for rival, cells, overall in claim_rows(records, "a", "test")}
    # differences 2, 3, 4 points: mean 3, sd 1, half width t(0.975, 2) / sqrt(3) = 4.3027 / 1.7321 = 2.484.
    assert rows["ucl"][0]["MUTAG"] == "better +3.00 [+0.52, +5.48]"
    # differences +1, 0, -1: mean 0, half width 2.484 -> a tie.
    assert rows["scl"][0]["MUTAG"] == "tie +0.00 [-2.48, +2.48]"
    assert rows["hucl"][0]["MUTAG"].startswith("worse -5.00")
    assert rows["ucl"][0]["ENZYMES"] == "no records" and rows["ucl"][1] == "not testable yet"


def test_the_claim_is_judged_on_the_protocols_planned_datasets():
    # Protocol (b) plans MUTAG, PTC_MR and IMDB-BINARY: the two it leaves out do not hold the claim back.
    records = []
    for dataset in ("MUTAG", "PTC_MR", "IMDB-BINARY"):
        for seed, (mine, rival) in enumerate([(0.80, 0.78), (0.82, 0.79), (0.84, 0.80)]):
            if dataset == "PTC_MR":
                mine, rival = rival, mine
            records += [_record("hscl-beta-b1", "hscl-beta", seed, [mine], dataset=dataset, protocol="b"),
                        _record("ucl", "ucl", seed, [rival], dataset=dataset, protocol="b")]
    rows = {rival: (cells, overall) for rival, cells, overall in claim_rows(records, "b", "test")}
    assert rows["ucl"][0]["ENZYMES"] == "not planned" and rows["ucl"][0]["PTC_MR"].startswith("worse -3.00")
    assert rows["ucl"][1] == "better on 2 of 3 datasets"
    # One planned dataset short of a second seed: not testable.
    fewer = [r for r in records if not (r["dataset"] == "IMDB-BINARY" and r["seed"] > 0)]
    assert dict((rival, overall) for rival, _, overall in claim_rows(fewer, "b", "test"))["ucl"] == "not testable yet"
    # A dataset outside the plan that has records is judged too.
    extra = records + [_record(v, m, seed, [0.5], dataset="ENZYMES", protocol="b")
                       for seed in range(3) for v, m in (("hscl-beta-b1", "hscl-beta"), ("ucl", "ucl"))]
    assert dict((rival, overall) for rival, _, overall in claim_rows(extra, "b", "test"))["ucl"] == \
        "better on 2 of 4 datasets"


def test_the_leak_is_protocol_a_minus_protocol_b_paired_by_seed():
    records = []
    for seed, (a, b) in enumerate([(0.80, 0.78), (0.82, 0.79), (0.84, 0.80)]):
        records += [_record("scl", "scl", seed, [a]), _record("scl", "scl", seed, [b], protocol="b"),
                    _record("ucl", "ucl", seed, [0.7 + 0.01 * seed]),
                    _record("ucl", "ucl", seed, [0.7 + 0.01 * ((seed + 1) % 3)], protocol="b")]
    # A seed only (a) has, and a dataset only (a) has, are left out.
    records += [_record("scl", "scl", 3, [0.10]), _record("scl", "scl", 0, [0.9], dataset="PTC_MR")]
    rows = dict(leak_rows(records))
    assert set(rows) == {"scl", "ucl"} and set(rows["scl"]) == {"MUTAG"}
    # differences 2, 3, 4 points, as in the claim's test: mean 3, half width 2.484.
    diff = rows["scl"]["MUTAG"]
    assert diff.seeds == (0, 1, 2) and math.isclose(diff.mean, 3.0)
    assert math.isclose(diff.low, 0.516, abs_tol=1e-3) and math.isclose(diff.high, 5.484, abs_tol=1e-3)
    # UCL: differences -1, -1, +2 points: mean 0, not above 0.
    assert math.isclose(rows["ucl"]["MUTAG"].mean, 0.0, abs_tol=1e-9)
    quote = quote_block(records)
    assert "for UCL on 0 of 1; SCL on 1 of 1 (MUTAG +3.00) datasets." in quote
    assert "| SCL | +3.00 [+0.52, +5.48] |" in render_summary(records)


def test_the_plans_name_registered_datasets_and_protocol_a_is_the_whole_table():
    from hscl_zoo.graphs.catalog import GRAPH_DATASETS
    from hscl_zoo.graphs.protocol import PLANS

    names = {spec.tu_name for spec in GRAPH_DATASETS.values()}
    assert set(PLANS["a"].datasets) == names and PLANS["a"].seeds == 10
    assert set(PLANS["b"].datasets) <= names and PLANS["b"].seeds >= 3


def test_the_summary_names_the_paper_numbers_beside_the_measured_ones():
    records = [_record("ucl", "ucl", s, [0.85 + 0.01 * s]) for s in range(2)]
    text = render_summary(records)
    assert "85.5 ± 0.7, 2 seeds (paper 86.8)" in text
    assert "Protocol (b)" not in text


def test_the_readme_and_the_graphs_page_quote_the_committed_records():
    from pathlib import Path

    from hscl_zoo.graphs.summary import load_records, quote_block
    from hscl_zoo._files import replace_block

    root = Path(__file__).resolve().parents[1]
    expected = quote_block(load_records(root / "results/graphs-paper/records"))
    for page in (root / "README.md", root / "docs/graphs.md"):
        text = page.read_text()
        assert replace_block(text, "graphs-paper", expected) == text, f"{page.name}: rerun python -m hscl_zoo.graphs.summary --quote"
    summary = root / "results/graphs-paper/summary.md"
    from hscl_zoo.graphs.summary import render_summary

    assert summary.read_text() == render_summary(load_records(root / "results/graphs-paper/records"))


def test_the_figure_draws_each_cells_mean_and_std_beside_table_2():
    import matplotlib.pyplot as plt
    import numpy as np

    from hscl_zoo.graphs.figures import table_two_figure

    records = [_record("ucl", "ucl", s, [t]) for s, t in enumerate([0.80, 0.90])]
    records += [_record("scl", "scl", s, [t], dataset="PTC_MR") for s, t in enumerate([0.50, 0.60, 0.70])]
    fig = table_two_figure(records, "a", "train")
    try:
        mutag, ptc = fig.axes
        assert mutag.get_title() == "MUTAG (seeds: 2)" and ptc.get_title() == "PTC (seeds: 3)"
        assert [round(p.get_height(), 6) for p in mutag.patches] == [85.0]
        assert [round(p.get_height(), 6) for p in ptc.patches] == [60.0]
        (bar,) = [c for c in ptc.containers if hasattr(c, "errorbar")]
        low, high = bar.errorbar.lines[2][0].get_segments()[0][:, 1]
        assert np.isclose(high - low, 2 * 10.0)  # sample std of 50, 60, 70 is 10 points, drawn both ways
        ticks = [line.get_ydata()[0] for line in mutag.lines if line.get_color() == "black"]
        assert ticks == [86.8], "UCL's MUTAG number in the paper's Table 2"
    finally:
        plt.close(fig)
