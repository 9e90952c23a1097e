"""The GPU sprint's planner (tools/sprint_plan.py): from what exists, the missing runs in the
issue's order (the CIFAR-100 row at seed 0 with H-SCL(beta) first, then the flagship and SCL at
200 epochs when one call holds such a run, then CIFAR-10's missing seed-0 releases, then seeds 1
and 2), two side by side, H-SCL(tau) only after the SCL run of its budget and seed, nothing
redone, and the call's time budget (a pair must fit, estimated from the newest measured rate; the
checks need four minutes)."""

from __future__ import annotations

import json

from helpers import REPO, load_script

plan = load_script("tools", "sprint_plan")
COSTS = plan.Costs(pair=500.0, release=100.0, checks={"step-parity": 30.0, "loss-memory": 240.0},
                   sources={"pair": "a.json", "release": "a.json"}, measured="gpu-cifar100")
"""A 30-epoch pair takes 500 s: a 200-epoch run, 3,333 s, fits no call."""
FAST = plan.Costs(pair=60.0, release=20.0, checks=COSTS.checks, sources=COSTS.sources, measured="gpu-cifar100")
"""A 30-epoch pair takes 60 s: a 200-epoch run, 400 s, fits one call."""
LONG = ("gpu-cifar100-200ep/hscl-beta-s0", "gpu-cifar100-200ep/scl-s0")
METHODS = ("ucl", "hucl", "scl", "hscl-beta", "hscl-tau")
C10 = {f"gpu-cifar10/{m}-s0" for m in ("ucl", "hucl", "scl", "hscl-beta")}
COMMITTED = plan.State(frozenset(C10), releases=frozenset({"ucl-cifar10.gpu-30ep", "hucl-cifar10.gpu-30ep"}))
"""What the repository held when the CIFAR-100 row was planned: four CIFAR-10 records, two releases."""
ALL_RUNS = {f"{b}/{m}-s{s}" for b in ("gpu-cifar10", "gpu-cifar100") for m in METHODS for s in (0, 1, 2)}
ALL_RELEASES = {f"{m}-{d}.gpu-30ep" for m in METHODS for d in ("cifar10", "cifar100")}
LONG_RELEASES = {"hscl-beta-cifar100.gpu-200ep", "scl-cifar100.gpu-200ep"}


def test_the_first_call_trains_the_flagship_and_scl_on_cifar100_side_by_side_and_releases_both():
    item = plan.next_item(COMMITTED, COSTS, elapsed=0)
    assert item.kind == "train" and item.runs == ("gpu-cifar100/hscl-beta-s0", "gpu-cifar100/scl-s0")
    assert item.releases == ("hscl-beta-cifar100.gpu-30ep", "scl-cifar100.gpu-30ep")
    assert item.must_fit == 500 and item.seconds == 600
    assert plan.plan(COMMITTED, COSTS) == [item]  # 40 s are left after it: no second pair, no checks
    assert plan.datasets_of([item]) == ["cifar100"]


def test_the_calls_deliver_the_cifar100_row_then_cifar10s_releases_then_the_seeds():
    calls = plan.plan_calls(COMMITTED, COSTS)
    runs = [run for items in calls for item in items for run in item.runs]
    assert runs[:5] == [f"gpu-cifar100/{m}-s0" for m in ("hscl-beta", "scl", "hucl", "ucl", "hscl-tau")]
    # CIFAR-10: H-SCL(tau) has no record; SCL and H-SCL(beta) have records but their weights were lost
    assert runs[5:8] == ["gpu-cifar10/hscl-tau-s0", "gpu-cifar10/scl-s0", "gpu-cifar10/hscl-beta-s0"]
    assert all(run.endswith(("-s1", "-s2")) for run in runs[8:])
    assert sorted(runs) == sorted((ALL_RUNS - C10) | {"gpu-cifar10/scl-s0", "gpu-cifar10/hscl-beta-s0"})
    for budget in ("gpu-cifar10", "gpu-cifar100"):
        for seed in (1, 2):
            assert runs.index(f"{budget}/hscl-tau-s{seed}") > runs.index(f"{budget}/scl-s{seed}")
    released = [name for items in calls for item in items for name in item.releases]
    assert sorted(released) == sorted(ALL_RELEASES - COMMITTED.releases)  # each missing release once
    assert [item.check for item in calls[-1]] == ["step-parity", "loss-memory"]
    assert not plan.plan(plan.State(frozenset(ALL_RUNS), frozenset(plan.CHECKS), frozenset(ALL_RELEASES)), COSTS)
    assert plan.too_long(COMMITTED, COSTS) == list(LONG)  # 3,333 s each: never planned, never cut
    assert not set(LONG) & set(runs)


