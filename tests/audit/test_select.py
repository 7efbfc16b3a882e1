"""Which release items an audit covers: levels, per-level samples, limits and round-robin chunks."""

from __future__ import annotations

import pytest

from cudal1.audit.select import chunk_items, parse_chunk, select_items
from cudal1.core.errors import ConfigError
from cudal1.tasks import Candidate, Task


def _pairs(n_per_level=5, levels=(1, 2, 3)):
    out = []
    for level in levels:
        for i in range(n_per_level):
            tid = f"r/level{level}/{i}"
            out.append((Task(id=tid, source=f"# {tid}", level=level), Candidate(task_id=tid, source=f"c {tid}")))
    out.append((Task(id="r/level1/none", source="x", level=1), None))
    return out


def test_parse_chunk():
    assert parse_chunk("2/5") == (2, 5)
    assert parse_chunk(None) is None and parse_chunk("") is None
    for bad in ("0/3", "4/3", "x/2", "3"):
        with pytest.raises(ConfigError):
            parse_chunk(bad)


def test_selection_filters_samples_and_limits_deterministically():
    pairs = _pairs()
    assert len(select_items(pairs)) == 15  # the row without a candidate is skipped
    assert {t.level for t, _ in select_items(pairs, levels=[2])} == {2}
    sample = select_items(pairs, sample_per_level=2, seed=7)
    assert [t.level for t, _ in sample] == [1, 1, 2, 2, 3, 3]
    assert sample == select_items(pairs, sample_per_level=2, seed=7)
    assert sample != select_items(pairs, sample_per_level=2, seed=8)
    assert len(select_items(pairs, limit=4)) == 4


def test_chunks_cover_the_selection_exactly_once():
    items = select_items(_pairs())
    chunks = [chunk_items(items, (i, 4)) for i in range(1, 5)]
    flat = [t.id for c in chunks for t, _ in c]
    assert sorted(flat) == sorted(t.id for t, _ in items)
    assert max(len(c) for c in chunks) - min(len(c) for c in chunks) <= 1
    assert chunk_items(items, None) == items
