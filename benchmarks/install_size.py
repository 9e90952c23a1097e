"""How much disk the README's install takes: a virtual environment's size, and the part of it that
is PyTorch's CUDA libraries (the `nvidia-*` and `cuda-*` distributions pip pulls with the default
CUDA build of torch), which a CPU-only machine does not need.

    python benchmarks/install_size.py VENV [--out benchmarks/results/install_size.json]

VENV is an environment made by the README's first command (`pip install -c constraints.txt -e .`).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

from provenance import ROOT, git_commit, machine, utc_now

CUDA_DISTRIBUTION = re.compile(r"^(nvidia[-_]|cuda[-_]|triton$)", re.I)


def tree_bytes(path: Path) -> int:
    """Bytes of the regular files under `path` (links not followed)."""
    return sum(entry.stat(follow_symlinks=False).st_size for entry in path.rglob("*")
               if entry.is_file() and not entry.is_symlink())


def distribution_files(venv: Path) -> dict[str, list[Path]]:
    """Each installed distribution's files, from its RECORD (what pip wrote for it)."""
    site = next(venv.glob("lib/python*/site-packages"))
    files: dict[str, list[Path]] = {}
    for record in site.glob("*.dist-info/RECORD"):
        name = record.parent.name.split("-")[0]
        files[name] = [site / line.split(",")[0] for line in record.read_text().splitlines() if line]
    return files


def measure(venv: Path) -> dict:
    sizes = {name: sum(p.stat().st_size for p in paths if p.is_file())
             for name, paths in distribution_files(venv).items()}
    cuda = {name: size for name, size in sizes.items() if CUDA_DISTRIBUTION.match(name)}
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
                         capture_output=True, text=True, check=True)
    torch_version = next(p["version"] for p in json.loads(pip.stdout) if p["name"] == "torch")
    return {"venv_bytes": tree_bytes(venv), "cuda_libraries_bytes": sum(cuda.values()),
            "cuda_distributions": sorted(cuda), "torch": torch_version}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("venv", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "install_size.json")
    args = parser.parse_args(argv)
    result = {"command": "pip install -c constraints.txt -e .", **measure(args.venv), "commit": git_commit(),
              "machine": machine(), "measured": utc_now()}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{args.venv}: {result['venv_bytes'] / 1e9:.1f} GB, of which CUDA libraries "
          f"{result['cuda_libraries_bytes'] / 1e9:.1f} GB (torch {result['torch']}) -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
