"""`parse`: `ast.parse` that is safe to call from several threads at once.

CPython 3.11 before 3.11.8 shares one recursion counter between threads while it turns a parse into
Python objects, and a thread switch in the middle fails the parse with `SystemError: AST constructor
recursion depth mismatch` (python/cpython#106905). Rewards are evaluated from several threads, each parsing
candidates and references, so every parse in the project goes through one lock.
"""

from __future__ import annotations

import ast
import threading

_lock = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(source, filename)`, one thread at a time (module docstring). Raises what it raises."""
    with _lock:
        return ast.parse(source, filename)
