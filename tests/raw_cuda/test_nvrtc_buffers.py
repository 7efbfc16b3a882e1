"""Regression: compiling with NVRTC must not corrupt interpreter-wide objects.

NVRTC writes its (often empty, one NUL byte) log into the buffer it is given. Handing it `b" " * size`
gives it CPython's shared one-byte `b" "` when size is 1, and writing into it changed b" " for the whole
process (seen as checkpoints that no longer loaded: torch.save builds its records with b" " somewhere).
"""

from __future__ import annotations

import pytest

from cudal1.raw_cuda import compile_only
from cudal1.raw_cuda.compiler import nvrtc_version

pytestmark = pytest.mark.skipif(nvrtc_version() is None, reason="libnvrtc not loadable")


def test_nvrtc_compile_leaves_shared_bytes_alone(tmp_path):
    compile_only('extern "C" __global__ void k(float* x) { x[0] = 1.0f; }', arch="sm_90", compiler="nvrtc",
                 use_cache=False, cache_dir=tmp_path)
    assert b" " == bytes([32])
    assert b"".join([b"a", b" ", b"b"]) == b"a b"
