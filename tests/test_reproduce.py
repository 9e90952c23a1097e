"""recipes/reproduce.py: a real tiny sweep, and a summary that is recomputed from the run files."""

import csv
import importlib.util
import json
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_driver():
    spec = importlib.util.spec_from_file_location("reproduce_recipe", ROOT / "recipes" / "reproduce.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(method, seed, top1, knn_curve, assumption, hscl_le_hucl=True):
    history = [{"epoch": e + 1, "knn_top1": k, "assumption_fraction": assumption, "epoch_seconds": 1.0,
                "loss_ucl": 5.0, "loss_scl": 4.9, "loss_hucl": 5.2, "loss_hscl": 5.1 if hscl_le_hucl else 5.3}
               for e, k in enumerate(knn_curve)]
    return {"method": method, "seed": seed, "top1": top1, "top5": top1 + 10, "knn_top1": knn_curve[-1],
            "history": history, "train_seconds": 60.0 * len(knn_curve)}


def test_summary_follows_the_records():
    driver = load_driver()
    records = [
        record("scl", 0, 50.0, [30, 40, 50], 0.9), record("scl", 1, 54.0, [32, 42, 52], 0.8),
        record("hscl-beta", 0, 60.0, [45, 55, 60], 0.95), record("hscl-beta", 1, 58.0, [40, 49, 58], 0.97, False),
    ]
    rows = {r["method"]: r for r in driver.summarise(records)}
    assert rows["scl"]["top1_mean"] == 52.0 and rows["scl"]["top1_std"] == pytest.approx(statistics.stdev([50, 54]))
    assert rows["hscl-beta"]["epochs_to_scl_final_knn"] == 2  # mean curve 42.5, 52 reaches SCL's final 51
    assert rows["scl"]["epochs_to_scl_final_knn"] == 3
    assert rows["hscl-beta"]["assumption_fraction_last"] == pytest.approx(0.96)
    assert rows["scl"]["lemma_hscl_le_hucl_every_epoch"] and not rows["hscl-beta"]["lemma_hscl_le_hucl_every_epoch"]


@pytest.mark.slow
def test_tiny_sweep_writes_a_complete_table_and_skips_finished_runs(tmp_path):
    driver = load_driver()
    args = ["--budget", "tiny-digits", "--methods", "scl", "hscl-beta", "--seeds", "0", "1", "--out", str(tmp_path)]
    driver.main(args)
    runs = sorted((tmp_path / "runs").glob("*.json"))
    assert [p.stem for p in runs] == ["hscl-beta-s0", "hscl-beta-s1", "scl-s0", "scl-s1"]
    records = [json.loads(p.read_text()) for p in runs]
    with (tmp_path / "summary.csv").open() as f:
        table = {row["method"]: row for row in csv.DictReader(f)}
    for method in ("scl", "hscl-beta"):
        top1 = [r["top1"] for r in records if r["method"] == method]
        assert float(table[method]["top1_mean"]) == pytest.approx(statistics.fmean(top1))
        assert float(table[method]["top1_std"]) == pytest.approx(statistics.stdev(top1))
        assert int(table[method]["seeds"]) == 2
    summary = (tmp_path / "summary.md").read_text()
    assert "| scl |" in summary and "| hscl-beta |" in summary
    for name in ("fig1_accuracy.png", "fig4_assumption.png", "fig5_losses.png"):
        assert (tmp_path / "figures" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stamps = {p: p.stat().st_mtime_ns for p in runs}
    driver.main(args)
    assert {p: p.stat().st_mtime_ns for p in runs} == stamps, "finished runs must be skipped"
