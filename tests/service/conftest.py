"""Fixtures of the scale-out tests; puts this folder on sys.path so spawned processes import the helpers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture
def fresh_fakes():
    """The scripted evaluator's counters cleared and its gate closed for the test, opened after it."""
    import _service_fakes as fakes

    fakes.reset_counters()
    fakes.GATE.clear()
    yield
    fakes.GATE.set()
