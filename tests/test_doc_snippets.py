"""Every Python and shell block of README.md and docs/*.md runs, like a doctest (issue 41).

A block runs as it is written, in a scratch folder that holds the repository's `docs/assets`
(the sample images the snippets open). The HTML comment on the line before a block says what it
needs, comma-separated:

* ``<!-- doc-test: skip (REASON) -->``: not run here (the network, a GPU, a cluster); the test is
  reported as skipped with the reason;
* ``<!-- doc-test: slow -->``: runs with ``pytest -m slow``;
* ``<!-- doc-test: needs runs/default -->`` or ``needs photos/``: runs in a shared scratch folder
  that holds a small trained run at ``runs/default`` or a folder of class subfolders of images at
  ``photos/``; blocks that share it run in page order, so a block may use what an earlier one wrote;
* ``<!-- doc-test: needs tudataset -->``: reads ``tu:NAME`` graphs from their default place, which
  here is ``$HSCL_ZOO_TU_ROOT`` set to the TU folders of ``../shared/data/tudataset`` (a user's
  machine downloads them); runs in a folder of its own.
* ``<!-- doc-test: needs data/cifar10 -->``: reads ``data/cifar10``, a user's parquet copy of
  CIFAR-10; here a sample of ``../shared/data/cifar10`` (320 training and 100 test rows, in the
  file's order) in the shared scratch folder.

A block without ``needs`` runs in a folder of its own. Shell blocks run under ``bash -euo
pipefail`` with this interpreter's scripts (``hscl-zoo``) first on the PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import missing_data, write_cifar_sample

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LANGUAGES = {"python": "python", "bash": "bash", "sh": "bash", "shell": "bash", "console": "bash"}
MARKER = re.compile(r"^<!-- doc-test: (.*) -->$")
NEEDS = ("runs/default", "photos/", "tudataset", "data/cifar10")
TU_ROOT = REPO.parent / "shared" / "data" / "tudataset"
CIFAR10 = REPO.parent / "shared" / "data" / "cifar10"
TIMEOUT = 900


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    code: str
    skip: str | None
    slow: bool
    needs: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def parse_marker(text: str, where: str) -> tuple[str | None, bool, tuple[str, ...]]:
    """(skip reason, slow, needs) of a marker's text; unknown words are an error."""
    skip, slow, needs = None, False, []
    for part in re.split(r",\s*(?![^()]*\))", text.strip()):
        if match := re.fullmatch(r"skip \((.+)\)", part):
            skip = match.group(1)
        elif part == "slow":
            slow = True
        elif part.startswith("needs ") and part[6:] in NEEDS:
            needs.append(part[6:])
        else:
            raise ValueError(f"{where}: unknown doc-test marker {part!r}; use skip (REASON), slow or needs "
                             f"{' / '.join(NEEDS)}")
    return skip, slow, tuple(needs)


def blocks_of(path: Path) -> list[Block]:
    """The fenced Python and shell blocks of a Markdown page, with their markers."""
    lines = path.read_text(encoding="utf-8").splitlines()
    page = str(path.relative_to(REPO))
    found, i = [], 0
    while i < len(lines):
        fence = re.match(r"^```(\w+)\s*$", lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if fence.group(1) in LANGUAGES:
            marker = MARKER.match(lines[i - 1]) if i else None
            skip, slow, needs = parse_marker(marker.group(1), f"{page}:{i + 1}") if marker else (None, False, ())
            found.append(Block(page, i + 1, LANGUAGES[fence.group(1)], "\n".join(lines[i + 1:end]) + "\n",
                               skip, slow, needs))
        i = end + 1
    return found


BLOCKS = [block for page in PAGES for block in blocks_of(page)]


def test_markers_are_parsed_and_checked():
    assert parse_marker("slow, needs runs/default", "x") == (None, True, ("runs/default",))
    assert parse_marker("skip (needs the network, and a GPU)", "x") == ("needs the network, and a GPU", False, ())
    with pytest.raises(ValueError, match="unknown doc-test marker 'quick'"):
        parse_marker("quick", "x")
    with pytest.raises(ValueError, match="unknown"):
        parse_marker("skip", "x")


def test_most_blocks_run_here():
    """Marking is for what this machine cannot do; the rest of the blocks run."""
    skipped = [b for b in BLOCKS if b.skip]
    assert len(BLOCKS) - len(skipped) >= len(skipped), [b.id for b in skipped]


def _workspace(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "docs" / "assets", root / "docs" / "assets", dirs_exist_ok=True)
    return root


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["HF_HUB_OFFLINE"] = "1"  # a block that reaches for the network must be marked, not wait for it
    return env


def _run(block: Block, cwd: Path, **extra_env: str) -> None:
    command = [sys.executable, "-c", block.code] if block.language == "python" else \
        ["bash", "-euo", "pipefail", "-c", block.code]
    proc = subprocess.run(command, cwd=cwd, env={**_env(), **extra_env}, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, (f"{block.id} failed (exit {proc.returncode}):\n{block.code}\n--- stdout\n"
                                  f"{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    return _workspace(tmp_path_factory.mktemp("docs-shared"))


def _provide(need: str, root: Path) -> None:
    """Make ``need`` exist in the shared folder: a small digits run, or a folder of digit images."""
    if need == "runs/default" and not (root / "runs" / "default" / "hub").is_dir():
        command = [sys.executable, "-m", "hscl_zoo.cli", "train", "--subset", "160", "--batch_size", "16", "--epochs",
                   "1", "--probe_epochs", "2", "--backbone", "resnet10t", "--monitor_train_size", "64",
                   "--output_dir", "runs/default"]
        subprocess.run(command, cwd=root, env=_env(), capture_output=True, text=True, timeout=TIMEOUT, check=True)
    if need == "data/cifar10" and not (root / "data" / "cifar10").is_dir():
        write_cifar_sample(CIFAR10, root / "data" / "cifar10", {"train": 320, "test": 100})
    if need == "photos/" and not (root / "photos").is_dir():
        from hscl_zoo.data.datasets import load_splits

        train = load_splits("digits").train
        counts: dict[int, int] = {}
        for row in train:
            label = row["label"]
            if label < 3 and counts.get(label, 0) < 30:
                folder = root / "photos" / f"digit-{label}"
                folder.mkdir(parents=True, exist_ok=True)
                row["image"].save(folder / f"{counts.get(label, 0)}.png")
                counts[label] = counts.get(label, 0) + 1


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id, marks=[pytest.mark.slow] if b.slow else [])
                                   for b in BLOCKS])
def test_block_runs(block: Block, shared: Path, tmp_path: Path) -> None:
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    if "tudataset" in block.needs:
        if not TU_ROOT.is_dir():
            pytest.skip(f"{block.id}: {missing_data(TU_ROOT)}")
        _run(block, _workspace(tmp_path / "ws"), HSCL_ZOO_TU_ROOT=str(TU_ROOT))
    elif block.needs:
        if "data/cifar10" in block.needs and not CIFAR10.is_dir():
            pytest.skip(f"{block.id}: {missing_data(CIFAR10)}")
        for need in block.needs:
            _provide(need, shared)
        _run(block, shared)
    else:
        _run(block, _workspace(tmp_path / "ws"))
