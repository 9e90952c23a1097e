"""The README's set-up commands are the ones CI runs, and the files it names exist."""

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
