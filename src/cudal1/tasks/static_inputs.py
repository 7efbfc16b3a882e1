"""A reference's init inputs read from its syntax tree, never by running it.

The trusted side needs them (lazy builds in `ModelNew.__init__` happen in the compile pool, which keys the
build on them) but must not execute reference code: a reward-server request may carry its own reference.
KernelBench-style tasks return module-level constants from `get_init_inputs`, which this reads; anything
else is None, and the build then happens in the candidate's own sandboxed evaluation.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
               ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_MAX_EXPONENT = 64
_MAX_BITS = 64  # sizes, not bignums: a chain of squarings must not exhaust the trusted side's memory
_UNKNOWN = object()
def _constant_value(node: ast.AST, names: dict[str, Any]) -> Any:
    """The value of a constant expression (literals, known names, arithmetic, lists and tuples of them);
    raises ValueError for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int, float, str)):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        values = [_constant_value(e, names) for e in node.elts]
        return values if isinstance(node, ast.List) else tuple(values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _constant_value(node.operand, names)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _constant_value(node.left, names), _constant_value(node.right, names)
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right))
        if numbers and not (isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT):
            try:
                value = _ARITHMETIC[type(node.op)](left, right)
            except ArithmeticError:
                value = None
            if isinstance(value, float) or (isinstance(value, int) and value.bit_length() <= _MAX_BITS):
                return value
    raise ValueError(f"not a constant expression: {ast.dump(node)[:80]}")


def static_init_inputs(source: str) -> list[Any] | None:
    """`get_init_inputs()` of a reference (full sizes), read from its syntax tree without executing anything:
    the list it returns when its body is one `return` of literals and module-level constants; None when that
    cannot be told without running code (the build then happens in the candidate's own evaluation)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    if any(isinstance(n, (ast.Global, ast.Nonlocal)) for n in ast.walk(tree)):
        return None  # a function may rebind the constants at run time
    names: dict[str, Any] = {}
    function: ast.FunctionDef | None = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            try:
                value = _constant_value(node.value, names)
            except ValueError:
                value = _UNKNOWN
            names.update({t.id: value for t in node.targets})
        elif isinstance(node, ast.FunctionDef) and node.name == "get_init_inputs":
            function = node
        else:
            for bound in ast.walk(node):  # whatever else binds a name at module level makes it unknown
                if isinstance(bound, ast.Name) and isinstance(bound.ctx, ast.Store):
                    names[bound.id] = _UNKNOWN
                elif isinstance(bound, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names[bound.name] = _UNKNOWN
                elif isinstance(bound, ast.alias):
                    names[(bound.asname or bound.name).split(".")[0]] = _UNKNOWN
    if function is None or function.args.args or function.args.vararg or function.decorator_list:
        return None
    body = [s for s in function.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return None
    known = {k: v for k, v in names.items() if v is not _UNKNOWN}
    try:
        value = _constant_value(body[0].value, known)
    except ValueError:
        return None
    return list(value) if isinstance(value, (list, tuple)) else None
