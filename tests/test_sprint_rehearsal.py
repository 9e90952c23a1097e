"""`bash tools/gpu_sprint.sh --rehearse next` on the CPU: the plan a GPU call would follow,
decided from the committed files, run at the rehearsal budget's tiny sizes into a scratch folder,
packed within the device tool's limits; and a second rehearsal on its own unpacked results takes
the next item instead of redoing the first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hscl_zoo.reproduction.budgets import BUDGETS
from helpers import REPO, load_script, missing_data

plan = load_script("tools", "sprint_plan")
pack = load_script("tools", "sprint_pack")
sprint_next = load_script("tools", "sprint_next")
SHARED_DATA = REPO.parent / "shared" / "data"


def rehearse(tmp: Path, name: str, view: Path | None = None) -> tuple[subprocess.CompletedProcess, Path, dict]:
    state, out = tmp / name / "state", tmp / name / "out"
    env = {**os.environ, "PYTHON": sys.executable, "STATE": str(state), "OUT": str(out), "DATA": str(SHARED_DATA),
           "OMP_NUM_THREADS": "1", **({"VIEW": str(view)} if view else {})}
    result = subprocess.run(["bash", str(REPO / "tools" / "gpu_sprint.sh"), "--rehearse", "next"], cwd=REPO,
                            capture_output=True, text=True, env=env, timeout=1800)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    logs = [p for p in pack.unpack(out, tmp / name / "landed") if p.startswith("benchmarks/results/rehearsal_")]
    assert len(logs) == 1
    return result, out, json.loads((tmp / name / "landed" / logs[0]).read_text())


@pytest.mark.slow
def test_two_rehearsals_follow_the_plan_and_the_second_takes_the_next_item(tmp_path):
    if not SHARED_DATA.is_dir():
        pytest.skip(missing_data(SHARED_DATA))
    expected = plan.plan_calls(plan.state_of(REPO), plan.costs_of(REPO))
    _, out, log = rehearse(tmp_path, "first")
    assert [item["name"] for item in log["plan"]] == [item.name for item in expected[0]]
    first = expected[0][0]
    assert log["rehearsal"] and log["source"]["commit"] and len(log["source"]["diff_sha256"]) == 64
    assert {p["part"] for p in log["parts"]} == {"profile"} | {
        f"{kind}-{run.replace('/', '-')}" for run in first.runs
        for kind in ("train", "weights", "release") if kind == "train" or run.endswith("-s0")}
    profile = json.loads((tmp_path / "first" / "landed" / sprint_next.PROFILE[True]).read_text())
    assert set(profile["configurations"]) == {"eager", "compiled"}  # the compiled step and views ran on the CPU
    assert log["compile"] == plan.compile_pays(profile)
    assert all(p["exit"] == 0 for p in log["parts"])
    for part in (p for p in log["parts"] if p["part"].startswith("train-")):  # where each run's wall time went
        timings = part["timings"]
        assert timings["training"] + timings["outside_training"] == pytest.approx(timings["wall"], abs=1e-2)
        assert sum(timings["items"].values()) == pytest.approx(timings["outside_training"], abs=1e-2)
        assert timings["items"]["evaluation"] == pytest.approx(sum(timings["evaluation"].values()), abs=1e-2)
        assert min(timings["items"].values()) >= 0 and timings["evaluation"]["features"] > 0
    files = list(out.iterdir())
    assert len(files) <= pack.MAX_FILES and max(f.stat().st_size for f in files) <= pack.MAX_FILE_BYTES
    assert sum(f.stat().st_size for f in files) <= pack.MAX_TOTAL_BYTES
    landed = tmp_path / "first" / "landed"
    committed = plan.state_of(REPO)
    for run, release in zip(first.runs, first.releases):
        budget, method, _ = plan.split_run(run)
        record = json.loads((landed / plan.record_landing(run, committed)).read_text())
        assert record["method"] == method and len(record["history"]) == 1
        evaluation = json.loads((landed / "releases" / release / "eval.json").read_text())
        assert evaluation["stored_dtype"] == "bfloat16" and evaluation["float32_run"]["top1"] == record["top1"]
        assert evaluation["budget"] == BUDGETS[f"{budget}-rehearsal"].description  # its card says what data it read
        shards = list((landed / "releases" / release).glob("*.safetensors"))
        assert shards and all(s.stat().st_size < 16 * 2**20 for s in shards)
        assert not (landed / "runs" / "gpu-weights" / run).exists()  # the release replaced its weights in the pack

    second_view = tmp_path / "second-view"
    pack.unpack(out, second_view)  # a copy of its own results, as they come back from a call
    _, _, again = rehearse(tmp_path, "second", view=second_view)
    assert [item["name"] for item in again["plan"]] == [item.name for item in expected[1]]
    assert "profile" not in {p["part"] for p in again["parts"]}  # profiled once
    trained = {p["part"].removeprefix("train-") for p in again["parts"] if p["part"].startswith("train-")}
    assert trained == {run.replace("/", "-") for run in expected[1][0].runs}
    assert not trained & {run.replace("/", "-") for run in first.runs}
