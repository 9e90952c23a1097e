"""The GPU sprint's planner (benchmarks/sprint_plan.py): from what exists, the missing gpu-cifar10
runs in the issue's order, two side by side, H-SCL(tau) only after its seed's SCL, nothing redone,
and the call's time budget (a pair must fit; the checks need four minutes)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import REPO, load_script

plan = load_script("benchmarks", "sprint_plan")
COSTS = plan.Costs(pair=500.0, release=100.0, checks={"step-parity": 30.0, "loss-memory": 240.0})
COMMITTED = plan.State(frozenset({"scl-s0", "hscl-beta-s0"}))
ALL_RUNS = {f"{m}-s{s}" for m in ("ucl", "hucl", "scl", "hscl-beta", "hscl-tau") for s in (0, 1, 2)}


def test_the_first_call_trains_ucl_and_hucl_seed_0_side_by_side_and_releases_both():
    item = plan.next_item(COMMITTED, COSTS, elapsed=0)
    assert item.kind == "train" and item.runs == ("ucl-s0", "hucl-s0")
    assert item.releases == ("ucl-cifar10.gpu-30ep", "hucl-cifar10.gpu-30ep")
    assert item.must_fit == 500 and item.seconds == 600
    assert plan.plan(COMMITTED, COSTS) == [item]  # 40 s are left after it: no second pair, no checks


def test_the_calls_train_every_missing_run_once_in_the_issues_order_then_the_checks():
    calls = plan.plan_calls(COMMITTED, COSTS)
    runs = [run for items in calls for item in items for run in item.runs]
    assert runs[:3] == ["ucl-s0", "hucl-s0", "hscl-tau-s0"]
    assert sorted(runs) == sorted(ALL_RUNS - COMMITTED.runs)  # each missing run once, no finished one again
    assert all(run.endswith(("-s1", "-s2")) for run in runs[3:])
    assert runs.index("hscl-tau-s1") > runs.index("scl-s1") and runs.index("hscl-tau-s2") > runs.index("scl-s2")
    assert [item.check for item in calls[-1]] == ["step-parity", "loss-memory"]
    later = [item for items in calls[2:] for item in items if item.kind == "train"]
    assert later and all(item.seconds == COSTS.pair and not item.releases for item in later)  # only seed 0 releases
    assert not plan.plan(plan.State(frozenset(ALL_RUNS), frozenset(plan.CHECKS)), COSTS)


def test_hscl_tau_never_starts_beside_the_scl_run_it_reads():
    done = {f"{m}-s0" for m in ("ucl", "hucl", "scl", "hscl-beta", "hscl-tau")} | {"hscl-beta-s1", "hucl-s1", "ucl-s1"}
    state = plan.State(frozenset(done))
    first = plan.next_item(state, COSTS, 0)
    assert first.runs == ("scl-s1", "scl-s2")  # hscl-tau-s1 comes before scl-s2 in priority, but waits for scl-s1
    assert plan.next_item(plan.done_after(state, first), COSTS, 0).runs == ("hscl-tau-s1", "hscl-beta-s2")


def test_a_pair_starts_only_when_its_training_fits_the_time_left():
    assert plan.next_item(COMMITTED, COSTS, elapsed=40, budget=540).kind == "train"  # exactly 500 s left
    late = plan.next_item(COMMITTED, COSTS, elapsed=41, budget=540)
    assert late.kind == "check" and late.check == "step-parity"  # 499 s left: the checks, not a pair


def test_the_checks_need_four_minutes_left():
    ran_parity = plan.State(COMMITTED.runs, frozenset({"step-parity"}))
    assert plan.next_item(ran_parity, COSTS, elapsed=540 - 240).check == "loss-memory"
    assert plan.next_item(plan.State(COMMITTED.runs), COSTS, elapsed=540 - 239) is None  # parity alone would fit


def test_an_item_tried_this_call_is_not_tried_again():
    item = plan.next_item(COMMITTED, COSTS, 0, budget=5000, skip=["ucl-s0", "hucl-s0"])
    assert item.runs == ("hscl-tau-s0", "scl-s1")
    assert plan.next_item(plan.State(frozenset(ALL_RUNS)), COSTS, 0, skip=["step-parity"]).check == "loss-memory"


def test_state_and_costs_come_from_the_files(tmp_path):
    runs = tmp_path / plan.RUNS_DIR
    runs.mkdir(parents=True)
    (runs / "ucl-s0.json").write_text(json.dumps({"wall_seconds": 100.0, "history": [
        {"epoch_seconds": 20.0, "wall_seconds": 25.0}, {"epoch_seconds": 20.0, "wall_seconds": 30.0}]}))
    (runs / "ucl-s0").mkdir()  # a run folder is not a finished run
    (tmp_path / "benchmarks/results").mkdir(parents=True)
    (tmp_path / plan.CHECKS["loss-memory"]).write_text("{}")
    log = {"parts": [{"part": "train-ucl", "exit": 0, "seconds": 300}, {"part": "train-hucl", "exit": 0, "seconds": 310},
                     {"part": "parity", "exit": 1, "seconds": 20}, {"part": "loss-bench", "exit": None, "seconds": None}]}
    (tmp_path / "benchmarks/results/x_sprint.json").write_text(json.dumps(log))
    assert plan.state_of(tmp_path) == plan.State(frozenset({"ucl-s0"}), frozenset({"loss-memory"}))
    costs = plan.costs_of(tmp_path)
    assert (costs.pair, costs.release, costs.checks["step-parity"]) == (310, 45, 20)  # 100 - 25 - 30 outside epochs


def test_the_committed_files_give_the_first_sessions_numbers():
    sprint = json.loads((REPO / "benchmarks/results/h100_sprint.json").read_text())
    trained = [p["seconds"] for p in sprint["parts"] if p["part"].startswith("train-")]
    costs = plan.costs_of(REPO)
    assert costs.pair == max(trained) and costs.sources["pair"] == "benchmarks/results/h100_sprint.json"
    assert {"scl-s0", "hscl-beta-s0"} <= plan.state_of(REPO).runs


def test_the_command_prints_the_next_item_as_one_json_line(capsys):
    assert plan.main(["--root", str(REPO), "--elapsed", "0"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["kind"] == "train" and len(printed["runs"]) == 2
    assert all(run not in plan.state_of(REPO).runs for run in printed["runs"])


def test_the_gpu_page_quotes_the_plan_the_committed_files_give():
    from hscl_zoo.reproduction.report import replace_block

    page = (REPO / "docs" / "gpu.md").read_text()
    text = plan.show(plan.plan_calls(plan.state_of(REPO), plan.costs_of(REPO)), plan.costs_of(REPO))
    assert "| 1 | train " in text
    assert replace_block(page, plan.PLAN_BLOCK, text) == page, "python benchmarks/sprint_plan.py --show --quote docs/gpu.md"
