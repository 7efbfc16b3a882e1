"""Tasks (reference modules in KernelBench format), their loaders and the built-in suite.

The names below are loaded on first use: a runner imports `cudal1.tasks.task` (the reference's loader)
and, through this package, none of the loaders (`sources`), the hub or the schemas.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Task": "cudal1.tasks.task", "Candidate": "cudal1.tasks.task", "Reference": "cudal1.tasks.task",
    "load_reference": "cudal1.tasks.task", "source_hash": "cudal1.tasks.task",
    "load_tasks": "cudal1.tasks.sources", "load_release": "cudal1.tasks.sources",
    "load_candidates": "cudal1.tasks.sources", "find_task": "cudal1.tasks.sources",
    "builtin_examples": "cudal1.tasks.sources",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cudal1.tasks' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
