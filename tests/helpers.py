"""Helpers the test files share (pytest puts tests/ on the path)."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
"""The first eight bytes of every PNG file."""


GET_DATA = {
    "cifar10": "hf download uoft-cs/cifar10 --repo-type dataset --local-dir ../shared/data/cifar10",
    "cifar100": "hf download uoft-cs/cifar100 --repo-type dataset --local-dir ../shared/data/cifar100",
    "tinyimagenet": "hf download zh-plus/tiny-imagenet --repo-type dataset --local-dir ../shared/data/tinyimagenet",
    "tudataset": "TUDataset('../shared/data/tudataset', NAME) from PyTorch Geometric",
}
"""How to get each dataset of ``../shared/data`` (docs/contributing.md says the same)."""


def missing_data(path: Path) -> str:
    """The skip reason of a test whose data is not beside the clone: one short line naming the missing
    dataset and how to get it, so that a clone without the data reads one line per dataset."""
    dataset = next((part for part in reversed(Path(path).parts) if part in GET_DATA), None)
    if dataset is None:
        return "no ../shared/data beside the clone (the test datasets): docs/contributing.md lists their downloads"
    return f"no test data {dataset} beside the clone: {GET_DATA[dataset]}"


def write_cifar_sample(source: Path, out: Path, rows: dict[str, int], row_group: int = 64) -> Path:
    """`rows[split]` rows of each split of the parquet folder `source` (CIFAR-10's), drawn at random
    (seed 0) and kept in the file's own order, written to `out` in row groups of `row_group`."""
    import numpy as np
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    for split, n in rows.items():
        (found,) = sorted(source.rglob(f"{split}-*.parquet"))[:1]
        table = pq.read_table(found)
        keep = np.sort(np.random.default_rng(0).choice(len(table), n, replace=False))
        pq.write_table(table.take(keep), out / f"{split}-00000-of-00001.parquet", row_group_size=row_group)
    return out


def load_script(folder: str, name: str) -> ModuleType:
    """Import `<folder>/<name>.py` of the repository (recipes/, benchmarks/: not packages) from its
    file, once per test session, with its folder first on sys.path while it loads, as when it runs
    as a script (benchmarks import their sibling `provenance`)."""
    module_name = f"_hscl_{folder}_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, REPO / folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        sys.path.insert(0, str(REPO / folder))
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(REPO / folder))
    return sys.modules[module_name]


def make_hub_cache(cache: Path, repo_id: str, folder: Path, commit: str, ref: str | None = "main") -> Path:
    """Lay ``folder`` out as the Hub cache does after a download: blobs named by etag (LFS files by
    sha256, regular files by git blob sha1), a snapshot of relative symlinks, and a ref naming
    ``commit`` (none when ``ref`` is None: a snapshot reached only by its commit)."""
    repo_dir = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / commit
    for sub in (repo_dir / "blobs", repo_dir / "refs", snapshot):
        sub.mkdir(parents=True, exist_ok=True)
    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        if path.suffix == ".safetensors":
            etag = hashlib.sha256(data).hexdigest()
        else:
            etag = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        (repo_dir / "blobs" / etag).write_bytes(data)
        (snapshot / path.name).symlink_to(Path("..", "..", "blobs", etag))
    if ref is not None:
        (repo_dir / "refs" / ref).write_text(commit)
    return repo_dir


def one_cpu_epoch(batches, augment, forward, optimizer, loss_fn, **options) -> dict:
    """The recipe's `train_epoch` (epoch 1 of 1) over `batches` on a fresh CPU Accelerator, its
    state reset before and after so that tests do not see each other's; returns the epoch record."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from hscl_zoo.training.config import PretrainConfig
    from hscl_zoo.training.epochs import train_epoch
    from hscl_zoo.training.state import RunState, TrainingParts

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        parts = TrainingParts(None, None, None, augment, batches, forward, optimizer, loss_fn)
        run = RunState(PretrainConfig(epochs=1), Accelerator(cpu=True), parts, {"diagnostics_every": 1, **options})
        return train_epoch(run, 1, batches)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


@contextmanager
def smoke_release(name: str, top1: float, like: str = "ucl-cifar10.gpu-30ep") -> Iterator[None]:
    """`name` (``<zoo name>.cpu-<...>``, a CPU smoke-test tag) registered for the block only, with the
    committed record of `like` (its real pinned files) as its method and dataset and `top1` as its
    score: the zoo commits no smoke release (docs/contributing.md), so the tests that check how one
    is served build theirs."""
    from hscl_zoo.zoo import registry

    base = registry.info(name.partition(".")[0])
    record = {**registry._RELEASES[like], "method": base.method, "dataset": base.dataset, "metrics": {"top1": top1}}
    registry.register_model(registry.release_entry(name, record))
    try:
        yield
    finally:
        registry._ENTRIES.remove(name)
