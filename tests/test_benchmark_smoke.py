"""The README's GPU measuring commands run end to end on the CPU at toy sizes, so that a GPU
session spends its minutes measuring rather than fixing an argument or a code path: the throughput
benchmark's default mode (plain and fast configurations, every stage, the JSON file), its
loss-memory mode, and the loss benchmark with several calls per synchronisation; and the queue-collapse
watch on the embedded digits."""

import json

import pytest

from helpers import REPO, load_script


def test_train_throughput_default_mode_plain_and_fast(tmp_path):
    bench = load_script("benchmarks", "train_throughput")
    out = tmp_path / "throughput.json"
    bench.main(["--device", "cpu", "--backbones", "resnet18", "--stems", "small", "--losses", "hscl-beta",
                "--batch-size", "4", "--steps", "1", "--warmup", "1", "--workers", "0", "--rows", "16",
                "--channels-last", "--fused-optim", "--gpu-augment", "--cache",
                "--data-dir", str(REPO / "no-such-folder"), "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert {r["config"] for r in rows} == {"plain", "fast (channels-last, fused-optim, gpu-augment, cache)"}
    assert all(r["img_per_s"] > 0 for r in rows)
    assert sorted(r["stage"] for r in rows) == sorted(["data", "compute", "e2e"] * 2)


def test_train_throughput_loss_memory_on_the_cpu(tmp_path):
    bench = load_script("benchmarks", "train_throughput")
    out = tmp_path / "memory.json"
    bench.main(["--loss-memory", "--device", "cpu", "--losses", "scl", "--memory-batches", "16", "--json", str(out)])
    rows = json.loads(out.read_text())["loss_memory"]
    assert [r["loss"] for r in rows] == ["calibration", "floor", "scl"] and all(r["N"] == 32 for r in rows)


def test_loss_bench_with_several_calls_per_synchronisation(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # its sibling modules, as when run as a script
    bench = load_script("benchmarks", "loss_bench")
    out = tmp_path / "loss.json"
    assert bench.main(["--batch-sizes", "8", "--threads", "1", "--reruns", "1", "--repeats", "1", "--warmup", "1",
                       "--iters-per-sync", "3", "--reference-max-batch", "0", "--json", str(out)]) == 0
    run = json.loads(out.read_text())
    assert run["cells"] and all(t > 0 for cell in run["cells"] for t in cell["median_s"].values())


@pytest.mark.slow  # two short training runs on digits: over 20 s on two cores
def test_queue_collapse_watch_on_digits(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    watch = load_script("benchmarks", "queue_collapse")
    out = watch.main(["--dataset", "digits", "--steps", "2", "--every", "1", "--json", str(tmp_path / "q.json")])
    assert list(out["steps"]) == list(watch.VARIANTS) and all(len(rows) == 2 for rows in out["steps"].values())
    first = {name: rows[0]["batch_median_cos"] for name, rows in out["steps"].items()}
    assert first["batch 64"] == first["batch 64 + 384-row queue"], "same initialisation and first batch"
    assert "queue_median_cos" in out["steps"]["batch 64 + 384-row queue"][1]
    assert json.loads((tmp_path / "q.json").read_text())["table"] == out["table"]
