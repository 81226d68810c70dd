"""Shared fixtures. Real datasets are read from ../shared/data (next to the repo) or PRIVOPT_SHARED_DATA."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    return Path(os.environ.get("PRIVOPT_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real-data folder; tests that need it are skipped on machines without it."""
    d = shared_data_dir()
    if not d.is_dir():
        pytest.skip(f"shared data folder not found at {d}")
    return d


def pytest_configure(config):
    # Accounting results are not read from or written to the user's on-disk cache: every test
    # computes its own (tests of the cache point it at a temporary directory).
    os.environ["PRIVOPT_ACCOUNTING_CACHE"] = "off"
    # Tests run in parallel workers on 2 cores: one intra-op thread each avoids oversubscription.
    import torch

    torch.set_num_threads(1)
