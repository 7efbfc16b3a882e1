"""Fixtures of the results-store tests; puts this folder on sys.path so worker processes can import helpers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    # Spawned worker processes inherit sys.path, so they can import `_store_workers` whatever import mode
    # pytest runs in.
    sys.path.insert(0, _HERE)

from _store_workers import make_result  # noqa: E402

from cudal1.store import ResultsStore  # noqa: E402


@pytest.fixture
def store(tmp_path: Path):
    """A fresh store in a temporary directory, closed after the test."""
    with ResultsStore(tmp_path / "results.sqlite") as s:
        yield s


@pytest.fixture
def sample_result():
    """A CORRECT EvalResult with timing, flags, kernel class, baselines, protocol and environment."""
    return make_result(0)
