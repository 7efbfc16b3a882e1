"""Fixtures shared by the compile-service tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def fake_torch_build(monkeypatch, tmp_path):
    """torch's load_inline/load replaced by fakes that compile nothing; returns (cpp_extension, the fake
    load_inline's calls). Hooks installed afterwards wrap the fakes; the real functions come back after the
    test (monkeypatch restores what it replaced, hooks included)."""
    import torch.utils.cpp_extension as ce

    calls = []
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(ce, "load_inline", lambda *a, **k: calls.append(a) or "module")
    monkeypatch.setattr(ce, "load", lambda *a, **k: None)
    return ce, calls
