"""The value of a constant expression in Python source, without running it: module-level sizes of a
reference or a candidate (literals, earlier constants, arithmetic, tuples and lists of them).

It runs on the trusted side on untrusted text, so every value it builds is bounded: an integer of at most
`MAX_BITS` bits, a string or tuple of at most `MAX_ITEMS` items, an exponent of at most `MAX_EXPONENT`.
Beyond that (`A = 10**64; B = A * A; C = B * B ...`, `"x" * 10**9`, `(0,) * 10**9`) the value is `UNKNOWN` instead of minutes of
work and gigabytes of memory.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

UNKNOWN: Any = object()  # what cannot be told without running code
MAX_BITS = 64  # sizes, not bignums
MAX_ITEMS = 4096  # characters of a string, items of a tuple
MAX_EXPONENT = 64

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


def _bounded(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_BITS:
        return UNKNOWN
    if isinstance(value, (str, tuple)) and len(value) > MAX_ITEMS:
        return UNKNOWN
    return value


def _binop(op: ast.operator, a: Any, b: Any) -> Any:
    # Sizes are checked before computing where the result could be huge (a power, a repeated sequence);
    # elsewhere the operands are already bounded, so the result is cheap to build and then bounded itself.
    if isinstance(op, ast.Pow) and (not isinstance(b, (int, float)) or abs(b) > MAX_EXPONENT):
        return UNKNOWN
    if isinstance(op, ast.Mult) and isinstance(b, (str, tuple)):
        a, b = b, a
    if isinstance(op, ast.Mult) and isinstance(a, (str, tuple)):
        return a * b if isinstance(b, int) and len(a) * max(b, 0) <= MAX_ITEMS else UNKNOWN
    try:
        return _bounded(_BINOPS[type(op)](a, b))
    except (ArithmeticError, TypeError, ValueError):
        return UNKNOWN


def constant_value(node: ast.AST, env: dict[str, Any]) -> Any:
    """The value of `node` given the constants in `env` (name -> value), or `UNKNOWN`. Lists and tuples both
    come back as tuples."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int, float, str)):
        return _bounded(node.value)
    if isinstance(node, ast.Name):
        return env.get(node.id, UNKNOWN)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = constant_value(node.operand, env)
        if v is UNKNOWN or isinstance(v, (str, tuple)):
            return UNKNOWN
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = constant_value(node.left, env), constant_value(node.right, env)
        return UNKNOWN if a is UNKNOWN or b is UNKNOWN else _binop(node.op, a, b)
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [constant_value(e, env) for e in node.elts]
        return UNKNOWN if any(i is UNKNOWN for i in items) else tuple(items)
    return UNKNOWN
