"""Studies (hscl_zoo.reproduction.studies, recipes/study.py): the table is well formed, verdicts
follow from the paired differences, committed summaries are what the run files give."""

import json
from pathlib import Path

import pytest
import torch

from hscl_zoo.reproduction import report
from hscl_zoo.reproduction.studies import STUDIES, Comparison, Study, Variant, check_study
from hscl_zoo.reproduction.study_report import judge, render_study

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]


def load_driver():
    return load_script("recipes", "study")


def runs(**top1_per_seed):
    return {name: [{"seed": s, "top1": t} for s, t in enumerate(values)] for name, values in top1_per_seed.items()}


@pytest.mark.parametrize("study, message", [
    (Study("x", "no-such-budget", "q", (), ()), "unknown budget"),
    (Study("x", "tiny-digits", "q", (Variant("a", "d", {"method": "scl"}),) * 2, ()), "duplicate variant"),
    (Study("x", "tiny-digits", "q", (Variant("a", "d", {"method": "scl"}),), (Comparison("c", "a", "b"),)),
     "names a variant not in"),
    (Study("x", "tiny-digits", "q", (Variant("a", "d", {"batch_size": 8}),), ()), "either settings with a method"),
    (Study("x", "tiny-digits", "q", (Variant("a", "d", {"method": "scl"}, budget_method="scl"),), ()),
     "not both or neither"),
    (Study("x", "tiny-digits", "q", (Variant("a", "d", {"method": "ucl"}, probe={"labelled_fraction": 0.1}),), ()),
     "probe settings re-evaluate the budget's run"),
    (Study("x", "tiny-digits", "q", (Variant("a", "d", budget_method="ucl", probe={"knn_k": 5}),), ()),
     r"probe keys \['knn_k'\] are not among labelled_fraction"),
    (Study("x", "tiny-digits", "q", (Variant("a", "d", budget_method="scl", probe={"labelled_fraction": 0.1}),), ()),
     "scl reads labels in training"),
])
def test_ill_formed_studies_are_refused(study, message):
    with pytest.raises(ValueError, match=message):
        check_study(study)


def test_declared_studies_name_real_config_keys():
    from hscl_zoo.training.config import PretrainConfig

    keys = set(PretrainConfig.__dataclass_fields__)
    for study in STUDIES.values():
        for v in study.variants:
            assert set(v.settings) <= keys, (study.name, v.name, set(v.settings) - keys)


def test_beats_needs_the_interval_on_its_side():
    claim = Comparison("a beats b", "a", "b")
    assert judge(claim, runs(a=[52, 53, 51], b=[50, 51, 49])).verdict == "holds"
    assert judge(claim, runs(a=[48, 49, 47], b=[50, 51, 49])).verdict == "does not hold"
    assert judge(claim, runs(a=[53, 49, 51], b=[50, 51, 49])).verdict == "undecided"
    one = judge(claim, runs(a=[51], b=[50]))
    assert one.verdict == "holds (1 seed)" and "+1.00 points (1 seed, no interval)" in one.evidence
    assert judge(claim, runs(a=[49], b=[50])).verdict == "does not hold (1 seed)"


def test_matches_needs_the_interval_inside_the_margin():
    claim = Comparison("a matches b", "a", "b", "matches", margin=1.0)
    assert judge(claim, runs(a=[50.2, 50.1, 50.3], b=[50, 50, 50])).verdict == "holds"
    assert judge(claim, runs(a=[53, 53.5, 52.5], b=[50, 50, 50])).verdict == "does not hold"
    assert judge(claim, runs(a=[51, 49, 50.5], b=[50, 50, 50])).verdict == "undecided"
    assert judge(claim, runs(a=[51.5], b=[50])).verdict == "does not hold (1 seed)"


def test_a_claim_without_runs_is_not_measured_and_says_which():
    claim = Comparison("a beats b", "a", "b")
    verdict = judge(claim, runs(a=[51]))
    assert verdict.verdict == "not measured yet" and "no finished run of b" in verdict.evidence
    assert judge(claim, {"a": [{"seed": 0, "top1": 1.0}], "b": [{"seed": 1, "top1": 1.0}]}).evidence == \
        "no seed run by both."


def test_the_table_shows_how_far_apart_the_negatives_are_and_a_dash_without_diagnostics():
    """The column that shows a collapse (the negatives' median cosine near 1) is the seeds' mean of
    the first and the last epoch's neg_cos_q50; runs without diagnostics get '-'."""
    study = Study("x", "tiny-digits", "q", (Variant("a", "d", {"method": "scl"}), Variant("b", "d", {"method": "ucl"})), ())
    history = [{"neg_cos_q50": 0.9}, {"neg_cos_q50": 0.5}], [{"neg_cos_q50": 0.7}, {"neg_cos_q50": 0.99}]
    a = [{"seed": s, "top1": 50.0, "top5": 90.0, "knn_top1": 40.0, "train_seconds": 60.0, "hardware": "cpu",
          "history": h} for s, h in enumerate(history)]
    b = [dict(a[0], history=[{"train_loss": 1.0}])]
    text = render_study(study, {"a": a, "b": b})
    assert "| 0.800 -> 0.745 | 1.0 |" in text
    assert "| 40.00 ± 0.00 | - | 1.0 |" in text


