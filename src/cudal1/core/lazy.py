"""Package faces whose names load on first use (PEP 562).

A runner imports a leaf module (`cudal1.tasks.task`, `cudal1.analysis.cuda_source`) and, through its package's
`__init__`, nothing else: the package's public names are looked up only when asked for.

    _EXPORTS = {"Task": "cudal1.tasks.task"}
    __all__ = sorted(_EXPORTS)
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`(__getattr__, __dir__)` for `package`: each name of `exports` is imported from its module on first use
    (`__all__` stays a literal in the package, where linters read it)."""
    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
