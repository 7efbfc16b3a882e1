"""Numeric ranges of config fields (cudal1.core.ranges)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from cudal1.core.errors import ConfigError
from cudal1.core.ranges import check_ranges, in_range


@pytest.mark.parametrize("spec, inside, outside", [
    ("> 0", [1e-9, 5], [0, -1, math.nan]),
    (">= 1", [1, 2], [0.999, math.nan]),
    ("[0, 1)", [0, 0.5], [1, -0.1, math.nan]),
    ("(0, 1]", [1, 1e-9], [0, 1.1]),
    ("< 3", [2.9], [3]),
])
def test_a_range_reads_as_written(spec, inside, outside):
    assert all(in_range(v, spec) for v in inside) and not any(in_range(v, spec) for v in outside)
    with pytest.raises(ValueError, match="not a range"):
        in_range(1, "between 0 and 1")


@dataclass
class _Config:
    rate: float = 0.1
    steps: int = 3
    limit: float | None = None


def test_check_ranges_names_the_field_and_the_range_and_refuses_every_non_finite_float():
    check_ranges(_Config(), {"rate": "> 0", "steps": ">= 1", "limit": "> 0"})
    with pytest.raises(ConfigError, match=r"^rate must be > 0, got -0.5$"):
        check_ranges(_Config(rate=-0.5), {"rate": "> 0"})
    with pytest.raises(ConfigError, match=r"^steps must be in \[1, 9\], got 10$"):
        check_ranges(_Config(steps=10), {"steps": "[1, 9]"})
    for bad in (math.nan, math.inf):
        with pytest.raises(ConfigError, match="^limit must be a finite number"):
            check_ranges(_Config(limit=bad), {})  # no range of its own: still finite
