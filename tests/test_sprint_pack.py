"""Packing a GPU call's results (tools/sprint_pack.py): they come back within the device
tool's limits and land in the repository byte for byte; the carried code is named by its commit
and the hash of its diff; a correction sits beside the recorded value."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from helpers import load_script

pack = load_script("tools", "sprint_pack")


def view_with(tmp_path: Path, weights_bytes: dict[str, int]) -> Path:
    view = tmp_path / "view"
    (view / "results/gpu-cifar10/runs").mkdir(parents=True)
    (view / "results/gpu-cifar10/runs/ucl-s0.json").write_text('{"top1": 12.5}\n')
    for folder, size in weights_bytes.items():
        (view / folder).mkdir(parents=True)
        (view / folder / "model.safetensors").write_bytes(os.urandom(size))
        (view / folder / "eval.json").write_text("{}\n")
    return view


def test_results_and_weights_come_back_byte_for_byte_in_parts_under_the_limit(tmp_path):
    view = view_with(tmp_path, {"releases/ucl-cifar10.gpu-30ep": 23 * 2**20})
    out, root = tmp_path / "out", tmp_path / "repo"
    (out).mkdir()
    (out / "check.tgz").write_bytes(b"another step's file")
    small = ["results/gpu-cifar10/runs/ucl-s0.json"]
    assert pack.pack(view, out, small, ["releases/ucl-cifar10.gpu-30ep"]) == []
    sizes = {p.name: p.stat().st_size for p in out.iterdir()}
    assert sorted(sizes) == ["check.tgz", "releases_ucl-cifar10.gpu-30ep.tar.part00",
                             "releases_ucl-cifar10.gpu-30ep.tar.part01", "results.tgz"]
    # the device tool brings back only names of letters, digits, '.', '_' and '-' (its README)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in sizes), sorted(sizes)
    assert max(sizes.values()) <= pack.PART_BYTES < pack.MAX_FILE_BYTES
    written = pack.unpack(out, root)
    assert sorted(written) == sorted(small + ["releases/ucl-cifar10.gpu-30ep/eval.json",
                                              "releases/ucl-cifar10.gpu-30ep/model.safetensors"])
    for path in written:
        assert (root / path).read_bytes() == (view / path).read_bytes(), path


@pytest.mark.parametrize("count, size, kept", [
    (3, 25 * 2**20, 2),  # 75 MiB in 7 files: the third passes 64 MiB
    (9, 2**10, 7),  # nine small folders: results.tgz and seven parts make the eight files
])
def test_weights_that_would_pass_the_calls_limits_are_left_out_not_cut(tmp_path, count, size, kept):
    folders = {f"releases/m{i}": size for i in range(count)}
    view = view_with(tmp_path, folders)
    left_out = pack.pack(view, tmp_path / "out", [], list(folders))
    files = list((tmp_path / "out").iterdir())
    assert left_out == list(folders)[kept:]
    assert len(files) <= pack.MAX_FILES and sum(f.stat().st_size for f in files) <= pack.MAX_TOTAL_BYTES
    assert {f.name.split(".tar.part")[0] for f in files} == {"results.tgz", *(f"releases_m{i}" for i in range(kept))}


def test_unpack_writes_nothing_outside_the_repository(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with tarfile.open(out / "results.tgz", "w:gz") as tar:
        info = tarfile.TarInfo("../escaped.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(SystemExit, match="not a file under the repository"):
        pack.unpack(out, tmp_path / "repo")
    assert not (tmp_path / "escaped.json").exists()


def test_unpack_checks_each_file_against_the_sprint_logs_hash(tmp_path):
    view = view_with(tmp_path, {})
    record = "results/gpu-cifar10/runs/ucl-s0.json"
    log = "benchmarks/results/gpu_sprint_x.json"
    (view / "benchmarks/results").mkdir(parents=True)
    digest = hashlib.sha256((view / record).read_bytes()).hexdigest()
    (view / log).write_text(json.dumps({"parts": [{"part": "train-ucl-s0", "files": {record: digest}}]}))
    pack.pack(view, tmp_path / "out", [record, log], [])
    assert record in pack.unpack(tmp_path / "out", tmp_path / "good", log=log)
    (view / log).write_text(json.dumps({"parts": [{"part": "train-ucl-s0", "files": {record: "0" * 64}}]}))
    pack.pack(view, tmp_path / "out", [record, log], [])
    with pytest.raises(SystemExit, match="differ from the sha256"):
        pack.unpack(tmp_path / "out", tmp_path / "bad", log=log)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=repo,
                          capture_output=True, text=True, check=True).stdout


def test_the_source_names_the_commit_and_hashes_the_diff_of_the_carried_tree(tmp_path, tmp_path_factory):
    git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "first")
    clean = pack.source(tmp_path)
    assert clean["commit"] == git(tmp_path, "rev-parse", "HEAD").strip()
    assert clean["diff_sha256"] == hashlib.sha256(b"").hexdigest() and clean["untracked"] == []
    (tmp_path / "a.py").write_text("x = 2\n")
    git(tmp_path, "add", "a.py")  # staged: still a change from the commit the tree names
    (tmp_path / "new.py").write_text("y = 1\n")
    changed = pack.source(tmp_path)
    assert changed["commit"] == clean["commit"] and changed["untracked"] == ["new.py"]
    diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=tmp_path, capture_output=True).stdout
    assert b"+x = 2" in diff and changed["diff_sha256"] == hashlib.sha256(diff).hexdigest()
    for nowhere in (tmp_path / "absent", tmp_path_factory.mktemp("not-a-checkout")):
        with pytest.raises(SystemExit, match="from a git checkout"):
            pack.source(nowhere)


def test_a_correction_is_a_new_field_beside_the_recorded_value():
    record = {"commit": "f7822a4+dirty", "top1": 83.7}
    fixed = pack.correct(record, "commit", "c" * 40, "the device's .git was stale; the packed source names the code")
    assert fixed["commit"] == "f7822a4+dirty" and fixed["commit_corrected"] == "c" * 40 and fixed["commit_correction"]
    assert record == {"commit": "f7822a4+dirty", "top1": 83.7}  # the record itself is not edited
    with pytest.raises(ValueError, match="corrected already"):
        pack.correct(fixed, "commit", "d" * 40, "again")
    with pytest.raises(KeyError, match="beside a recorded value"):
        pack.correct(record, "git_commit", "c" * 40, "why")
    with pytest.raises(ValueError, match="reason"):
        pack.correct(record, "top1", 84.0, " ")


def test_the_unpack_command_finds_the_calls_log_and_checks_against_it(tmp_path, capsys):
    view = view_with(tmp_path, {})
    record, log = "results/gpu-cifar10/runs/ucl-s0.json", "benchmarks/results/gpu_sprint_20260101T000000Z.json"
    (view / "benchmarks/results").mkdir(parents=True)
    (view / log).write_text(json.dumps({"parts": [{"files": {record: "f" * 64}}]}))
    pack.pack(view, tmp_path / "out", [record, log], [])
    with pytest.raises(SystemExit, match="differ from the sha256"):
        pack.main(["unpack", str(tmp_path / "out"), "--into", str(tmp_path / "repo")])
    with pytest.raises(SystemExit, match="holds no results.tgz"):
        pack.main(["unpack", str(tmp_path / "nothing"), "--into", str(tmp_path / "repo")])
