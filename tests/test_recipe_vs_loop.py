"""The recipe against a bare loop (issue 37): the diagnostics cadence that closed most of the gap,
the epoch record that says which batches its diagnostics cover, the benchmark at toy size, and
the docs' quote of its committed result (benchmarks/results/recipe_vs_loop_cpu.json)."""

from __future__ import annotations

import json
import math
import re
import statistics

import pytest
import torch

from helpers import REPO, load_script, one_cpu_epoch
from test_docs_numbers import recipe_profile_quote, recipe_vs_loop_quote
from hscl_zoo.losses import build_loss
from hscl_zoo.losses.diagnostics import DiagnosticsMeter

RESULT = REPO / "benchmarks" / "results" / "recipe_vs_loop_cpu.json"
B, V, D, STEPS = 8, 2, 16, 5


def one_epoch(every: int) -> tuple[dict, list[tuple[torch.Tensor, torch.Tensor]]]:
    """One epoch of `train_epoch` over STEPS seeded batches of a linear encoder, diagnostics every
    `every` steps; returns the record and each step's (embeddings, labels) as the loss saw them."""
    torch.manual_seed(0)
    batches = [(torch.randn(B, V, 3), torch.arange(B) % 3, torch.arange(B)) for _ in range(STEPS)]
    model = torch.nn.Linear(3, D)
    outputs: list[torch.Tensor] = []

    def forward(x: torch.Tensor) -> torch.Tensor:
        outputs.append(model(x))
        return outputs[-1]

    record = one_cpu_epoch(batches, None, forward, torch.optim.SGD(model.parameters(), lr=0.1), build_loss("hscl-beta"),
                           diagnostics_every=every)
    return record, [(z.detach().view(B, V, D), labels) for z, (_, labels, _) in zip(outputs, batches)]


def test_an_epoch_record_names_its_cadence_and_its_diagnostics_cover_exactly_those_steps():
    """Steps 0, 2 and 4 of five with diagnostics_every 2: the record's diagnostics equal a meter
    fed those steps' embeddings, and the record says the cadence."""
    record, seen = one_epoch(every=2)
    assert record["diagnostics_every"] == 2
    assert record["diagnostics_anchors"] == 3 * B * V
    meter = DiagnosticsMeter(temperature=0.5, beta=1.0)
    for z, labels in seen[0::2]:
        meter.update(z, labels)
    expected = meter.compute()
    assert {k: record[k] for k in expected} == pytest.approx(expected, rel=1e-6, nan_ok=True)
    every_step, _ = one_epoch(every=1)
    assert every_step["diagnostics_every"] == 1 and every_step["diagnostics_anchors"] == STEPS * B * V


@pytest.mark.slow
def test_the_benchmark_runs_at_toy_size_and_writes_every_rerun(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    bench = load_script("benchmarks", "recipe_vs_loop")
    out = tmp_path / "bench.json"
    result = bench.main(["--dataset", "digits", "--subset", "64", "--batch-size", "16", "--reruns", "2",
                         "--slice-steps", "3", "--repeats", "1", "--threads", str(torch.get_num_threads()),
                         "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    steps = result["setting"]["steps_per_epoch"]
    assert steps == 4 and [r["rerun"] for r in result["runs"]] == [0, 1]
    for row in result["runs"]:
        for side in ("recipe", "bare"):
            assert sum(n for _, n in row["slices"][side]) == steps and max(n for _, n in row["slices"][side]) <= 3
        assert [n for _, n in row["slices"]["recipe"]] == [n for _, n in row["slices"]["bare"]]
    assert result["median"]["ratio"] == pytest.approx(statistics.median(r["ratio"] for r in result["runs"]), abs=1e-4)
    assert result["setting"]["diagnostics_every"] == 10
    assert result["breakdown"]["per_step"]["diagnostics_update_s"] > 0
    assert result["breakdown"]["profile_of_one_recipe_epoch"]["cumulative_seconds"]["DiagnosticsMeter.update"] > 0


def test_the_docs_quote_the_committed_result_and_it_meets_the_goal():
    """docs/benchmarks.md quotes the median ratio, its range and both views/s as the file has
    them; the file's own numbers are consistent (each rerun's ratio is its views/s ratio, the
    median is the median, each side's views/s is its slices' views over their seconds) and record
    the issue's goal, >= 0.95x."""
    run = json.loads(RESULT.read_text())
    page = " ".join((REPO / "docs" / "benchmarks.md").read_text().split())
    assert recipe_vs_loop_quote() in page and recipe_profile_quote() in page
    views_per_step = run["setting"]["batch_size"] * run["setting"]["views"]
    for row in run["runs"]:
        assert row["ratio"] == pytest.approx(row["recipe_views_per_s"] / row["bare_views_per_s"])
        for side in ("recipe", "bare"):
            steps, seconds = (sum(column) for column in zip(*((n, t) for t, n in row["slices"][side])))
            assert steps == run["setting"]["steps_per_epoch"]
            assert row[f"{side}_views_per_s"] == pytest.approx(steps * views_per_step / seconds, rel=1e-3)
    ratios = [r["ratio"] for r in run["runs"]]
    assert run["median"]["ratio"] == pytest.approx(statistics.median(ratios), abs=1e-4)
    assert run["median"]["ratio"] >= 0.95 and len(ratios) >= 5
    assert run["setting"]["torch_threads"] == 2 and run["setting"]["train_images"] == 5000
    assert run["setting"]["batch_size"] == 256 and run["setting"]["num_workers"] == 0
    assert re.fullmatch(r"[0-9a-f]{40}", run["git_commit"]), "measured from a committed tree"
    assert not math.isnan(run["median"]["recipe_views_per_s"])
