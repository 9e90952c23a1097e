"""The mutation report's arithmetic and bookkeeping (tools/mutation.py) on a hand-made
measurement: no mutation tool runs here."""

import difflib
import subprocess

import pytest

from helpers import load_script

mutation = load_script("tools", "mutation")


def mutant_diff(before: str, after: str) -> str:
    """A unified diff of one function's text, as mutmut shows a mutant."""
    return "\n".join(difflib.unified_diff(before.split("\n"), after.split("\n"), "m.py", "m.py", lineterm=""))


PLUS_ONE = mutant_diff("def f(x):\n    return x + 1", "def f(x):\n    return x - 1")
PLUS_TWO = mutant_diff("def f(x):\n    return x + 1", "def f(x):\n    return x + 2")
MEASURED = {"mutants": 10, "killed": 7, "commit": "0123456789abcdef+dirty", "date": "2026-01-02T03:04:05+00:00",
            "target_seconds": 12.3, "not_killed": [
                {"id": "pkg.m.x_f__mutmut_1", "status": "survived", "line": 2, "diff": PLUS_ONE},
                {"id": "pkg.m.x_f__mutmut_2", "status": "survived", "line": 2, "diff": PLUS_TWO},
                {"id": "pkg.m.x_g__mutmut_1", "status": "timeout", "line": 5, "diff": PLUS_TWO},
            ]}


def test_score_leaves_the_declared_equivalents_out():
    equivalents = [
        {"function": "pkg.m.x_f", "change": ["-return x + 1", "+return x + 2"], "reason": "x is never read"},
        {"function": "pkg.m.x_h", "change": ["-return x + 1", "+return x - 1"], "reason": "another function"},
        {"function": "pkg.m.x_g", "change": ["-return x + 1", "+return x + 2"], "reason": "only survivors are equivalent"},
    ]
    verdict = mutation.verdict(MEASURED, equivalents)
    # 10 mutants, 1 equivalent (f's +2; g's timeout with the same change is not a survivor): 7 / 9
    assert verdict["score"] == pytest.approx(7 / 9)
    assert verdict["counts"] == {"killed": 7, "survived": 1, "timeout": 1, "equivalent": 1}
    assert [m["id"] for m in verdict["survivors"]] == ["pkg.m.x_f__mutmut_1", "pkg.m.x_g__mutmut_1"]
    assert verdict["equivalents"] == [{**MEASURED["not_killed"][1], "reason": "x is never read"}]
    assert mutation.verdict({**MEASURED, "killed": 0, "mutants": 0, "not_killed": []}, [])["score"] is None


def test_report_renders_the_scores_and_every_survivor():
    equivalents = [{"function": "pkg.m.x_f", "change": ["-return x + 1", "+return x + 2"], "reason": "x is never read"}]
    report = {"tool": "mutmut 0", "files": {"pkg/m.py": {"measured": MEASURED, "verdict": mutation.verdict(MEASURED, equivalents)}}}
    text = mutation.render(report)
    assert "| pkg/m.py | 10 | 7 | 1 | 0 | 1 | 0 | 1 | 77.8 % | no | 0123456789ab+dirty | unknown | 2026-01-02 | 12 |" in text
    assert "- `pkg/m.py:2` pkg.m.x_f__mutmut_1 (survived)" in text
    assert "- `pkg/m.py:5` pkg.m.x_g__mutmut_1 (timeout)" in text
    assert "- `pkg/m.py:2` pkg.m.x_f__mutmut_2 (x is never read)" in text
    assert "  -return x + 1\n  +return x - 1" in text


