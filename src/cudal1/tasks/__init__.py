"""Tasks (reference modules in KernelBench format), their loaders and the built-in suite.

The names below are loaded on first use: a runner imports `cudal1.tasks.task` (the reference's loader)
and, through this package, none of the loaders (`sources`), the hub or the schemas.
"""

from __future__ import annotations

from cudal1.core.lazy import lazy_exports

_EXPORTS = {
    "Task": "cudal1.tasks.task", "Candidate": "cudal1.tasks.task", "Reference": "cudal1.tasks.task",
    "load_reference": "cudal1.tasks.task", "source_hash": "cudal1.tasks.task",
    "load_tasks": "cudal1.tasks.sources", "load_release": "cudal1.tasks.sources",
    "load_candidates": "cudal1.tasks.sources", "find_task": "cudal1.tasks.sources",
    "builtin_examples": "cudal1.tasks.sources",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
