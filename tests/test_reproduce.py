"""The reproduction driver and its evidence: tables, paired statistics and verdicts recomputed
from run files, the H-SCL(tau) threshold read from SCL's measured negatives, a real tiny sweep."""

import csv
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from scipy.stats import t as student_t

from hscl_zoo.reproduction import budgets, claims_table, report, summary
from hscl_zoo.reproduction.statistics import paired_difference

from helpers import PNG_SIGNATURE, load_script

ROOT = Path(__file__).resolve().parents[1]


def load_driver():
    return load_script("recipes", "reproduce")


def record(method, seed, top1, knn_curve, assumption, hscl_le_hucl=True, ucl=5.0, train_loss=None, kept=None):
    assumption = assumption if isinstance(assumption, list) else [assumption] * len(knn_curve)
    history = []
    for e, k in enumerate(knn_curve):
        h = {"epoch": e + 1, "knn_top1": k, "assumption_fraction": assumption[e], "epoch_seconds": 1.0,
             "views_per_second": 100.0 + e, "train_loss": (train_loss or 6.0 - 0.1 * e) + 0.01 * seed,
             "loss_ucl": ucl[e] if isinstance(ucl, list) else ucl, "loss_scl": 4.9, "loss_hucl": 5.2,
             "loss_hscl": 5.1 if hscl_le_hucl else 5.3, "neg_cos_q50": 0.1 - 0.05 * e, "neg_cos_q75": 0.3 - 0.04 * e}
        if kept is not None:
            h.update(threshold=-0.1 + 0.1 * e, threshold_kept_fraction=kept[e])
        history.append(h)
    return {"method": method, "seed": seed, "top1": top1, "top5": top1 + 10, "knn_top1": knn_curve[-1],
            "history": history, "train_seconds": 60.0 * len(knn_curve), "hardware": "CPU (test)"}


def verdict(records, start):
    return next(v for v in summary.verdicts(records) if v.claim.startswith(start))


def test_paired_difference_is_the_t_interval_of_per_seed_differences():
    diff = paired_difference({0: 60.0, 1: 58.0, 2: 61.0, 5: 1.0}, {0: 50.0, 1: 54.0, 2: 52.0})
    d = [10.0, 4.0, 9.0]
    half = student_t.ppf(0.975, 2) * statistics.stdev(d) / 3 ** 0.5
    assert diff.seeds == (0, 1, 2) and diff.mean == pytest.approx(statistics.fmean(d))
    assert (diff.low, diff.high) == pytest.approx((diff.mean - half, diff.mean + half))
    single = paired_difference({0: 1.0}, {0: 3.0})
    assert single.mean == -2.0 and single.low is None and "1 seed" in single.describe()
    assert paired_difference({0: 1.0}, {1: 1.0}) is None


def test_rows_follow_the_records():
    records = [
        record("scl", 0, 50.0, [30, 40, 50], 0.9), record("scl", 1, 54.0, [32, 42, 52], 0.8),
        record("hscl-beta", 0, 60.0, [45, 55, 60], 0.95), record("hscl-beta", 1, 58.0, [40, 49, 58], 0.97, False),
    ]
    rows = {r["method"]: r for r in summary.method_rows(records)}
    assert rows["scl"]["top1_mean"] == 52.0 and rows["scl"]["top1_std"] == pytest.approx(statistics.stdev([50, 54]))
    assert rows["hscl-beta"]["top1_minus_scl"] == pytest.approx(7.0)  # (10 + 4) / 2
    assert rows["hscl-beta"]["epochs_to_scl_final_knn"] == 2  # mean curve 42.5, 52 reaches SCL's final 51
    assert rows["scl"]["epochs_to_scl_final_knn"] == 3
    assert rows["hscl-beta"]["assumption_last"] == pytest.approx(0.96)
    assert rows["scl"]["lemma_hscl_le_hucl_every_epoch"] and not rows["hscl-beta"]["lemma_hscl_le_hucl_every_epoch"]
    assert rows["scl"]["views_per_second_after_epoch1"] == 101.5  # epoch 1 (warm-up) left out


def test_verdicts_decide_by_the_stated_rules():
    scl = [record("scl", s, 50.0 + s, [30, 40, 50], 0.9) for s in range(3)]
    ahead = [record("hscl-beta", s, 53.0 + s + 0.1 * s * s, [45, 51, 55], [0.96, 0.97, 0.98]) for s in range(3)]
    assert verdict(scl + ahead, "H-SCL(β) beats SCL").verdict == "reproduced"
    tied = [record("hscl-beta", s, 50.0 + s + (1 if s == 1 else -1), [30, 40, 50], 0.94) for s in range(3)]
    assert verdict(scl + tied, "H-SCL(β) beats SCL").verdict == "not reproduced"
    assert "across 0" in verdict(scl + tied, "H-SCL(β) beats SCL").evidence
    assert verdict(scl[:1] + ahead[:1], "H-SCL(β) beats SCL").verdict == "not testable at this budget"
    assert verdict(scl, "H-SCL(β) beats UCL").verdict == "not testable at this budget"
    # 3 epochs: a quarter of them is 0 -> at least 1; hscl-beta's mean curve reaches 50 at epoch 2 only
    assert verdict(scl + ahead, "H-SCL(β) reaches").verdict == "not reproduced"
    assert verdict(scl + ahead, "Assumption 1").verdict == "reproduced"
    assert verdict(scl + tied, "Assumption 1").verdict == "not reproduced"
    assert verdict(scl + ahead, "L_HSCL <= L_HUCL").verdict == "reproduced"


