"""The evidence tool (recipes/evidence.py, hscl_zoo.reproduction.evidence): its table holds the JSON
files' numbers, the docs blocks are what the committed files give, bad input is refused with the fix,
and (slow) a real run on two tiny digits encoders equals the protocols called directly."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import hscl_zoo
from hscl_zoo.evaluation import extract_features, knn_top1, linear_probe
from hscl_zoo.reproduction import evidence, report
from hscl_zoo.retrieval import retrieval_metrics

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- results:evidence-([\w-]+) -->\n(.*?)<!-- /results:evidence-\1 -->", re.S)


def load_driver():
    return load_script("recipes", "evidence")


def part(**fields):
    return {**fields, "seconds": 30.0, "commit": "abc123def4567890", "hardware": "CPU (test)"}


def record(method, recall, map_r, transfer=None, tuned=None, scratch=None):
    rows = {target: part(top1=t, knn_top1=k, retrieval={"map_at_r": m}, train_images=100, test_split="test",
                         protocol={"num_test": 40}) for target, (t, k, m) in (transfer or {}).items()}
    finetune = {} if tuned is None else {"2": part(
        dataset="digits", subset=200, epochs=2, seed=0,
        from_encoder={"top1": tuned, "total_steps": 6, "batch_size": 64, "test_images": 50, "test_split": "test"},
        from_scratch={"top1": scratch, "total_steps": 6, "batch_size": 64, "test_images": 50, "test_split": "test"})}
    return {"budget": "b", "method": method, "seed": 0, "trained_on": "digits", "transfer": rows, "finetune": finetune,
            "retrieval": {"metrics": {"recall_at_1": recall, "map_at_r": map_r}, "commit": None}}


def table_rows(text: str) -> dict[str, list[str]]:
    """The summary table's cells by method display name."""
    lines = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| method")]
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines)}


def test_table_cells_are_the_records_numbers():
    records = [record("hscl-beta", 61.234, 20.5, {"cifar10": (40.0, 38.125, 12.0)}, tuned=55.5, scratch=50.25),
               record("scl", 58.0, 19.996)]
    records[0]["probe"] = {"top1": 47.5, "knn_top1": 44.444, "commit": "fedcba9876543210"}
    text = evidence.render_summary("b", records)
    rows = table_rows(text)
    # method order is the method table's (SCL before H-SCL(beta)); a missing part is "-"
    assert list(rows) == ["SCL", "H-SCL(β)"]
    assert rows["SCL"] == ["0", "-", "-", "58.00", "20.00", "-", "-", "-", "-", "-", "-"]
    assert rows["H-SCL(β)"] == ["0", "47.50", "44.44", "61.23", "20.50", "40.00", "38.12", "12.00", "55.50", "50.25",
                                "+5.25"]
    assert "cifar10: linear top-1 (%)" in text and "2-epoch fine-tune from scratch (%)" in text
    assert "6 steps from the encoder" in text and "What one seed cannot show" in text
    assert "commit abc123def456, fedcba987654, not recorded" in text and "Measuring took 1.0 min" in text  # two measured parts of 30 s
    block = report.results_block(text)
    assert block.startswith("| method |") and block.rstrip().endswith("min in all.")


def test_reading_names_each_columns_ends_and_counts_fine_tuning_gains():
    """The generated sentences under the table, against values worked out by hand: ties at two
    decimals name both methods, a missing part is left out, and fine-tuning gains are counted by sign."""
    records = [record("ucl", 10.0, 1.004, {"cifar10": (40.0, 30.0, 5.0)}, tuned=50.0, scratch=52.5),
               record("scl", 12.5, 0.998, {"cifar10": (45.5, 33.0, 5.0)}, tuned=56.0, scratch=52.5),
               record("hscl-beta", 11.0, 2.0, {"cifar10": (44.0, 35.25, 7.5)}, tuned=54.0, scratch=52.5),
               record("hucl", 9.0, 1.5)]
    text = evidence.reading(records, ["cifar10"], [2])
    assert text.splitlines()[2:] == [
        "* own-data Recall@1: highest SCL (12.50), lowest H-UCL (9.00); a spread of 3.50 points.",
        "* own-data MAP@R: highest H-SCL(β) (2.00), lowest UCL and SCL (1.00); a spread of 1.00 points.",
        "* cifar10 linear top-1: highest SCL (45.50), lowest UCL (40.00); a spread of 5.50 points.",
        "* cifar10 kNN top-1: highest H-SCL(β) (35.25), lowest UCL (30.00); a spread of 5.25 points.",
        "* cifar10 MAP@R: highest H-SCL(β) (7.50), lowest UCL and SCL (5.00); a spread of 2.50 points.",
        "* 2-epoch fine-tune: from the encoder above from scratch for 2 of 3 methods, by -2.50 to +3.50 points.",
    ]
    assert evidence.reading([record("scl", 1.0, 1.0)], [], []) == ""  # one row: nothing to compare
    two_seeds = [record("scl", 1.0, 1.0), {**record("scl", 2.0, 1.0), "seed": 1}, record("ucl", 3.0, 1.0)]
    assert "* Seed 0, own-data Recall@1: highest UCL (3.00), lowest SCL (1.00)" in evidence.reading(two_seeds, [], [])
    assert evidence.reading(records, ["cifar10"], [2]) in evidence.render_summary("b", records)


