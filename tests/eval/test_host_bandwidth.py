"""The CPU's physical floor rests on the best host bandwidth this machine measured (cudal1.eval.measure)."""

from __future__ import annotations

import json
import platform

from cudal1.eval import measure


def test_a_measurement_on_a_busy_moment_does_not_lower_the_machines_best(monkeypatch):
    monkeypatch.setattr(measure, "_host_bandwidth_seen", 0.0)
    first = measure.host_bandwidth_gbps()
    stored = json.loads(measure._host_bandwidth_path().read_text())
    assert stored[platform.node()] == first > 0
    # A later process (nothing seen yet) on a loaded machine: its copies all slow. The stored best stands.
    monkeypatch.setattr(measure, "_host_bandwidth_seen", 0.0)
    measure._store_host_bandwidth(first * 10)
    assert measure.host_bandwidth_gbps() == first * 10
    measure._host_bandwidth_path().write_text("{not json")  # a broken file is a fresh start, not an error
    monkeypatch.setattr(measure, "_host_bandwidth_seen", 0.0)
    assert measure.host_bandwidth_gbps() > 0
