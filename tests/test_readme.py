"""The README's set-up commands are the ones CI runs, and the files it names exist."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def setup_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_readme_opens_with_two_setup_commands():
    assert README.index("```bash") < README.index("\n## ")
    main, tests = setup_commands()
    assert "pip install -c constraints.txt" in main and "accelerate launch recipes/pretrain.py" in main
    assert "pip install -c constraints.txt" in tests and tests.rstrip().endswith("pytest")


def test_ci_runs_the_readme_test_command_verbatim():
    assert setup_commands()[1] in (ROOT / ".ci" / "run").read_text()


def test_paths_the_readme_names_exist():
    named = re.findall(r"\b(recipes/[\w/.-]+\.(?:py|yaml)|benchmarks/\w+\.py|hscl_zoo/[\w/]+\.py|docs/\w+\.md)", README)
    assert "docs/losses.md" in named and "hscl_zoo/losses/fused.py" in named
    for path in named:
        assert (ROOT / path).exists(), path


def test_result_files_the_readme_links_exist_and_hold_json():
    linked = re.findall(r"\]\(((?:benchmarks/)?results/[\w/.-]+\.json)\)", README)
    assert "benchmarks/results/loss_bench_cpu.json" in linked and "results/default-digits.json" in linked
    for path in linked:
        assert isinstance(json.loads((ROOT / path).read_text()), dict), path


def test_readme_numbers_are_those_of_the_files_it_names():
    flat = " ".join(README.split())
    collapse = json.loads((ROOT / "benchmarks" / "results" / "queue_collapse.json").read_text())
    assert collapse["table"] in README
    run = json.loads((ROOT / "results" / "default-digits.json").read_text())
    assert f"{run['wall_seconds']:.0f} s wall" in flat
    assert (f"{run['linear_top1']:.1f} % linear-probe top-1 ({run['linear_top5']:.1f} % top-5; "
            f"kNN {run['knn_top1']:.1f} %)") in flat
    bench = json.loads((ROOT / "benchmarks" / "results" / "loss_bench_cpu.json").read_text())
    for row in bench["rows"]:
        if row["threads"] != 1 or row["B"] not in (128, 512):
            continue
        for beta in ("0.5", "1", "2"):
            cells = [row["ratios"][f"hscl-beta b={beta} / floor"], row["ratios"][f"official / hscl-beta b={beta}"],
                     row["ratios"][f"official-style / official b={beta}"]]
            quoted = " | ".join(f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})" for r in cells)
            assert f"| {row['B']} | {beta} | {quoted} |" in README, (row["B"], beta)