def test_mutant_line_finds_the_changed_line_among_equal_ones():
    source = "import os\n\n\nclass C:\n    @staticmethod\n    def m(a):\n        b = a + 1\n        if b:\n            b = a + 1\n        return b\n"
    function = "\n".join(source.splitlines()[4:])
    second = mutant_diff(function, function.replace("            b = a + 1", "            b = a - 1"))
    first = mutant_diff(function, function.replace("        b = a + 1\n        if", "        b = a - 1\n        if"))
    assert mutation.mutant_line(source, "pkg.m.xǁCǁm__mutmut_4", second) == 9
    assert mutation.mutant_line(source, "pkg.m.xǁCǁm__mutmut_1", first) == 7
    assert mutation.mutant_line(source, "pkg.m.x_missing__mutmut_1", first) is None


def test_equivalents_need_a_reason(tmp_path):
    path = tmp_path / "equivalents.yaml"
    path.write_text("- function: pkg.m.x_f\n  change: ['-a', '+b']\n  reason: ''\n")
    with pytest.raises(SystemExit, match="non-empty reason"):
        mutation.load_equivalents(path)
    path.write_text("- function: pkg.m.x_f\n  change: ['-a', '+b']\n  reason: a is b here\n")
    assert mutation.load_equivalents(path)[0]["reason"] == "a is b here"


def test_report_keeps_other_files_and_rejudges_on_every_write(tmp_path):
    report, equivalents = tmp_path / "mutation.json", tmp_path / "equivalents.yaml"
    equivalents.write_text("[]\n")
    mutation.write_report({"pkg/m.py": MEASURED}, "mutmut 0", report, equivalents)
    other = {**MEASURED, "mutants": 4, "killed": 4, "not_killed": []}
    mutation.write_report({"pkg/n.py": other}, "mutmut 0", report, equivalents)
    equivalents.write_text("- function: pkg.m.x_f\n  change: ['-return x + 1', '+return x + 2']\n  reason: x is never read\n")
    files = mutation.write_report({}, "mutmut 0", report, equivalents)["files"]
    assert sorted(files) == ["pkg/m.py", "pkg/n.py"]
    assert files["pkg/m.py"]["verdict"]["score"] == pytest.approx(7 / 9) and files["pkg/n.py"]["verdict"]["score"] == 1.0
    assert "| pkg/n.py | 4 | 4 |" in (tmp_path / "mutation.md").read_text()


def test_worktrees_reports_bring_the_newest_measurement_of_each_file(tmp_path):
    report, first, second, equivalents = (tmp_path / n for n in ("mutation.json", "a.json", "b.json", "eq.yaml"))
    equivalents.write_text("[]\n")
    later, latest = ({**MEASURED, "date": f"2026-0{month}-01T00:00:00+00:00", "killed": month} for month in (2, 3))
    mutation.write_report({"pkg/m.py": MEASURED, "pkg/n.py": later}, "mutmut 0", report, equivalents)
    mutation.write_report({"pkg/m.py": latest, "pkg/n.py": MEASURED, "pkg/o.py": MEASURED}, "mutmut 0", first,
                          equivalents)
    mutation.write_report({"pkg/m.py": later, "pkg/o.py": later}, "mutmut 0", second, equivalents)
    assert mutation.newer_measurements([first, second], report) == {"pkg/m.py": latest, "pkg/o.py": later}
    assert mutation.newer_measurements([second, first], report) == {"pkg/m.py": latest, "pkg/o.py": later}


def test_gpu_only_survivors_keep_counting_against_the_score():
    """A survivor explained as GPU-only stays a survivor (in the score's denominator, listed with its
    reason); only an equivalent one leaves the denominator."""
    equivalents = [
        {"function": "pkg.m.x_f", "change": ["-return x + 1", "+return x - 1"], "reason": "a CUDA device", "kind": "gpu-only"},
        {"function": "pkg.m.x_f", "change": ["-return x + 1", "+return x + 2"], "reason": "x is never read"},
    ]
    verdict = mutation.verdict(MEASURED, equivalents)
    assert verdict["score"] == pytest.approx(7 / 9)
    assert verdict["counts"] == {"killed": 7, "survived": 1, "gpu only": 1, "timeout": 1, "equivalent": 1}
    assert verdict["survivors"][0] == {**MEASURED["not_killed"][0], "reason": "a CUDA device", "gpu_only": True}
    text = mutation.render({"tool": "mutmut 0", "files": {"pkg/m.py": {"measured": MEASURED, "verdict": verdict}}})
    assert "| pkg/m.py | 10 | 7 | 1 | 1 | 1 | 0 | 1 | 77.8 % |" in text
    assert "- `pkg/m.py:2` pkg.m.x_f__mutmut_1 (survived, only a GPU can kill it: a CUDA device)" in text


