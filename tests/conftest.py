"""Shared fixtures: the offline test datasets beside the checkout and the embedded digits."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The ``shared/data`` folder beside the checkout (parquet copies of CIFAR-10, Tiny ImageNet).

    Tests that read it are skipped, with the reason, only when the folder is absent.
    """
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared test data folder not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def digits():
    """The embedded digits dataset (``hscl_zoo.data.load_splits('digits')``), loaded once."""
    from hscl_zoo.data import load_splits

    return load_splits("digits")
