"""The CPU's physical floor rests on the best one-core bandwidth this machine measured (cudal1.eval.clock.measure)."""

from __future__ import annotations

import json
import platform

from cudal1.eval.clock import measure


def test_a_measurement_on_a_busy_moment_does_not_lower_the_machines_best(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path))  # the test's own: other tests' floors stay as measured
    monkeypatch.setattr(measure, "_core_bandwidth_seen", 0.0)
    first = measure.core_bandwidth_gbps()
    stored = json.loads(measure._core_bandwidth_path().read_text())
    assert stored[platform.node()] == first > 0
    # A later process (nothing seen yet) on a loaded machine: its copies all slow. The stored best stands.
    monkeypatch.setattr(measure, "_core_bandwidth_seen", 0.0)
    measure._store_core_bandwidth(first * 10)
    assert measure.core_bandwidth_gbps() == first * 10
    measure._core_bandwidth_path().write_text("{not json")  # a broken file is a fresh start, not an error
    monkeypatch.setattr(measure, "_core_bandwidth_seen", 0.0)
    assert measure.core_bandwidth_gbps() > 0


def test_the_floor_of_a_long_reduction_lies_below_one_thread_reading_its_input():
    """The honest `torch_mean_rewrite` (8 x 2**20 floats) was rejected as below the floor on a loaded host when the
    floor came from a multi-threaded 8 MB copy. On one core, the floor of its 32 MB must lie below the time one
    thread takes to read them here, however busy this machine is (load only slows the read)."""
    import numpy as np

    x = np.ones(8 * 2**20, dtype=np.float32)
    read_s = min(_timed(x.sum) for _ in range(3))
    floor_s = x.nbytes / (measure.FLOOR_BANDWIDTH_MARGIN["cpu"] * measure.core_bandwidth_gbps() * 1e9)
    assert floor_s < read_s, (floor_s, read_s)


def _timed(fn) -> float:
    import time

    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