COMMITTED = sorted(p.name for p in (ROOT / "results" / "studies").glob("*") if (p / "summary.md").is_file())


def test_every_committed_study_is_declared():
    assert COMMITTED, "results/studies holds no study; the summary test below would check nothing"
    assert set(COMMITTED) <= set(STUDIES)


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_study_summaries_are_what_the_run_files_give(name, tmp_path):
    """results/studies/<name>/summary.md and the docs/results.md block equal what --summary-only renders."""
    driver = load_driver()
    committed = ROOT / "results" / "studies" / name
    (tmp_path / "runs").mkdir()
    for path in (committed / "runs").glob("*.json"):
        (tmp_path / "runs" / path.name).write_text(path.read_text())
    budget_out = ROOT / "results" / STUDIES[name].budget
    text = driver.main(["--study", name, "--summary-only", "--out", str(tmp_path), "--budget-out", str(budget_out)])
    assert text == (committed / "summary.md").read_text()
    readme = (ROOT / "docs" / "results.md").read_text()
    assert report.quote_in_readme(readme, name, text) == readme, (
        f"docs/results.md's results:{name} block is stale: python recipes/study.py --study {name} --summary-only --readme docs/results.md")


def test_an_unknown_variant_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="has no variant b512; its variants: scl, scl-queue"):
        load_driver().main(["--study", "tiny-queue", "--variants", "b512", "--out", str(tmp_path)])


@pytest.mark.slow
def test_tiny_study_trains_its_variants_reuses_the_budget_run_and_skips_finished_ones(tmp_path):
    driver = load_driver()
    args = ["--study", "tiny-queue", "--out", str(tmp_path / "study"), "--budget-out", str(tmp_path / "budget")]
    text = driver.main(args)
    budget_run = tmp_path / "budget" / "runs" / "scl-s0.json"
    own_run = tmp_path / "study" / "runs" / "scl-queue-s0.json"
    record = json.loads(own_run.read_text())
    assert (record["study"], record["variant"], record["method"], record["config"]["queue_size"]) == \
        ("tiny-queue", "scl-queue", "scl", 64)
    assert json.loads(budget_run.read_text())["config"]["queue_size"] == 0
    assert "| scl-queue | SCL with a 64-row queue | 1 |" in text and "**The queue helps SCL: " in text
    ucl = json.loads((tmp_path / "budget" / "runs" / "ucl-s0.json").read_text())
    probed_run = tmp_path / "study" / "runs" / "ucl-fifth-s0.json"
    probed = json.loads(probed_run.read_text())
    assert probed["history"] == ucl["history"] and probed["config"] == ucl["config"]
    assert probed["probe_of"] == "results/tiny-digits/runs/ucl-s0.json" and probed["probe"] == {"labelled_fraction": 0.2}
    assert probed["probe_protocol"]["num_train"] == 40 == ucl["probe_protocol"]["num_train"] // 5
    stamps = [p.stat().st_mtime_ns for p in (budget_run, own_run, probed_run)]
    assert driver.main(args) == text
    assert [p.stat().st_mtime_ns for p in (budget_run, own_run, probed_run)] == stamps, "finished runs must be skipped"


@pytest.mark.slow
def test_ucl_trains_the_same_weights_whatever_part_of_the_labels_it_is_given(tmp_path):
    """Why a study may probe the budget's UCL run again with fewer labels instead of training it
    again (PROBE_KEYS): UCL reads no label, so labelled_fraction changes nothing in its training."""
    from safetensors.torch import load_file

    pretrain = load_script("recipes", "pretrain")
    tiny = ["--method", "ucl", "--epochs", "2", "--subset", "200", "--batch_size", "32", "--backbone", "resnet10t",
            "--probe_epochs", "2", "--monitor_train_size", "100"]
    for name, fraction in (("all", "1"), ("fifth", "0.2")):
        pretrain.main([*tiny, "--labelled_fraction", fraction, "--output_dir", str(tmp_path / name)])
    weights = [load_file(next((tmp_path / name / "hub").glob("*.safetensors"))) for name in ("all", "fifth")]
    assert weights[0].keys() == weights[1].keys()
    differ = sorted(k for k in weights[0] if not torch.equal(weights[0][k], weights[1][k]))
    assert differ == ["classifier.bias", "classifier.weight"], differ  # only the linear probe, fitted on other labels
