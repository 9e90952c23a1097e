"""What a measurement ran on and from which code: written into every JSON a benchmark saves.

The commit, the CPU's name and the time come from `hscl_zoo._provenance`, which the package's run
records and the tools in tools/ use too; what is particular to a benchmark (its command line, the
machine's description) is here."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from hscl_zoo._provenance import code_commit, cpu_model, utc_now  # noqa: F401 (utc_now: the benchmarks import it from here)

ROOT = Path(__file__).resolve().parents[1]


def machine(device: str = "cpu") -> dict[str, Any]:
    """CPU model, visible cores, platform, Python and torch versions (and the GPU on CUDA)."""
    info: dict[str, Any] = {
        "cpu_model": cpu_model(), "cpu_cores_visible": os.cpu_count(), "platform": platform.platform(),
        "python": platform.python_version(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
    }
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def git_commit(root: Path = ROOT) -> str | None:
    """HEAD of this checkout (or of the one at `root`), with "+dirty" when any file of it, tracked or
    untracked (not ignored), differs from HEAD: a measurement made from uncommitted code says so."""
    return code_commit(root, paths=())


def command_line(script: str, argv: list[str] | None) -> str:
    """The command that ran a benchmark, as a results file records it: `python benchmarks/<name>.py`
    and its arguments (`argv`, or this process's when None). `script` is the benchmark's __file__."""
    return " ".join([f"python benchmarks/{Path(script).name}", *(sys.argv[1:] if argv is None else argv)])

