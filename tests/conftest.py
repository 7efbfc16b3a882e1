"""Shared test configuration: hardware markers skip cleanly where the hardware or tool is missing."""

from __future__ import annotations

import os
import shutil

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    has_cuda = _cuda_available()
    has_nvcc = shutil.which("nvcc") is not None
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_nvcc = pytest.mark.skip(reason="needs nvcc on PATH")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "nvcc" in item.keywords and not has_nvcc:
            item.add_marker(skip_nvcc)


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory, monkeypatch):
    """Keep the results store and caches of every test out of the user's home.

    Parallel test workers (pytest-xdist) share one cache root, as the evaluations of one machine do: its
    device lock then makes their timed measurements take turns instead of overlapping."""
    root = tmp_path_factory.getbasetemp()
    shared = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    monkeypatch.setenv("CUDAL1_STORE", str(root / "store" / "results.sqlite"))
    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(shared / "cache"))
