"""The README's set-up commands are the ones CI runs, and the files the README and the docs pages
name exist and hold the numbers quoted from them."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = {page.name: page.read_text() for page in (ROOT / "docs").glob("*.md")}


def setup_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_readme_opens_with_two_setup_commands():
    assert README.index("```bash") < README.index("\n## ")
    main, tests = setup_commands()
    assert "pip install -c constraints.txt" in main and main.rstrip().endswith("&& hscl-zoo train")
    assert "pip install -c constraints.txt" in tests and tests.rstrip().endswith("pytest")


def test_ci_runs_the_readme_test_command_verbatim():
    assert setup_commands()[1] in (ROOT / ".ci" / "run").read_text()


def test_paths_the_readme_and_docs_name_exist():
    pattern = r"\b(recipes/[\w/.-]+\.(?:py|yaml)|benchmarks/\w+\.py|hscl_zoo/[\w/]+\.py|docs/[\w-]+\.md)"
    named = re.findall(pattern, README)
    assert "docs/losses.md" in named and "hscl_zoo/losses/fused.py" in named
    for text in DOCS.values():
        named += re.findall(pattern, text)
    for path in named:
        assert (ROOT / path).exists(), path


# written at build time by docs/gen_pages.py
GENERATED_PAGES = ("reference/",)


def test_the_pretraining_keys_page_is_the_one_the_config_gives():
    from hscl_zoo.config_help import config_page

    assert (ROOT / "docs" / "config.md").read_text() == config_page(), (
        "docs/config.md is out of date: python -m hscl_zoo.config_help docs/config.md")


def test_pages_the_readme_and_docs_link_exist():
    for source, text, base in [("README.md", README, ROOT), *((name, text, ROOT / "docs") for name, text in DOCS.items())]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not re.match(r"[a-z]+:", target) and not target.startswith(GENERATED_PAGES):
                assert (base / target).exists(), (source, target)


def test_result_files_the_docs_link_exist_and_hold_json():
    linked = [path for text in DOCS.values() for path in re.findall(r"\]\(\.\./((?:benchmarks/)?results/[\w/.-]+\.json)\)", text)]
    assert "benchmarks/results/loss_bench_cpu.json" in linked and "results/default-digits.json" in linked
    for path in linked:
        assert isinstance(json.loads((ROOT / path).read_text()), dict), path


def test_docs_numbers_are_those_of_the_files_they_name():
    flat = " ".join(DOCS["results.md"].split())
    collapse = json.loads((ROOT / "benchmarks" / "results" / "queue_collapse.json").read_text())
    assert collapse["table"] in DOCS["losses-guide.md"]
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
            assert f"| {row['B']} | {beta} | {quoted} |" in DOCS["benchmarks.md"], (row["B"], beta)


def test_readme_says_what_this_is_before_the_commands_and_stays_short():
    """A newcomer reads one sentence on what this is (and the flagship's name) before any command,
    and the README stays a page: details live on the docs site."""
    before_commands = README[:README.index("```bash")]
    assert "encoders" in before_commands and 'hscl_zoo.load("hscl-beta-cifar100")' in before_commands
    assert README.count("\n") <= 150
