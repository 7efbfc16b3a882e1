"""A safe evaluator for the launch spec's size expressions (`ceil_div(N, 256)`, `BATCH * DIM * 4`).

The expression is parsed with `ast` and walked over a whitelist; nothing is ever passed to `eval`:
- integer literals (no floats, no strings, no booleans), names of the task's dimensions (given by the caller);
- binary `+ - * // %`, unary `-` and `+`, parentheses;
- calls of `min(a, b, ...)`, `max(a, b, ...)` and `ceil_div(a, b)` by plain name, positional arguments only.
Everything else (attribute access, subscripts, `**`, `/`, comparisons, lambdas, any other call) is refused with
an `ExpressionError` that names the construct. Sizes are bounded: at most `MAX_EXPRESSION_CHARS` characters
(checked before parsing, so deep nesting cannot exhaust the parser), `MAX_NODES` syntax nodes, depth
`MAX_DEPTH`, and every intermediate value within `[-2**63, 2**63)`.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping

from cudal1.kernel_form.errors import ExpressionError

MAX_EXPRESSION_CHARS = 200
MAX_NODES = 64
MAX_DEPTH = 16
VALUE_LIMIT = 2**63  # every intermediate value lies in [-VALUE_LIMIT, VALUE_LIMIT)
FUNCTIONS = ("min", "max", "ceil_div")

_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}
_REFUSED_OPS = {ast.Pow: "'**'", ast.Div: "'/' (use '//' or ceil_div)", ast.LShift: "'<<'", ast.RShift: "'>>'",
                ast.BitAnd: "'&'", ast.BitOr: "'|'", ast.BitXor: "'^'", ast.MatMult: "'@'"}


def _checked(value: int, text: str) -> int:
    if not -VALUE_LIMIT <= value < VALUE_LIMIT:
        raise ExpressionError(f"{text!r}: a value leaves the 64-bit range")
    return value


def _ceil_div(a: int, b: int, text: str) -> int:
    if b == 0:
        raise ExpressionError(f"{text!r}: ceil_div by zero")
    return -((-a) // b)


class _Checker:
    """Walks a parsed expression once, refusing anything off the whitelist, and collects its names."""

    def __init__(self, text: str, allowed_names: set[str] | None):
        self.text = text
        self.allowed = allowed_names
        self.names: set[str] = set()
        self.count = 0

    def fail(self, what: str) -> ExpressionError:
        return ExpressionError(f"{self.text!r}: {what} is not allowed (integers, dimension names, + - * // %, "
                               "min, max, ceil_div)")

    def visit(self, node: ast.AST, depth: int) -> None:
        self.count += 1
        if self.count > MAX_NODES:
            raise ExpressionError(f"{self.text!r}: more than {MAX_NODES} terms")
        if depth > MAX_DEPTH:
            raise ExpressionError(f"{self.text!r}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, ast.Constant):
            if type(node.value) is not int:
                raise self.fail(f"the literal {node.value!r}")
            _checked(node.value, self.text)
        elif isinstance(node, ast.Name):
            if self.allowed is not None and node.id not in self.allowed:
                known = ", ".join(sorted(self.allowed)) or "none"
                raise ExpressionError(f"{self.text!r}: unknown name {node.id!r} (the task's dimensions: {known})")
            self.names.add(node.id)
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINARY:
                raise self.fail(_REFUSED_OPS.get(type(node.op), f"the operator {type(node.op).__name__}"))
            self.visit(node.left, depth + 1)
            self.visit(node.right, depth + 1)
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.USub, ast.UAdd)):
                raise self.fail(f"the operator {type(node.op).__name__}")
            self.visit(node.operand, depth + 1)
        elif isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
                called = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)[:40]
                raise self.fail(f"calling {called!r}")
            if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
                raise self.fail(f"{node.func.id} with keyword or starred arguments")
            want_two = node.func.id == "ceil_div"
            if (want_two and len(node.args) != 2) or (not want_two and len(node.args) < 2):
                raise ExpressionError(f"{self.text!r}: {node.func.id} takes "
                                      f"{'2 arguments' if want_two else 'at least 2 arguments'}")
            for arg in node.args:
                self.visit(arg, depth + 1)
        else:
            raise self.fail(f"{type(node).__name__} ({ast.unparse(node)[:40]!r})")


class SizeExpression:
    """A checked expression; `evaluate(dims)` gives its integer value. Build with `parse_expression`."""

    def __init__(self, text: str, tree: ast.Expression, names: frozenset[str]):
        self.text = text
        self._tree = tree
        self.names = names  # the dimension names it reads

    def __repr__(self) -> str:
        return f"SizeExpression({self.text!r})"

    def evaluate(self, dims: Mapping[str, int]) -> int:
        """The value for the given dimensions (ExpressionError for a missing name, a zero divisor, overflow)."""
        return self._eval(self._tree.body, dims)

    def _eval(self, node: ast.AST, dims: Mapping[str, int]) -> int:
        text = self.text
        if isinstance(node, ast.Constant):
            return int(node.value)
        if isinstance(node, ast.Name):
            if node.id not in dims:
                raise ExpressionError(f"{text!r}: no value for the dimension {node.id!r}")
            value = dims[node.id]
            if type(value) is not int:
                raise ExpressionError(f"{text!r}: the dimension {node.id!r} is {value!r}, not an integer")
            return _checked(value, text)
        if isinstance(node, ast.UnaryOp):
            value = self._eval(node.operand, dims)
            return _checked(-value if isinstance(node.op, ast.USub) else value, text)
        if isinstance(node, ast.BinOp):
            a, b = self._eval(node.left, dims), self._eval(node.right, dims)
            op = type(node.op)
            if op in (ast.FloorDiv, ast.Mod) and b == 0:
                raise ExpressionError(f"{text!r}: division by zero")
            result = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                      ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b}[op]()
            return _checked(result, text)
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        args = [self._eval(a, dims) for a in node.args]
        if node.func.id == "ceil_div":
            return _checked(_ceil_div(args[0], args[1], text), text)
        return min(args) if node.func.id == "min" else max(args)


def parse_expression(text: str, allowed_names: set[str] | frozenset[str] | None = None) -> SizeExpression:
    """Parse and check `text`; `allowed_names` (when given) are the only names it may read."""
    if not isinstance(text, str):
        raise ExpressionError(f"an expression must be a string, got {type(text).__name__}")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"an expression of {len(text)} characters; at most {MAX_EXPRESSION_CHARS}")
    if not text.strip():
        raise ExpressionError("an empty expression")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        reason = exc.msg if isinstance(exc, SyntaxError) else type(exc).__name__
        raise ExpressionError(f"{text!r}: not an expression ({reason})") from None
    checker = _Checker(text, set(allowed_names) if allowed_names is not None else None)
    checker.visit(tree.body, 1)
    return SizeExpression(text, tree, frozenset(checker.names))


@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> SizeExpression:
    """`parse_expression(text)` once per text: a spec's expressions are evaluated on every call of the launcher."""
    return parse_expression(text)


def evaluate(value: int | str, dims: Mapping[str, int]) -> int:
    """An int as is, or a string expression evaluated for `dims` (names limited to `dims`)."""
    if type(value) is int:
        return _checked(value, str(value))
    expression = _parsed(value) if isinstance(value, str) else parse_expression(value)
    unknown = sorted(expression.names - dims.keys())
    if unknown:
        known = ", ".join(sorted(dims)) or "none"
        raise ExpressionError(f"{value!r}: unknown name {unknown[0]!r} (the task's dimensions: {known})")
    return expression.evaluate(dims)