def test_the_200_epoch_flagship_and_scl_come_after_the_cifar100_row_when_a_call_holds_them():
    calls = plan.plan_calls(COMMITTED, FAST)
    runs = [run for items in calls for item in items for run in item.runs]
    assert runs[:5] == [f"gpu-cifar100/{m}-s0" for m in ("hscl-beta", "scl", "hucl", "ucl", "hscl-tau")]
    assert runs[5:7] == list(LONG) and runs[7].startswith("gpu-cifar10/")
    long = next(item for items in calls for item in items if item.runs == LONG)
    assert long.must_fit == 400 and long.seconds == 420  # 60 s x 200 / 30, then a release
    assert long.releases == ("hscl-beta-cifar100.gpu-200ep", "scl-cifar100.gpu-200ep")
    assert plan.too_long(COMMITTED, FAST) == [] and plan.too_long(COMMITTED, FAST, budget=399) == list(LONG)
    released = [name for items in calls for item in items for name in item.releases]
    assert sorted(released) == sorted((ALL_RELEASES | LONG_RELEASES) - COMMITTED.releases)
    text = plan.show(plan.plan_calls(COMMITTED, COSTS), COSTS, plan.too_long(COMMITTED, COSTS))
    assert "Not planned: gpu-cifar100-200ep/hscl-beta-s0 (about 3333 s), gpu-cifar100-200ep/scl-s0 (about 3333 s)" in text
    assert "Not planned" not in plan.show(calls, FAST, plan.too_long(COMMITTED, FAST))


def test_a_longer_release_stands_for_the_shorter_and_a_kept_release_for_a_worse_one():
    """One release per zoo name, the best: once hscl-beta-cifar100.gpu-200ep replaced the 30-epoch
    folder, the 30-epoch run is not trained again for its release; a 200-epoch run with its record
    whose release was not kept (it scored less) is not trained again either."""
    runs = frozenset(ALL_RUNS | set(LONG))
    swapped = (ALL_RELEASES - {"hscl-beta-cifar100.gpu-30ep"}) | {"hscl-beta-cifar100.gpu-200ep"}
    state = plan.State(runs, frozenset(plan.CHECKS), frozenset(swapped))
    assert not plan.missing("gpu-cifar100/hscl-beta-s0", state) and not plan.missing(LONG[1], state)
    assert plan.plan(state, FAST) == []
    fresh = plan.State(frozenset(ALL_RUNS), frozenset(plan.CHECKS), frozenset(ALL_RELEASES))
    assert [item.runs for item in plan.plan(fresh, FAST)] == [LONG]  # no record yet: trained and released
    lost = plan.State(frozenset(ALL_RUNS), frozenset(plan.CHECKS), frozenset(ALL_RELEASES - {"scl-cifar10.gpu-30ep"}))
    assert plan.releases_of("gpu-cifar10/scl-s0", lost) == ("scl-cifar10.gpu-30ep",)  # a lost release is made again
    longer_only = plan.State(releases=frozenset({"hscl-beta-cifar100.gpu-200ep"}))
    assert plan.releases_of("gpu-cifar100/hscl-beta-s0", longer_only) == ()  # trained, but not published over it
    shorter_only = plan.State(releases=frozenset({"hscl-beta-cifar100.gpu-30ep"}))
    assert plan.releases_of(LONG[0], shorter_only) == ("hscl-beta-cifar100.gpu-200ep",)


