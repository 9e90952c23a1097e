"""The paired statistics and the summary rules, checked against values derived by hand and against
scipy's paired t-test (the mutation run of issue 25 found what tests/test_reproduce.py left open)."""

import math

import pytest
from scipy.stats import ttest_rel

from hscl_zoo.reproduction.statistics import epochs_to_reach, mean_std, paired_difference
from hscl_zoo.reproduction.summary import Verdict, method_rows, verdicts

NOT_TESTABLE = "not testable at this budget"
CLAIMS = {
    "beats scl": "H-SCL(β) beats SCL in linear-probe top-1",
    "reaches": "H-SCL(β) reaches SCL's final accuracy within 25% of the epochs (the paper: under 50 of 200)",
    "assumption": "Assumption 1 holds for over 95% of anchors at every epoch (H-SCL runs)",
    "lemma": "L_HSCL <= L_HUCL at every epoch (Lemma 1, H-SCL runs)",
    "crossing": "L_UCL is below L_HSCL in early epochs and above it in later ones (the paper's Fig. 5, H-SCL(τ))",
    "ordering": "Linear-probe top-1 follows the paper's Table 1 order of the methods on this dataset",
}


def test_paired_interval_is_scipys_paired_t_interval():
    a = {3: 61.5, 1: 58.0, 7: 60.25, 4: 55.0, 9: 12.0}
    b = {1: 54.0, 3: 50.0, 4: 56.5, 7: 52.0, 8: 70.0}
    seeds = [1, 3, 4, 7]
    ci = ttest_rel([a[s] for s in seeds], [b[s] for s in seeds]).confidence_interval(0.95)
    diff = paired_difference(a, b)
    assert diff.seeds == tuple(seeds) and diff.n == 4
    assert diff.differences == (4.0, 11.5, -1.5, 8.25)
    assert diff.mean == pytest.approx((4.0 + 11.5 - 1.5 + 8.25) / 4)
    assert (diff.low, diff.high) == pytest.approx((ci.low, ci.high))


def test_two_seed_interval_by_hand():
    """Differences 1 and 3: mean 2, sample sd sqrt(2), so the half-width is t(0.975, 1) = 12.7062."""
    diff = paired_difference({0: 11.0, 1: 13.0}, {0: 10.0, 1: 10.0})
    assert (diff.low, diff.high) == pytest.approx((2 - 12.7062047, 2 + 12.7062047))
    assert diff.describe() == "+2.00 points [95 % CI -10.71, +14.71], 2 seeds"
    assert diff.describe(" pp") == "+2.00 pp [95 % CI -10.71, +14.71], 2 seeds"


def test_one_shared_seed_has_no_interval():
    diff = paired_difference({4: 1.0, 5: 9.0}, {4: 3.5})
    assert (diff.seeds, diff.differences, diff.mean, diff.low, diff.high) == ((4,), (-2.5,), -2.5, None, None)
    assert diff.describe() == "-2.50 points (1 seed, no interval)"
    assert diff.describe("%") == "-2.50% (1 seed, no interval)"


def test_mean_and_sample_deviation_by_hand():
    mean, sd = mean_std([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])
    assert mean == 5.0 and sd == pytest.approx(math.sqrt(32 / 7))  # squared deviations sum to 32, n - 1 = 7
    assert mean_std([3.5]) == (3.5, 0.0)


def test_epochs_to_reach_counts_from_one_and_includes_ties():
    curve = [10.0, 40.0, 50.0, 50.0, 70.0]
    assert epochs_to_reach(curve, 50.0) == 3
    assert epochs_to_reach(curve, 5.0) == 1
    assert epochs_to_reach(curve, 70.0) == 5
    assert epochs_to_reach(curve, 70.5) is None


def run(method: str, seed: int = 0, top1: float = 50.0, epochs: int = 3, **per_epoch) -> dict:
    """A run record as recipes/reproduce.py writes it; a per-epoch metric is a list or one value for every epoch."""
    metrics = {"knn_top1": 50.0, "assumption_fraction": [0.96 + 0.01 * e for e in range(epochs)], "loss_ucl": 5.0,
               "loss_hscl": 5.1, "loss_hucl": 5.2, "train_loss": [6.0 - 0.1 * e for e in range(epochs)],
               "views_per_second": [100.0 + e for e in range(epochs)], **per_epoch}
    history = [{"epoch": e + 1, **{k: v[e] if isinstance(v, list) else v for k, v in metrics.items()}} for e in range(epochs)]
    return {"method": method, "seed": seed, "top1": top1, "top5": top1 + 10, "knn_top1": history[-1]["knn_top1"],
            "history": history, "train_seconds": 60.0 * epochs}


