"""The size-expression evaluator: values, and hostile inputs refused with a message naming the construct."""

from __future__ import annotations

import pytest

from cudal1.kernel_form.errors import ExpressionError
from cudal1.kernel_form.expressions import MAX_EXPRESSION_CHARS, evaluate, parse_expression

DIMS = {"N": 1000, "BATCH": 64, "DIM": 128}


@pytest.mark.parametrize(("text", "value"), [
    ("ceil_div(N, 256)", 4), ("ceil_div(1024, 256)", 4), ("BATCH * DIM", 8192), ("N // 3", 333), ("N % 7", 6),
    ("min(N, 512)", 512), ("max(N, 2048, 4)", 2048), ("-(-N)", 1000), ("(BATCH + 1) * 2 - 1", 129),
    ("ceil_div(BATCH * DIM, 4 * 256)", 8), ("7", 7)])
def test_values(text, value):
    assert evaluate(text, DIMS) == value


def test_an_int_passes_through_and_the_names_read_are_listed():
    assert evaluate(256, DIMS) == 256
    assert parse_expression("ceil_div(N, BATCH) + DIM").names == frozenset({"N", "BATCH", "DIM"})


@pytest.mark.parametrize(("text", "message"), [
    ('__import__("os")', "calling '__import__' is not allowed"),
    ('__import__("os").system("id")', "is not allowed"),
    ("N.bit_length()", "calling 'N.bit_length' is not allowed"),
    ("N.real", "Attribute"),
    ("().__class__", "Attribute"),
    ("2 ** 100000", "'**' is not allowed"),
    ("pow(2, 64)", "calling 'pow' is not allowed"),
    ("N / 2", "'/' (use '//' or ceil_div) is not allowed"),
    ("1 << 62", "'<<' is not allowed"),
    ("x[0]", "Subscript"),
    ("lambda: 1", "Lambda"),
    ("N if N else 1", "IfExp"),
    ("1.5 * N", "the literal 1.5 is not allowed"),
    ("'a' * 10", "the literal 'a' is not allowed"),
    ("True + 1", "the literal True is not allowed"),
    ("ceil_div(N)", "ceil_div takes 2 arguments"),
    ("min(N)", "min takes at least 2 arguments"),
    ("max(*[1, 2])", "keyword or starred arguments"),
    ("min(N, key=1)", "keyword or starred arguments"),
    ("N = 3", "not an expression"),
    ("", "an empty expression"),
    ("M * 2", "unknown name 'M' (the task's dimensions: BATCH, DIM, N)"),
    ("9" * 30, "a value leaves the 64-bit range"),
    ("N * " * 20 + "N", "nested deeper than"),
    ("-" * 40 + "N", "nested deeper than"),
    ("min(" * 20 + "N" + ",1)" * 20, "nested deeper than"),
    ("(" * 150 + "N" + ")" * 150, f"at most {MAX_EXPRESSION_CHARS}"),
    ("N + " * 60 + "N", f"at most {MAX_EXPRESSION_CHARS}"),
])
def test_hostile_or_malformed_expressions_are_refused(text, message):
    with pytest.raises(ExpressionError) as info:
        evaluate(text, DIMS)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("text", "dims", "message"), [
    ("N // (N - 1000)", DIMS, "division by zero"), ("N % 0", DIMS, "division by zero"),
    ("ceil_div(N, N - N)", DIMS, "ceil_div by zero"),
    ("N * N * N * N * N * N * N", DIMS, "a value leaves the 64-bit range"),
    ("N + 1", {"N": 2**63}, "a value leaves the 64-bit range"),
    ("N + 1", {"N": 1.5}, "is 1.5, not an integer")])
def test_evaluation_errors(text, dims, message):
    with pytest.raises(ExpressionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_expression(text).evaluate(dims)


def test_a_name_missing_at_evaluation_is_named():
    with pytest.raises(ExpressionError, match="no value for the dimension 'K'"):
        parse_expression("K + 1").evaluate(DIMS)
