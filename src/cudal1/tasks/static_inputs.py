"""A reference's init inputs read from its syntax tree, never by running it.

The trusted side needs them (lazy builds in `ModelNew.__init__` happen in the compile pool, which keys the
build on them) but must not execute reference code: a reward-server request may carry its own reference.
KernelBench-style tasks return module-level constants from `get_init_inputs`, which this reads; anything
else is None, and the build then happens in the candidate's own sandboxed evaluation.
"""

from __future__ import annotations

import ast
from typing import Any

from cudal1.analysis.constants import UNKNOWN, constant_value
from cudal1.core.syntax import parse as parse_python


def static_init_inputs(source: str) -> list[Any] | None:
    """`get_init_inputs()` of a reference (full sizes), read from its syntax tree without executing anything:
    the list it returns when its body is one `return` of literals and module-level constants; None when that
    cannot be told without running code (the build then happens in the candidate's own evaluation)."""
    try:
        tree = parse_python(source)
    except SyntaxError:
        return None
    if any(isinstance(n, (ast.Global, ast.Nonlocal)) for n in ast.walk(tree)):
        return None  # a function may rebind the constants at run time
    names: dict[str, Any] = {}
    function: ast.FunctionDef | None = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            value = constant_value(node.value, names)
            names.update({t.id: value for t in node.targets})
        elif isinstance(node, ast.FunctionDef) and node.name == "get_init_inputs":
            function = node
        else:
            for bound in ast.walk(node):  # whatever else binds a name at module level makes it unknown
                if isinstance(bound, ast.Name) and isinstance(bound.ctx, ast.Store):
                    names[bound.id] = UNKNOWN
                elif isinstance(bound, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names[bound.name] = UNKNOWN
                elif isinstance(bound, ast.alias):
                    names[(bound.asname or bound.name).split(".")[0]] = UNKNOWN
    if function is None or function.args.args or function.args.vararg or function.decorator_list:
        return None
    body = [s for s in function.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return None
    value = constant_value(body[0].value, names)  # an UNKNOWN name makes the whole value UNKNOWN
    return list(value) if isinstance(value, tuple) else None