def claim(records: list[dict], key: str) -> Verdict:
    return next(v for v in verdicts(records) if v.claim == CLAIMS[key])


def rows(records: list[dict]) -> dict[str, dict]:
    return {row["method"]: row for row in method_rows(records)}


def test_without_runs_every_claim_waits_and_says_for_what():
    assert verdicts([]) == [
        Verdict(CLAIMS["beats scl"], NOT_TESTABLE, "no H-SCL(β) or SCL run yet."),
        Verdict("H-SCL(β) beats H-UCL in linear-probe top-1", NOT_TESTABLE, "no H-SCL(β) or H-UCL run yet."),
        Verdict("H-SCL(β) beats UCL in linear-probe top-1", NOT_TESTABLE, "no H-SCL(β) or UCL run yet."),
        Verdict(CLAIMS["reaches"], NOT_TESTABLE, "needs both SCL and H-SCL(β) runs."),
        Verdict(CLAIMS["assumption"], NOT_TESTABLE, "no H-SCL(β) or H-SCL(τ) run yet."),
        Verdict(CLAIMS["lemma"], NOT_TESTABLE, "no H-SCL(β) or H-SCL(τ) run yet."),
        Verdict(CLAIMS["crossing"], NOT_TESTABLE, "no H-SCL(τ) run yet."),
        Verdict(CLAIMS["ordering"], NOT_TESTABLE, "no run yet."),
    ]


def test_beats_needs_both_methods_on_shared_seeds():
    scl = [run("scl", 0), run("scl", 1)]
    assert claim(scl, "beats scl") == Verdict(CLAIMS["beats scl"], NOT_TESTABLE, "no H-SCL(β) run yet.")
    no_shared = scl[1:] + [run("hscl-beta", 0)]
    assert claim(no_shared, "beats scl") == Verdict(CLAIMS["beats scl"], NOT_TESTABLE, "the two methods share no seed yet.")
    one_shared = scl + [run("hscl-beta", 0, top1=52.0)]
    assert claim(one_shared, "beats scl") == Verdict(CLAIMS["beats scl"], NOT_TESTABLE,
        "paired difference +2.00 points (1 seed, no interval). A paired interval needs at least 2 seeds.")


def test_beats_reads_the_interval_against_zero():
    scl = [run("scl", s, top1=50.0) for s in range(3)]
    # equal accuracies: the interval is exactly [0, 0], which neither lies above nor below 0
    tie = claim(scl + [run("hscl-beta", s, top1=50.0) for s in range(3)], "beats scl")
    assert (tie.verdict, tie.evidence) == ("not reproduced", "paired difference +0.00 points [95 % CI +0.00, +0.00], "
                                           "3 seeds. The interval lies across 0 (a tie at this budget).")
    assert tie.measure == "+0.00 [+0.00, +0.00], 3 seeds"
    # differences -3, -3.2, -3.1: mean -3.1, sd 0.1, half-width t(0.975, 2) * 0.1 / sqrt(3) = 0.248
    behind = claim(scl + [run("hscl-beta", s, top1=t) for s, t in enumerate((47.0, 46.8, 46.9))], "beats scl")
    assert (behind.verdict, behind.evidence) == ("not reproduced", "paired difference -3.10 points [95 % CI -3.35, -2.85], "
                                                 "3 seeds. The interval lies below 0.")
    assert behind.measure == "-3.10 [-3.35, -2.85], 3 seeds"


def test_reaching_scls_accuracy_at_the_last_allowed_epoch_counts():
    # 4 epochs: a quarter of them is epoch 1; SCL ends at 40 and H-SCL(beta) is at 40 after epoch 1
    records = [run("scl", 0, epochs=4, knn_top1=[10.0, 20.0, 30.0, 40.0]),
               run("hscl-beta", 0, epochs=4, knn_top1=[40.0, 41.0, 42.0, 43.0])]
    assert claim(records, "reaches") == Verdict(CLAIMS["reaches"], "reproduced",
        "per-epoch kNN monitor, mean over seeds: SCL ends at 40.00 % after 4 epochs; H-SCL(β) first reaches it at "
        "epoch 1 (the claim needs epoch <= 1).", "epoch 1 of 4 (needs <= 1)")


