"""Which cases of a parametrized test every run takes, and which only `-m slow` takes.

The default run (README's test command, CI) must stay well under 20 minutes on 2 cores, and each evaluation
on a CPU costs 8-40 s (runners started in the sandbox, trials, timing). Families of evaluations whose cases
exercise one mechanism keep a representative few in every run; the rest run with `-m slow` (before a change
to the evaluator, and on the GPU machine)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest


def quick_few(values: Iterable[Any], quick: Iterable[Any]) -> list[Any]:
    """`values` as pytest params, those not in `quick` marked slow (a tuple value is one case's arguments)."""
    keep = set(quick)
    out = []
    for value in values:
        args = value if isinstance(value, tuple) else (value,)
        out.append(pytest.param(*args, marks=() if value in keep else pytest.mark.slow))
    missing = keep - set(values)
    assert not missing, f"quick cases that are not cases: {missing}"
    return out
