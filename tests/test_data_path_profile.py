"""benchmarks/data_path_profile.py (where a step's time goes) and how the GPU sprint reads it."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import REPO, load_script

plan = load_script("tools", "sprint_plan")


def test_the_profile_measures_each_stage_and_names_the_phases(tmp_path):
    out = tmp_path / "profile.json"
    done = subprocess.run([sys.executable, "benchmarks/data_path_profile.py", "--device", "cpu", "--dataset", "digits",
                           "--rows", "64", "--backbone", "test_resnet", "--batch-size", "16", "--steps", "2",
                           "--warmup", "1", "--reruns", "1", "--profile-steps", "2", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["command"].startswith("python benchmarks/data_path_profile.py --device cpu") and result["commit"]
    eager = result["configurations"]["eager"]
    rates = eager["views_per_second"]
    assert set(rates) == {"data", "compute", "e2e"} and min(rates.values()) > 0
    assert eager["e2e_over_compute"] == round(rates["e2e"] / rates["compute"], 3)
    profile = eager["profile"]
    assert set(profile["ms_per_step"]) == {"data:gather", "data:views", "step"} and profile["ms_per_step"]["step"] > 0
    assert profile["top_ops"] and all(op["op"] not in profile["ms_per_step"] for op in profile["top_ops"])
    assert profile["host_syncs"] is None  # counted on CUDA only
    assert "compiled" not in result["configurations"]


def rates(eager: float, compiled: float) -> dict:
    return {"configurations": {"eager": {"views_per_second": {"e2e": eager}},
                               "compiled": {"views_per_second": {"e2e": compiled}}}}


def test_runs_compile_only_when_the_profile_measured_it_faster():
    assert plan.compile_pays(rates(40_000.0, 42_000.0))  # 1.05x: pays
    assert not plan.compile_pays(rates(40_000.0, 41_999.0))
    assert not plan.compile_pays(rates(40_000.0, 30_000.0))
    assert not plan.compile_pays({"configurations": {"eager": {"views_per_second": {"e2e": 1.0}}}})