def test_assumption_needs_more_than_95_percent_and_a_strict_rise():
    flat = [run("hscl-beta", 0, assumption_fraction=[0.95, 0.96, 0.96])]
    assert claim(flat, "assumption") == Verdict(CLAIMS["assumption"], "not reproduced",
        "over 1 H-SCL run and all their epochs the fraction ranges 95.0%-96.0% (last epoch: 96.0% on average); "
        "it rises at every epoch in 0 of 1 runs.", "95.0%-96.0% of anchors")
    rising = [run("hscl-beta", s, assumption_fraction=[0.96, 0.97, 0.98]) for s in range(2)]
    assert claim(rising, "assumption") == Verdict(CLAIMS["assumption"], "reproduced",
        "over 2 H-SCL runs and all their epochs the fraction ranges 96.0%-98.0% (last epoch: 98.0% on average); "
        "it rises at every epoch in 2 of 2 runs.", "96.0%-98.0% of anchors")
    assert rows(flat)["hscl-beta"]["assumption_rises_every_epoch"] == 0
    assert rows(rising)["hscl-beta"]["assumption_rises_every_epoch"] == 2


def test_assumption_never_measured_is_not_testable_and_its_row_says_so():
    """Batches with no two images of one label (CIFAR-100 at batch 32) leave no anchor to measure."""
    unmeasured = [run("hscl-beta", 0, assumption_fraction=math.nan), run("scl", 0, assumption_fraction=math.nan)]
    assert claim(unmeasured, "assumption") == Verdict(CLAIMS["assumption"], NOT_TESTABLE,
        "no batch of the H-SCL runs held two images of one label, so no anchor had a positive to measure Assumption 1 on.")
    assert rows(unmeasured)["hscl-beta"]["assumption_min"] is None


def test_lemma_holds_at_equality_and_fails_on_one_epoch():
    tied = [run("hscl-beta", 0, loss_hscl=5.0, loss_hucl=5.0), run("scl", 0, loss_hscl=5.0, loss_hucl=5.0)]
    assert claim(tied, "lemma") == Verdict(CLAIMS["lemma"], "reproduced",
        "held at 3 of 3 epochs of the 1 H-SCL run (6 of 6 epochs over all runs).", "held at 3 of 3 epochs")
    assert rows(tied)["hscl-beta"]["lemma_hscl_le_hucl_every_epoch"]
    broken = [run("hscl-tau", s, loss_hscl=[5.1, 5.3, 5.1]) for s in range(2)]
    assert claim(broken, "lemma") == Verdict(CLAIMS["lemma"], "not reproduced",
        "held at 4 of 6 epochs of the 2 H-SCL runs (4 of 6 epochs over all runs).", "held at 4 of 6 epochs")


def test_ucl_crossing_counts_each_runs_pattern():
    # equal at epoch 1 counts as below; below-above-below is mixed
    crossing = run("hscl-tau", 0, loss_hscl=5.1, loss_ucl=[5.1, 5.2, 5.3])
    mixed = run("hscl-tau", 1, loss_hscl=5.1, loss_ucl=[5.0, 5.2, 5.0])
    assert claim([crossing, mixed], "crossing") == Verdict(CLAIMS["crossing"], "not reproduced",
        "L_UCL against L_HSCL over the epochs of the 2 H-SCL(τ) runs: below, then above: 1, mixed: 1.",
        "crossed in 1 of 2 runs")
    assert claim([crossing], "crossing").verdict == "reproduced"


def test_rows_without_scl_and_with_runs_of_different_lengths():
    one_epoch = rows([run("hscl-tau", 0, epochs=1, threshold=0.2, threshold_kept_fraction=0.5)])["hscl-tau"]
    assert one_epoch["epochs_to_scl_final_knn"] is None and one_epoch["views_per_second_after_epoch1"] is None
    assert (one_epoch["epochs"], one_epoch["kept_first"], one_epoch["kept_last"]) == (1, 0.5, 0.5)
    assert rows([run("ucl", 0, epochs=3), run("ucl", 1, epochs=2)])["ucl"]["epochs"] == 2


def test_thresholds_at_their_boundaries():
    """A threshold keeping 0.999 of the negatives keeps everything; losses 1e-3 apart train the same way."""
    keeps = rows([run("hscl-tau", 0, threshold=0.0, threshold_kept_fraction=[0.999, 1.0, 1.0])])
    assert keeps["hscl-tau"]["keeps_every_negative"]
    same = rows([run("scl", 0, train_loss=0.0), run("hscl-tau", 0, train_loss=1e-3)])
    assert same["hscl-tau"]["trains_as"] == "scl"