def test_crossing_and_disguise_are_read_from_the_histories():
    scl = [record("scl", 0, 50.0, [30, 40, 50], 0.9)]
    crossing = record("hscl-tau", 0, 51.0, [30, 40, 50], 0.9, ucl=[5.0, 5.2, 5.3], train_loss=7.0, kept=[0.5, 0.4, 0.3])
    assert verdict(scl + [crossing], "L_UCL is below").verdict == "reproduced"
    above = record("hscl-tau", 0, 51.0, [30, 40, 50], 0.9, ucl=5.5, kept=[1.0, 1.0, 1.0])
    assert verdict(scl + [above], "L_UCL is below").verdict == "not reproduced"
    rows = {r["method"]: r for r in summary.method_rows(scl + [above])}
    assert rows["hscl-tau"]["trains_as"] == "scl" and rows["scl"]["trains_as"] is None
    assert rows["hscl-tau"]["keeps_every_negative"]
    rows = {r["method"]: r for r in summary.method_rows(scl + [crossing])}
    assert rows["hscl-tau"]["trains_as"] is None and not rows["hscl-tau"]["keeps_every_negative"]
    text = report.render_markdown("b", "d", {"dataset": "cifar10"}, scl + [above], {})
    assert "H-SCL(τ) is SCL in disguise" in text and "keeps every negative" in text


def test_threshold_schedule_comes_from_the_scl_run(tmp_path):
    with pytest.raises(ValueError, match="run scl for this seed first"):
        budgets.threshold_schedule(tmp_path, 0)
    (tmp_path / "scl-s0.json").write_text(json.dumps(record("scl", 0, 50.0, [30, 40, 50], 0.9)))
    # neg_cos_q50 at epoch 1 is 0.1, neg_cos_q75 at epoch 3 is 0.3 - 0.08
    assert budgets.threshold_schedule(tmp_path, 0) == {"threshold_start": 0.1, "threshold_end": 0.22}
    cifar10 = budgets.BUDGETS["cpu-cifar10-10k"]
    assert budgets.method_settings(cifar10, tmp_path, "hscl-beta", 0) == {}


@pytest.mark.parametrize("budget, classes", [("cpu-cifar10-10k", 10), ("cpu-cifar100-10k", 100),
                                             ("cpu-tinyimagenet-20k", 200)])
def test_hucl_class_prior_is_one_over_the_class_count(budget, classes, tmp_path):
    settings = budgets.run_settings(budgets.BUDGETS[budget], tmp_path, "hucl", 0, None)
    assert settings["tau_plus"] == pytest.approx(1 / classes)


@pytest.mark.parametrize("budget", sorted(p.name for p in (ROOT / "results").iterdir() if (p / "runs").is_dir()))
def test_committed_summaries_are_what_the_run_files_give(budget, tmp_path):
    """summary.md in results/<budget> is exactly what --summary-only renders from its runs/*.json."""
    driver = load_driver()
    committed = ROOT / "results" / budget
    (tmp_path / "runs").mkdir()
    for path in (committed / "runs").glob("*.json"):
        (tmp_path / "runs" / path.name).write_text(path.read_text())
    text = driver.main(["--budget", budget, "--summary-only", "--out", str(tmp_path)])
    assert text == (committed / "summary.md").read_text()
    readme = (ROOT / "docs" / "results.md").read_text()
    assert report.quote_in_readme(readme, budget, text) == readme, (
        f"docs/results.md's results:{budget} block is stale: python recipes/reproduce.py --budget {budget} --summary-only --readme docs/results.md")


@pytest.mark.parametrize("page", ["README.md", "docs/results.md"])
def test_the_claims_table_each_page_quotes_is_what_the_run_files_give(page):
    """One claims x budgets table, between `<!-- results:claims -->` markers, rebuilt from every
    committed budget's runs/*.json, its headers linking from the page to each summary.md."""
    path = ROOT / page
    text = path.read_text()
    table = claims_table.page_table(ROOT / "results", path)
    assert report.replace_block(text, "claims", table) == text, (
        f"{page}'s results:claims table is stale (or missing): python recipes/reproduce.py --budget cpu-cifar10-10k "
        f"--summary-only --readme {page}")
    committed = sorted(p.name for p in (ROOT / "results").iterdir() if (p / "runs").is_dir())
    header = table.splitlines()[0]
    assert all(f"[`{name}`]" in header for name in committed)
    for target in re.findall(r"\]\(([^)]+/summary\.md)\)", header):
        assert (path.parent / target).is_file(), target
    assert "<!-- results:headline-" not in text, "the per-budget paragraphs gave way to the one table"


