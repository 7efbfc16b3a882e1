"""Tests of cudal1.report.plots: which plots are planned, PNG validity, determinism, missing matplotlib."""

from __future__ import annotations

import struct
import sys

import pytest

from cudal1.core.errors import MissingDependencyError
from cudal1.metrics.rows import ResultRow
from cudal1.report.plots import CDF_PLOT, LEVEL_PLOT, SOL_PLOT, has_sol, planned_plots, render_plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_planned_plots_follow_the_data(rows):
    assert [p.name for p in planned_plots(rows)] == [CDF_PLOT, LEVEL_PLOT, SOL_PLOT]
    no_sol = [ResultRow("a", status="correct", speedup=1.5)]
    assert [p.name for p in planned_plots(no_sol)] == [CDF_PLOT, LEVEL_PLOT]
    # SOL of a wrong kernel is meaningless, and failures leave nothing to plot.
    failed = [ResultRow("a", status="incorrect", sol={"reference": 0.1, "candidate": 0.9})]
    assert not has_sol(failed[0])
    assert planned_plots(failed) == []
    assert planned_plots([]) == []


def test_render_plots_gives_pngs_of_the_planned_size(pngs):
    assert list(pngs) == [CDF_PLOT, LEVEL_PLOT, SOL_PLOT]
    assert _png_size(pngs[CDF_PLOT]) == (700, 450)
    assert _png_size(pngs[LEVEL_PLOT]) == (700, 450)
    assert _png_size(pngs[SOL_PLOT]) == (550, 550)


def test_render_plots_is_deterministic(rows, pngs):
    again = render_plots(rows)
    assert again == pngs
    assert all(b"Software" not in data and b"matplotlib" not in data for data in again.values())


def test_render_plots_without_matplotlib(monkeypatch, rows):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingDependencyError, match=r"cudal1\[report\]"):
        render_plots(rows)