def test_hscl_tau_never_starts_beside_the_scl_run_it_reads():
    done = {f"gpu-cifar100/{m}-s0" for m in ("hscl-beta", "hucl", "ucl")}
    state = plan.State(frozenset(done | C10), releases=frozenset(ALL_RELEASES))
    first = plan.next_item(state, COSTS, 0)
    # gpu-cifar100/hscl-tau-s0 comes second in priority but waits for its SCL
    assert first.runs == ("gpu-cifar100/scl-s0", "gpu-cifar10/hscl-tau-s0")
    assert plan.next_item(plan.done_after(state, first), COSTS, 0).runs[0] == "gpu-cifar100/hscl-tau-s0"
    assert not plan.ready("gpu-cifar10/hscl-tau-s1", {"gpu-cifar100/scl-s1"})  # another budget's SCL is not its own


def test_a_run_with_a_record_but_no_release_is_trained_again_and_one_with_both_is_not():
    state = plan.State(frozenset(ALL_RUNS), frozenset(plan.CHECKS), frozenset(ALL_RELEASES - {"scl-cifar10.gpu-30ep"}))
    item = plan.next_item(state, COSTS, 0)
    assert item.runs == ("gpu-cifar10/scl-s0",) and item.releases == ("scl-cifar10.gpu-30ep",)
    assert plan.missing("gpu-cifar10/scl-s1", plan.State()) and not plan.missing("gpu-cifar10/scl-s1", state)


def test_a_pair_starts_only_when_its_training_fits_the_time_left():
    assert plan.next_item(COMMITTED, COSTS, elapsed=40, budget=540).kind == "train"  # exactly 500 s left
    late = plan.next_item(COMMITTED, COSTS, elapsed=41, budget=540)
    assert late.kind == "check" and late.check == "step-parity"  # 499 s left: the checks, not a pair


def test_the_checks_need_four_minutes_left():
    ran_parity = plan.State(COMMITTED.runs, frozenset({"step-parity"}), COMMITTED.releases)
    assert plan.next_item(ran_parity, COSTS, elapsed=540 - 240).check == "loss-memory"
    assert plan.next_item(COMMITTED, COSTS, elapsed=540 - 239) is None  # parity alone would fit


def test_an_item_tried_this_call_is_not_tried_again():
    item = plan.next_item(COMMITTED, COSTS, 0, budget=5000, skip=["gpu-cifar100/hscl-beta-s0", "gpu-cifar100/scl-s0"])
    assert item.runs == ("gpu-cifar100/hucl-s0", "gpu-cifar100/ucl-s0")
    done = plan.State(frozenset(ALL_RUNS), releases=frozenset(ALL_RELEASES))
    assert plan.next_item(done, COSTS, 0, skip=["step-parity"]).check == "loss-memory"


def test_a_run_trained_again_for_its_release_never_overwrites_its_committed_record():
    assert plan.record_landing("gpu-cifar10/scl-s0", COMMITTED) == "results/gpu-cifar10/release-runs/scl-s0.json"
    assert plan.record_landing("gpu-cifar100/scl-s0", COMMITTED) == "results/gpu-cifar100/runs/scl-s0.json"


def test_release_names_carry_the_budgets_dataset_and_tag():
    from hscl_zoo.zoo.registry import RELEASE_TAGS

    assert plan.release_name("gpu-cifar100/hscl-beta-s0") == "hscl-beta-cifar100.gpu-30ep"
    assert plan.release_name("gpu-cifar100-200ep/scl-s0") == "scl-cifar100.gpu-200ep"
    assert set(plan.RELEASE_TAGS.values()) <= set(RELEASE_TAGS)  # each tag has its words for users
    assert plan.release_name("gpu-cifar10/hscl-tau-s2") == "hscl-tau-cifar10.gpu-30ep"
    assert plan.record_path("gpu-cifar100/scl-s1") == "results/gpu-cifar100/runs/scl-s1.json"


