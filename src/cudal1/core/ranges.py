"""Numeric ranges of config fields, kept as data beside each config: `check_ranges(config, ranges)`.

A range is written as it reads in an error: `"> 0"`, `">= 1"`, `"[0, 1)"`, `"(0, 1]"`. Every float field of a
dataclass config must also be finite (a YAML `.nan`, or `--set x=nan` read as the float it spells), whether or
not it has a range: NaN passes every comparison a hand-written check makes (`nan <= 0` is False).
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from collections.abc import Mapping
from typing import Any

from cudal1.core.errors import ConfigError

_INTERVAL = re.compile(r"^([\[(])\s*(\S+),\s*(\S+)\s*([\])])$")
_BOUND = re.compile(r"^(>=|>|<=|<)\s*(\S+)$")


def in_range(value: float, spec: str) -> bool:
    """Whether `value` lies in the range `spec` (module docstring); NaN lies in none."""
    if isinstance(value, float) and math.isnan(value):
        return False
    interval = _INTERVAL.match(spec)
    if interval:
        opening, lo, hi, closing = interval.groups()
        low, high = float(lo), float(hi)
        return (value > low if opening == "(" else value >= low) and (value < high if closing == ")" else value <= high)
    bound = _BOUND.match(spec)
    if bound is None:
        raise ValueError(f"not a range: {spec!r}")
    op, limit = bound.group(1), float(bound.group(2))
    return {">=": value >= limit, ">": value > limit, "<=": value <= limit, "<": value < limit}[op]


def _is_float_field(annotation: Any) -> bool:
    return annotation is float or float in typing.get_args(annotation)


def check_ranges(config: Any, ranges: Mapping[str, str]) -> None:
    """`ConfigError` naming the first float field of `config` that is not finite, then the first field outside
    its range in `ranges` (field name -> range); a None value (a derived default) is in every range."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if _is_float_field(hints.get(f.name)) and isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{f.name} must be a finite number, got {value}")
    for name, spec in ranges.items():
        value = getattr(config, name)
        if value is None or isinstance(value, bool):
            continue
        if not in_range(value, spec):
            raise ConfigError(f"{name} must be {'in ' if _INTERVAL.match(spec) else ''}{spec}, got {value!r}")


__all__ = ["check_ranges", "in_range"]
