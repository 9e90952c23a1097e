"""The suite's disk footprint: what a passing test writes under tmp_path is deleted once it passes.

CI runs three pytest sessions and then installs the wheel into a fresh environment (a CUDA build of
torch, about 5.5 GB). With pytest's default retention the three sessions' run folders stayed on disk
(about 21 GB) and that install ran out of space. The project's pytest settings must delete a passing
test's files and keep a failing one's for inspection.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TESTS = '''
def test_passes(tmp_path):
    (tmp_path / "run.bin").write_bytes(bytes(1 << 20))

def test_fails(tmp_path):
    (tmp_path / "run.bin").write_bytes(bytes(1 << 20))
    assert False
'''


def test_a_passing_test_leaves_no_files_and_a_failing_one_keeps_its_own(tmp_path: Path) -> None:
    (tmp_path / "test_two.py").write_text(TESTS)
    basetemp = tmp_path / "basetemp"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
         "-p", "no:cacheprovider", "-n", "0", f"--basetemp={basetemp}", str(tmp_path / "test_two.py")],
        capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert "1 failed, 1 passed" in run.stdout, run.stdout + run.stderr
    left = sorted(p.name for p in basetemp.iterdir() if not p.is_symlink())
    assert left == ["test_fails0"], left
    assert (basetemp / "test_fails0" / "run.bin").stat().st_size == 1 << 20


GUARDED = '''
import pytest, timm, torch

def test_full_size():
    timm.create_model("resnet50")

def test_full_size_on_the_meta_device():
    with torch.device("meta"):
        timm.create_model("resnet50")

@pytest.mark.slow
def test_full_size_marked_slow():
    timm.create_model("resnet50")
'''


@pytest.mark.slow  # a pytest session of its own that builds ResNet-50 twice
def test_a_fast_test_building_the_full_size_backbone_fails(tmp_path: Path) -> None:
    """tests/conftest.py's guard: outside `slow`, a real ResNet-50 fails its test; on the meta device,
    or in a slow test, it is allowed."""
    for name in ("conftest.py", "helpers.py"):
        (tmp_path / name).write_text((ROOT / "tests" / name).read_text())
    (tmp_path / "test_guarded.py").write_text(GUARDED)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
         "-p", "no:cacheprovider", "-n", "0", "-m", "slow or not slow", str(tmp_path / "test_guarded.py")],
        capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert "1 failed, 2 passed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
    assert "test_guarded.py::test_full_size builds the full-size resnet50 outside `slow`" in run.stdout