CIFAR100_ORDER = ("the paper's order on cifar100: H-SCL(β) 75.11 > H-SCL(τ) 72.97 > SCL 71.68 > H-UCL 67.77 > "
                  "UCL 64.02.")


def on(dataset, record):
    return {**record, "config": {"dataset": dataset}}


def test_ordering_waits_for_one_named_dataset_every_method_and_two_seeds():
    unnamed = Verdict(CLAIMS["ordering"], NOT_TESTABLE, "the runs do not all name one dataset (config.dataset).")
    assert claim([run("scl")], "ordering") == unnamed
    assert claim([on("cifar10", run("scl")), on("cifar100", run("ucl"))], "ordering") == unnamed
    assert claim([on("digits", run("scl"))], "ordering") == Verdict(
        CLAIMS["ordering"], NOT_TESTABLE, "the paper reports no digits results.")
    three = [on("cifar100", run(m)) for m in ("scl", "ucl", "hscl-beta")]
    assert claim(three, "ordering") == Verdict(CLAIMS["ordering"], NOT_TESTABLE,
                                               CIFAR100_ORDER + " No H-SCL(τ) or H-UCL run yet.")
    one_seed = [on("cifar100", run(m)) for m in ("scl", "ucl", "hscl-beta", "hscl-tau", "hucl")]
    one = claim(one_seed, "ordering")
    assert one.verdict == NOT_TESTABLE and one.evidence.endswith(
        "A paired interval needs at least 2 shared seeds for every neighbouring pair.")


def test_ordering_judges_each_neighbouring_pair_of_the_papers_order():
    """Mean accuracies 60, 58, 56, 54, 52 in the paper's order; each neighbouring pair's per-seed
    differences are 2.05, 2, 1.95: mean 2, sd 0.05, half-width t(0.975, 2) * 0.05 / sqrt(3) = 0.124."""
    order = ("hscl-beta", "hscl-tau", "scl", "hucl", "ucl")
    wiggle = (-0.05, 0.0, 0.05)
    records = [on("cifar100", run(m, s, top1=60.0 - 2 * i + (i * wiggle[s]))) for i, m in enumerate(order) for s in range(3)]
    held = claim(records, "ordering")
    assert held == Verdict(CLAIMS["ordering"], "reproduced", CIFAR100_ORDER + (
        " Measured means: H-SCL(β) 60.00 > H-SCL(τ) 58.00 > SCL 56.00 > H-UCL 54.00 > UCL 52.00; they fall in the "
        "paper's order. Neighbours in the paper's order, paired: H-SCL(β) minus H-SCL(τ) +2.00 [+1.88, +2.12]; "
        "H-SCL(τ) minus SCL +2.00 [+1.88, +2.12]; SCL minus H-UCL +2.00 [+1.88, +2.12]; H-UCL minus UCL +2.00 "
        "[+1.88, +2.12] (3 seeds). 4 of 4 intervals lie above 0."), "4 of 4 neighbour intervals above 0")
    # SCL and H-SCL(tau) swapped: the means leave the paper's order, that pair's interval lies below 0
    # and H-SCL(beta) minus H-SCL(tau), SCL minus H-UCL become +4 (still above 0)
    swapped = [on("cifar100", {**r, "method": {"scl": "hscl-tau", "hscl-tau": "scl"}.get(r["method"], r["method"])})
               for r in records]
    broken = claim(swapped, "ordering")
    assert broken.verdict == "not reproduced"
    assert "Measured means: H-SCL(β) 60.00 > SCL 58.00 > H-SCL(τ) 56.00 > H-UCL 54.00 > UCL 52.00; they do not " \
           "fall in the paper's order." in broken.evidence
    assert "H-SCL(τ) minus SCL -2.00 [-2.12, -1.88]" in broken.evidence
    assert broken.evidence.endswith("3 of 4 intervals lie above 0.")


def test_ordering_counts_an_interval_that_touches_zero_as_not_above():
    """H-UCL equal to UCL on every seed: that pair's interval is exactly [0, 0], which does not lie above 0."""
    tops = {"hscl-beta": 60.0, "hscl-tau": 58.0, "scl": 56.0, "hucl": 54.0, "ucl": 54.0}
    records = [on("cifar100", run(m, s, top1=t + s * 0.1)) for m, t in tops.items()
               for s in range(3)]
    verdict = claim(records, "ordering")
    assert "H-UCL minus UCL +0.00 [+0.00, +0.00]" in verdict.evidence
    assert verdict.verdict == "not reproduced" and verdict.evidence.endswith(" 3 of 4 intervals lie above 0.")