def test_docs_blocks_are_what_the_evidence_files_give():
    """Each <!-- results:evidence-BUDGET --> block of docs/results.md quotes results/BUDGET/evidence/summary.md,
    which is what --summary-only renders from the JSON files (an empty block while there are none), and
    every committed evidence folder is quoted."""
    page = (ROOT / "docs" / "results.md").read_text()
    blocks = dict(BLOCK.findall(page))
    committed = {p.parent.parent.name for p in (ROOT / "results").glob("*/evidence/*.json")}
    assert committed <= set(blocks), f"evidence of {sorted(committed - set(blocks))} is quoted nowhere in docs/results.md"
    for budget, block in blocks.items():
        folder = ROOT / "results" / budget / "evidence"
        if budget not in committed:
            assert block.strip() == "", f"the evidence-{budget} block quotes numbers without a file under {folder}"
            continue
        text = evidence.render_summary(budget, [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))])
        assert text == (folder / "summary.md").read_text(), f"{folder}/summary.md is stale"
        assert report.quote_in_readme(page, f"evidence-{budget}", text) == page, (
            f"stale block: python recipes/evidence.py --budget {budget} --summary-only --readme docs/results.md")


def test_bad_input_is_refused_with_the_fix(tmp_path):
    driver = load_driver()
    with pytest.raises(SystemExit, match="no run of seed 0 under .* has its weights.*reproduce.py --budget tiny-digits"):
        driver.main(["--budget", "tiny-digits", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="holds no evidence file"):
        driver.main(["--budget", "tiny-digits", "--out", str(tmp_path), "--summary-only"])
    with pytest.raises(ValueError, match="cifar100 does not exist: put cifar100's parquet files there"):
        evidence.dataset_dir("cifar100", tmp_path)
    assert evidence.dataset_dir("digits", tmp_path) is None and evidence.dataset_dir("imagefolder:x", tmp_path) is None
    (tmp_path / "cifar10").mkdir()
    assert evidence.dataset_dir("cifar10", tmp_path) == str(tmp_path / "cifar10")


def _digits_folder(root: Path) -> Path:
    """Digits as PNG files in one folder per class: own data for the transfer protocol."""
    data = hscl_zoo.load_splits("digits", subset=200, seed=1)
    for i, row in enumerate(data.train):
        folder = root / data.class_names[row["label"]]
        folder.mkdir(parents=True, exist_ok=True)
        row["image"].save(folder / f"{i}.png")
    return root


def _top1(hub: Path, test) -> float:
    model = hscl_zoo.load(hub)
    probs = model.predict(list(test["image"]))
    return 100.0 * (probs.argmax(dim=1) == torch.tensor(test["label"])).float().mean().item()


@pytest.mark.slow
def test_tiny_evidence_equals_the_protocols_called_directly(tmp_path):
    out = tmp_path / "budget"
    load_script("recipes", "reproduce").main(["--budget", "tiny-digits", "--methods", "scl", "hscl-beta", "--seeds", "0",
                                              "--out", str(out)])
    runs = out / "runs"
    # hscl-beta's retrieval is measured again from its Hub folder; scl's is read from the recipe's file
    beta_eval_path = runs / "hscl-beta-s0" / "linear_eval.json"
    beta_eval = json.loads(beta_eval_path.read_text())
    beta_eval_path.write_text(json.dumps({k: v for k, v in beta_eval.items() if k != "retrieval"}))
    target = f"imagefolder:{_digits_folder(tmp_path / 'pngs')}"
    docs = tmp_path / "results.md"
    docs.write_text("# page\n\n<!-- results:evidence-tiny-digits -->\n<!-- /results:evidence-tiny-digits -->\n")
    args = ["--budget", "tiny-digits", "--out", str(out), "--transfer", target, "--finetune_epochs", "1",
            "--finetune_batch_size", "64"]
    text = load_driver().main([*args, "--readme", str(docs)])

    folder = out / "evidence"
    records = {m: json.loads((folder / f"{m}-s0.json").read_text()) for m in ("scl", "hscl-beta")}
    scl_eval = json.loads((runs / "scl-s0" / "linear_eval.json").read_text())
    assert records["scl"]["retrieval"]["metrics"] == scl_eval["retrieval"]
    assert (records["scl"]["probe"]["top1"], records["scl"]["probe"]["knn_top1"]) == (scl_eval["top1"], scl_eval["knn_top1"])
    assert records["scl"]["probe"]["commit"] == json.loads((runs / "scl-s0.json").read_text())["commit"]
    measured = records["hscl-beta"]["retrieval"]
    assert measured["source"] == "evaluate_model" and measured["commit"] and measured["seconds"] > 0
    for key, value in beta_eval["retrieval"].items():
        assert measured["metrics"][key] == pytest.approx(value, abs=1e-6), key

    data = hscl_zoo.load_splits(target)
    train_size = len(hscl_zoo.load_splits("digits", subset=200).train)
    test = hscl_zoo.load_splits("digits", subset=200).test
    for method, r in records.items():
        hub = runs / f"{method}-s0" / "hub"
        model = hscl_zoo.load(hub)
        train_f, train_y = extract_features(model.encode, data.train, model.transform, progress=False)
        test_f, test_y = extract_features(model.encode, data.test, model.transform, progress=False)
        row = r["transfer"][target]
        probe = linear_probe(train_f, train_y, test_f, test_y, num_classes=10, epochs=10, seed=0, progress=False)
        assert (row["top1"], row["top5"]) == pytest.approx((probe.top1, probe.top5))
        assert row["knn_top1"] == pytest.approx(knn_top1(train_f, train_y, test_f, test_y, k=20))
        assert row["retrieval"]["map_at_r"] == pytest.approx(retrieval_metrics(test_f, test_y, train_f, train_y)["map_at_r"])
        assert row["transfer"] and row["train_images"] == len(data.train)

        pair = r["finetune"]["1"]
        tuned, scratch = pair["from_encoder"], pair["from_scratch"]
        assert tuned["top1"] == pytest.approx(_top1(Path(tuned["output"]), test))
        assert scratch["top1"] == pytest.approx(_top1(Path(scratch["output"]), test))
        assert tuned["total_steps"] == scratch["total_steps"] == math.floor(train_size / 64) * 1
        assert tuned["head"] == scratch["head"] == "loaded" and tuned["model"] == str(hub)
        cells = table_rows(text)[evidence.display(method)]
        own = json.loads((runs / f"{method}-s0" / "linear_eval.json").read_text())
        assert cells == ["0", f"{own['top1']:.2f}", f"{own['knn_top1']:.2f}",
                         f"{r['retrieval']['metrics']['recall_at_1']:.2f}", f"{r['retrieval']['metrics']['map_at_r']:.2f}",
                         f"{row['top1']:.2f}", f"{row['knn_top1']:.2f}", f"{row['retrieval']['map_at_r']:.2f}",
                         f"{tuned['top1']:.2f}", f"{scratch['top1']:.2f}", f"{tuned['top1'] - scratch['top1']:+.2f}"]
    # both methods fine-tune against the one from-scratch run of the seed, which never saw the pretraining
    assert records["scl"]["finetune"]["1"]["from_scratch"] == records["hscl-beta"]["finetune"]["1"]["from_scratch"]
    scratch_start = load_file(folder / "scratch-s0" / "model.safetensors")
    trained = load_file(runs / "scl-s0" / "hub" / "model.safetensors")
    assert scratch_start.keys() == trained.keys()
    assert not torch.equal(scratch_start["backbone.conv1.weight"], trained["backbone.conv1.weight"])

    assert (folder / "summary.md").read_text() == text
    assert report.quote_in_readme(docs.read_text(), "evidence-tiny-digits", text) == docs.read_text()
    assert report.results_block(text) in docs.read_text()

    # a re-run measures nothing already measured: only the new target is added
    before = {m: (folder / f"{m}-s0.json").stat().st_mtime_ns for m in records}
    weights = Path(records["scl"]["finetune"]["1"]["from_encoder"]["output"]) / "model.safetensors"
    weights_time = weights.stat().st_mtime_ns
    load_driver().main(args)
    assert {m: (folder / f"{m}-s0.json").stat().st_mtime_ns for m in records} == before
    load_driver().main([*args[:5], f"{target},digits", *args[6:], "--methods", "scl"])
    again = json.loads((folder / "scl-s0.json").read_text())
    assert list(again["transfer"]) == [target, "digits"] and not again["transfer"]["digits"]["transfer"]
    assert {k: v for k, v in again.items() if k != "transfer"} == {k: v for k, v in records["scl"].items() if k != "transfer"}
    assert again["transfer"][target] == records["scl"]["transfer"][target]
    assert weights.stat().st_mtime_ns == weights_time
    (folder / "summary.md").unlink()
    summary = load_driver().main(["--budget", "tiny-digits", "--out", str(out), "--summary-only"])
    assert summary == (folder / "summary.md").read_text() and "digits: linear top-1" in summary