def test_state_and_costs_come_from_the_files(tmp_path):
    runs = tmp_path / plan.runs_dir("gpu-cifar10")
    runs.mkdir(parents=True)
    (runs / "ucl-s0.json").write_text(json.dumps({"wall_seconds": 100.0, "history": [
        {"epoch_seconds": 20.0, "wall_seconds": 25.0}, {"epoch_seconds": 20.0, "wall_seconds": 30.0}]}))
    (runs / "ucl-s0").mkdir()  # a run folder is not a finished run
    (tmp_path / plan.runs_dir("gpu-cifar100") / "hucl-s1").mkdir(parents=True)
    (tmp_path / "benchmarks/results").mkdir(parents=True)
    (tmp_path / plan.CHECKS["loss-memory"]).write_text("{}")
    (tmp_path / plan.RELEASES_REGISTRY).parent.mkdir(parents=True)
    (tmp_path / plan.RELEASES_REGISTRY).write_text(json.dumps({"ucl-cifar10.gpu-30ep": {}}))
    (tmp_path / "releases/scl-cifar100.gpu-30ep").mkdir(parents=True)
    (tmp_path / "releases/scl-cifar100.gpu-30ep/eval.json").write_text("{}")  # landed in a view, not registered yet
    (tmp_path / "releases/hucl-cifar100.gpu-30ep").mkdir()  # a folder without its evaluation is no release
    hidden = tmp_path / plan.HIDDEN / "releases/hucl-cifar10.gpu-30ep"
    hidden.mkdir(parents=True)
    (hidden / "eval.json").write_text("{}")  # hidden for a device call (sprint_pack.hide): still there
    log = {"parts": [{"part": "train-ucl", "exit": 0, "seconds": 600}, {"part": "train-hucl", "exit": 0, "seconds": 610},
                     {"part": "parity", "exit": 1, "seconds": 20}, {"part": "loss-bench", "exit": None, "seconds": None}]}
    (tmp_path / "benchmarks/results/x_sprint.json").write_text(json.dumps(log))  # no stamp: the oldest
    older = {"started": "20261128T060824Z", "parts": [{"part": "train-gpu-cifar100-scl-s0", "seconds": 500}]}
    newest = {"started": "20261201T000000Z", "parts": [{"part": "train-gpu-cifar10-ucl-s1", "seconds": 300},
                                                       {"part": "train-gpu-cifar100-hucl-s1", "seconds": 310}]}
    (tmp_path / "benchmarks/results/gpu_sprint_b.json").write_text(json.dumps(older))
    (tmp_path / "benchmarks/results/gpu_sprint_a.json").write_text(json.dumps(newest))  # newest by stamp, not name
    assert plan.state_of(tmp_path) == plan.State(frozenset({"gpu-cifar10/ucl-s0"}), frozenset({"loss-memory"}),
                                                 frozenset({"ucl-cifar10.gpu-30ep", "scl-cifar100.gpu-30ep",
                                                            "hucl-cifar10.gpu-30ep"}))
    costs = plan.costs_of(tmp_path)
    assert (costs.pair, costs.measured, costs.sources["pair"]) == (310, "gpu-cifar100", "benchmarks/results/gpu_sprint_a.json")
    assert (costs.release, costs.checks["step-parity"]) == (45, 20)  # 100 - 25 - 30 outside epochs; the stampless log's
    assert costs.train("gpu-cifar100-200ep") == 310 * 200 / 30 and costs.train("gpu-cifar10") == 310