def test_an_explanation_of_an_unknown_kind_is_refused(tmp_path):
    path = tmp_path / "equivalents.yaml"
    path.write_text("- function: pkg.m.x_f\n  change: ['-a', '+b']\n  reason: r\n  kind: harmless\n")
    with pytest.raises(SystemExit, match="a kind out of equivalent, gpu-only"):
        mutation.load_equivalents(path)


def test_code_now_tells_whether_a_file_still_is_the_code_measured(tmp_path):
    """A file is `same` only while the checkout's file (edits not yet committed included) is the
    file at the measured commit."""
    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "m.py").write_text("x = 1\n")
    git("add", "m.py")
    git("commit", "-qm", "measured")
    measured = git("rev-parse", "HEAD")
    assert mutation.unchanged_since("m.py", measured, tmp_path) is True
    (tmp_path / "m.py").write_text("x = 2\n")
    assert mutation.unchanged_since("m.py", measured, tmp_path) is False
    git("commit", "-qam", "changed")
    assert mutation.unchanged_since("m.py", measured, tmp_path) is False
    assert mutation.unchanged_since("m.py", measured + "+dirty", tmp_path) is None
    assert mutation.unchanged_since("m.py", "0" * 40, tmp_path) is None


def test_an_explanation_whose_line_or_function_is_gone_is_stale(tmp_path):
    """Code that moved or changed leaves its explanations behind; they are named, not silently
    dropped from the score."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("def f(x):\n    return x + 1\n\n\nclass C:\n    def g(self):\n        return 2\n")
    entries = [{"function": "pkg.m.x_f", "change": ["-return x + 1", "+return x - 1"]},
               {"function": "pkg.m.xǁCǁg", "change": ["-return 2", "+return 3"]},
               {"function": "pkg.m.x_f", "change": ["-return x + 2", "+return x"]},
               {"function": "pkg.m.xǁDǁg", "change": ["-return 2", "+return 3"]},
               {"function": "pkg.gone.x_f", "change": ["-return x + 1", "+return x - 1"]}]
    assert mutation.stale_equivalents(entries, tmp_path) == [
        "pkg.m.x_f: no longer has the line 'return x + 2'",
        "pkg.m.xǁDǁg: no such function in pkg/m.py",
        "pkg.gone.x_f: no such function in pkg/gone.py",
    ]


def test_every_committed_explanation_describes_code_that_is_there():
    """Each equivalent or GPU-only explanation names a function that exists and lines it still has."""
    assert mutation.stale_equivalents(mutation.load_equivalents()) == []


def test_every_target_and_its_test_files_exist():
    for target, tests in mutation.TARGETS.items():
        assert (mutation.ROOT / target).is_file(), target
        assert [t for t in tests if not (mutation.ROOT / t).is_file()] == [], target


def test_a_run_after_another_in_the_same_checkout_still_names_a_clean_commit(tmp_path):
    """A checkout that has run one target holds an updated report: the next target's code is still
    the commit's, while any other change makes it +dirty."""
    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    for path in (results / "mutation.json", results / "mutation.md", tmp_path / "m.py"):
        path.write_text("before\n")
    git("add", ".")
    git("commit", "-qm", "measured")
    head = git("rev-parse", "HEAD")
    (results / "mutation.json").write_text("after\n")
    (results / "mutation.md").write_text("after\n")
    assert mutation.measured_commit(tmp_path) == head
    (tmp_path / "m.py").write_text("after\n")
    assert mutation.measured_commit(tmp_path) == head + "+dirty"
