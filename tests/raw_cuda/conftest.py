"""Shared fixtures of the raw-CUDA tests: an isolated CUBIN cache and a clean launch log per test."""

from __future__ import annotations

import pytest

from cudal1.raw_cuda import compiler, launcher


@pytest.fixture()
def cache_dir(tmp_path, monkeypatch):
    """A private disk cache (also via $CUDAL1_CACHE_DIR) and an empty in-memory cache."""
    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path / "cudal1"))
    compiler.clear_memory_cache()
    launcher._kernel_sets.clear()
    yield tmp_path / "cudal1" / "raw_cuda"
    compiler.clear_memory_cache()
    launcher._kernel_sets.clear()


@pytest.fixture(autouse=True)
def clean_launch_log():
    launcher.reset_launch_log(forget_defined=True)
    yield
    launcher.reset_launch_log(forget_defined=True)