def test_a_gpu_profile_newer_than_the_newest_log_gives_the_pairs_training_time(tmp_path):
    """After the first call's profile, a pair of 30-epoch CIFAR-100 runs is the seconds outside
    training the newest log measured plus 2 runs x 3,000,000 views (30 epochs x 50,000 images x 2
    views) at the profile's end-to-end rate; an older profile changes nothing."""
    (tmp_path / "benchmarks/results").mkdir(parents=True)
    log = {"started": "20261201T000000Z", "parts": [
        {"part": "train-gpu-cifar100-scl-s0", "seconds": 416, "timings": {"outside_training": 160.0}},
        {"part": "train-gpu-cifar100-ucl-s0", "seconds": 410, "timings": {"outside_training": 164.5}}]}
    (tmp_path / "benchmarks/results/gpu_sprint_x.json").write_text(json.dumps(log))
    runs = tmp_path / plan.runs_dir("gpu-cifar10")
    runs.mkdir(parents=True)
    (runs / "ucl-s0.json").write_text(json.dumps({"wall_seconds": 100.0, "history": [{"epoch_seconds": 20.0}]}))

    def profile(measured: str, eager: float, compiled: float) -> None:
        rates = lambda e2e: {"views_per_second": {"data": 1.0, "compute": 1.0, "e2e": e2e}}  # noqa: E731
        (tmp_path / plan.GPU_PROFILE).write_text(json.dumps(
            {"measured": measured, "configurations": {"eager": rates(eager), "compiled": rates(compiled)}}))

    profile("2026-11-30T23:00:00+00:00", 60_000.0, 75_000.0)  # before the log: the log's pair stands
    assert plan.costs_of(tmp_path).pair == 416
    profile("2026-12-01T00:10:00+00:00", 60_000.0, 75_000.0)  # compiled pays: its rate
    costs = plan.costs_of(tmp_path)
    assert costs.pair == 164.5 + 6_000_000 / 75_000 and plan.GPU_PROFILE in costs.sources["pair"]
    profile("2026-12-01T00:10:00+00:00", 60_000.0, 62_000.0)  # compiled within 5 %: the eager rate
    assert plan.costs_of(tmp_path).pair == 164.5 + 6_000_000 / 60_000


def test_the_committed_files_give_the_sessions_numbers():
    logs = [json.loads(path.read_text()) for path in (REPO / "benchmarks/results").glob("gpu_sprint_*.json")]
    newest = max((log for log in logs if any(p["part"].startswith("train-") for p in log["parts"])),
                 key=lambda log: log["started"])
    costs = plan.costs_of(REPO)
    assert costs.pair == max(p["seconds"] for p in newest["parts"] if p["part"].startswith("train-"))
    assert costs.sources["pair"] == f"benchmarks/results/gpu_sprint_{newest['started']}.json"
    state = plan.state_of(REPO)
    assert {"gpu-cifar10/scl-s0", "gpu-cifar10/hscl-beta-s0"} <= state.runs
    assert {"ucl-cifar10.gpu-30ep", "hucl-cifar10.gpu-30ep"} <= state.releases


def test_the_command_prints_the_next_item_as_one_json_line(capsys):
    assert plan.main(["--root", str(REPO), "--elapsed", "0"]) == 0
    printed = json.loads(capsys.readouterr().out)
    state = plan.state_of(REPO)
    assert printed["kind"] == "train" and len(printed["runs"]) == 2
    assert all(plan.missing(run, state) for run in printed["runs"])


def test_the_gpu_page_quotes_the_plan_the_committed_files_give():
    from hscl_zoo._files import replace_block

    page = (REPO / "docs" / "benchmarks.md").read_text()
    state, costs = plan.state_of(REPO), plan.costs_of(REPO)
    text = plan.show(plan.plan_calls(state, costs), costs, plan.too_long(state, costs))
    assert "| 1 | train " in text
    assert replace_block(page, plan.PLAN_BLOCK, text) == page, "python tools/sprint_plan.py --show --quote docs/benchmarks.md"
