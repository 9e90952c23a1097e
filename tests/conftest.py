"""Shared fixtures: the offline test datasets beside the checkout, the embedded digits, and torch's
thread count kept as the session started; the cores shared among pytest-xdist's workers (`-n auto
--dist loadfile` in pyproject.toml: each file runs on one worker, in order, so a module's fixtures
are built once and doc blocks that share a folder run in page order)."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from helpers import missing_data

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

CI_TIME = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "ci_time.json"
CURRENT_SUITE = "ci/after"  # the key tools/ci_time.py writes for `--label after`

# The tests run against this checkout whatever folder a test or the process it starts works in: the
# package reads releases/ and results/ from the checkout HSCL_ZOO_ROOT names (hscl_zoo/_roots.py).
os.environ.setdefault("HSCL_ZOO_ROOT", str(Path(__file__).resolve().parents[1]))

if os.environ.get("PYTEST_XDIST_WORKER"):
    # N workers on C cores: each worker, and every process a test starts (they inherit the
    # variable), gets C // N threads, so that the workers do not oversubscribe the cores.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1)
                                                      // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(autouse=True)
def session_thread_count():
    """Every test runs on the thread count the session started with (OMP_NUM_THREADS, else the
    cores): a benchmark's --threads inside one test must not change the threads, and so the bits,
    of the tests after it."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The ``shared/data`` folder beside the checkout (parquet copies of CIFAR-10, Tiny ImageNet).

    Tests that read it are skipped, with the reason, only when the folder is absent.
    """
    if not SHARED_DATA.is_dir():
        pytest.skip(missing_data(SHARED_DATA))
    return SHARED_DATA


@pytest.fixture(scope="session")
def tu_root(shared_data) -> Path:
    """``shared/data/tudataset``: the five TU graph datasets in PyTorch Geometric's raw layout."""
    root = shared_data / "tudataset"
    if not root.is_dir():
        pytest.skip(missing_data(root))
    return root


@pytest.fixture(scope="session")
def digits():
    """The embedded digits dataset (``hscl_zoo.data.load_splits('digits')``), loaded once."""
    from hscl_zoo.data import load_splits

    return load_splits("digits")


@pytest.fixture(scope="session", autouse=True)
def test_budget_and_study():
    """The suite's own budget (`tiny-digits`: seconds on the embedded digits) and study
    (`tiny-queue`), registered for the test session only, so the production tables list real
    budgets and studies alone."""
    from hscl_zoo.reproduction.budgets import BUDGETS, Budget
    from hscl_zoo.reproduction.studies import STUDIES, Comparison, Study, Variant, check_study

    budget = Budget("tiny-digits", "The test suite's budget: seconds on the embedded digits.",
                    dict(dataset="digits", subset=200, backbone="resnet18", stem="default", epochs=2, batch_size=64,
                         probe_epochs=10, knn_k=20, monitor_train_size=200))
    study = Study(
        "tiny-queue", "tiny-digits", "The test suite's study: seconds on the embedded digits.",
        (Variant("scl", "the budget's own SCL run", budget_method="scl"),
         Variant("scl-queue", "SCL with a 64-row queue", dict(method="scl", queue_size=64)),
         Variant("ucl-fifth", "the budget's own UCL run probed with a fifth of the labels", budget_method="ucl",
                 probe=dict(labelled_fraction=0.2))),
        (Comparison("The queue helps SCL", "scl-queue", "scl"),
         Comparison("The queue matches SCL (within 1 point)", "scl-queue", "scl", "matches")))
    BUDGETS[budget.name] = budget
    check_study(study)
    STUDIES[study.name] = study
    yield
    del STUDIES[study.name], BUDGETS[budget.name]


@pytest.fixture(autouse=True)
def small_models_outside_slow(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """A guard, not a timer: a test outside `slow` that builds the paper's full-size backbone
    (ResNet-50) with real weights fails, naming the smaller ways to prove the same (a small backbone,
    the meta device) or the `slow` mark. timm builds the model as always; this only looks at it."""
    if request.node.get_closest_marker("slow") is not None:
        yield
        return
    import timm

    from hscl_zoo.zoo.registry import PAPER_BACKBONE

    create = timm.create_model

    def create_and_check(name: str, *args, **kwargs):
        model = create(name, *args, **kwargs)
        if name == PAPER_BACKBONE and not all(p.is_meta for p in model.parameters()):
            pytest.fail(f"{request.node.nodeid} builds the full-size {name} outside `slow`: use a small backbone "
                        "(resnet18, resnet10t) or the meta device where that proves the same, or mark it slow.")
        return model

    monkeypatch.setattr(timm, "create_model", create_and_check)
    yield


def recorded_seconds_per_file() -> dict[str, float]:
    """Each test file's seconds in the `.ci/run` of the current suite (``ci/after`` in
    ``benchmarks/results/ci_time.json``: the slowest tests of each pytest phase, the slow one
    included), summed over its listed tests; a file not listed is absent. Not the newest entry: a
    later measurement of the suite before the CI-time work lists files and tests that changed since."""
    try:
        runs = json.loads(CI_TIME.read_text())
    except (OSError, ValueError):
        return {}
    seconds: dict[str, float] = defaultdict(float)
    for session in runs.get(CURRENT_SUITE, {}).get("pytest_sessions", []):
        for test in session.get("slowest", []):
            seconds[test["test"].split("::")[0]] += test["seconds"]
    return dict(seconds)


def pytest_collection_modifyitems(config, items):
    """On xdist's workers, the longest files first (their seconds in the current suite's CI run), each
    file's tests kept together and in order: the scheduler hands out files in this order, so the
    last file to start is a short one and the workers finish together."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    seconds = recorded_seconds_per_file()
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))