def test_readme_option_fills_whichever_blocks_a_page_has_and_refuses_a_page_with_none(tmp_path):
    driver = load_driver()
    out = tmp_path / "tiny-digits"
    (out / "runs").mkdir(parents=True)
    for seed, (scl, beta) in enumerate([(50.0, 53.0), (52.0, 56.0)]):
        for method, top1 in (("scl", scl), ("hscl-beta", beta)):
            (out / "runs" / f"{method}-s{seed}.json").write_text(
                json.dumps(record(method, seed, top1, [30, 40, 50], 0.9)))
    page = tmp_path / "page.md"
    page.write_text("# page\n")
    with pytest.raises(SystemExit, match="no <!-- results:tiny-digits --> or <!-- results:claims --> block"):
        driver.main(["--budget", "tiny-digits", "--summary-only", "--out", str(out), "--readme", str(page)])
    assert page.read_text() == "# page\n"
    page.write_text("a\n<!-- results:claims -->\nold\n<!-- /results:claims -->\nb\n")
    driver.main(["--budget", "tiny-digits", "--summary-only", "--out", str(out), "--readme", str(page)])
    # differences +3 and +4 (2 seeds) leave an interval across 0: H-SCL(beta) beats SCL is "not reproduced"
    lines = page.read_text().splitlines()
    assert lines[:3] == ["a", "<!-- results:claims -->", "| claim | [`tiny-digits`](tiny-digits/summary.md) |"]
    assert "| H-SCL(β) beats SCL in linear-probe top-1 | **not reproduced**: +3.50 [-2.85, +9.85], 2 seeds |" in lines
    assert lines[-2:] == ["<!-- /results:claims -->", "b"]


@pytest.mark.slow
def test_tiny_sweep_writes_a_complete_table_and_skips_finished_runs(tmp_path):
    driver = load_driver()
    args = ["--budget", "tiny-digits", "--methods", "scl", "hscl-tau", "--seeds", "0", "1", "--out", str(tmp_path)]
    driver.main(args)
    runs = sorted((tmp_path / "runs").glob("*.json"))
    assert [p.stem for p in runs] == ["hscl-tau-s0", "hscl-tau-s1", "scl-s0", "scl-s1"]
    records = [json.loads(p.read_text()) for p in runs]
    for r in records:
        if r["method"] == "hscl-tau":
            scl = next(x for x in records if x["method"] == "scl" and x["seed"] == r["seed"])
            expected = budgets.threshold_schedule(tmp_path / "runs", r["seed"])
            assert r["config"]["threshold_start"] == expected["threshold_start"]
            assert r["config"]["threshold_end"] == expected["threshold_end"]
            assert expected["threshold_start"] == round(scl["history"][0]["neg_cos_q50"], 2)
            assert all(0 <= h["threshold_kept_fraction"] <= 1 for h in r["history"])
    with (tmp_path / "summary.csv").open() as f:
        table = {row["method"]: row for row in csv.DictReader(f)}
    for method in ("scl", "hscl-tau"):
        top1 = [r["top1"] for r in records if r["method"] == method]
        assert float(table[method]["top1_mean"]) == pytest.approx(statistics.fmean(top1))
        assert int(table[method]["seeds"]) == 2
    text = (tmp_path / "summary.md").read_text()
    assert "| SCL |" in text and "| H-SCL(τ) |" in text and "what the threshold kept" in text
    for name in ("fig1_accuracy.png", "fig4_assumption.png", "fig5_losses.png", "fig_threshold.png"):
        assert (tmp_path / "figures" / name).read_bytes()[:8] == PNG_SIGNATURE
    stamps = {p: p.stat().st_mtime_ns for p in runs}
    driver.main(args)
    assert {p: p.stat().st_mtime_ns for p in runs} == stamps, "finished runs must be skipped"


def test_the_production_tables_hold_documented_budgets_and_studies_only():
    """A fresh interpreter (no test fixture registered anything) lists the budgets and studies a
    user gets; each has its own heading or row on the results page, and none is the suite's."""
    listed = subprocess.run(
        [sys.executable, "-c", "from hscl_zoo.reproduction.budgets import BUDGETS; "
                               "from hscl_zoo.reproduction.studies import STUDIES; "
                               "print(' '.join(BUDGETS)); print(' '.join(STUDIES))"],
        capture_output=True, text=True, check=True, cwd=ROOT).stdout.splitlines()
    budget_names, study_names = listed[0].split(), listed[1].split()
    page = (ROOT / "docs" / "results.md").read_text()
    table = {line.split("|")[1].strip().split()[0].strip("`") for line in page.splitlines() if line.startswith("| `")}
    headings = {line.lstrip("# ").split()[0] for line in page.splitlines() if line.startswith("#")}
    assert set(budget_names) == table and set(study_names) <= headings
    assert not {"tiny-digits", "tiny-queue"} & set(budget_names + study_names)
