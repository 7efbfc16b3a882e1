"""A runtime finding's severity is stated once, in `cudal1.core.flags.RUNTIME_FLAGS`: no site builds a Flag of
a finding in that table with a severity of its own (23 sites did, and three of them disagreed with it)."""

from __future__ import annotations

import ast
from pathlib import Path

from cudal1.core import flags as F

SRC = Path(__file__).resolve().parents[2] / "src" / "cudal1"
NAMES = {name: value for name, value in vars(F).items() if isinstance(value, str) and value in F.RUNTIME_FLAGS}


def _rule_of(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "F":
        return NAMES.get(node.attr)
    return None


def test_no_site_restates_a_runtime_findings_severity():
    restated = []
    for path in SRC.rglob("*.py"):
        if path.name == "flags.py" and path.parent.name == "core":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Flag"):
                continue
            args = list(node.args) + [k.value for k in node.keywords if k.arg in ("rule", "severity")]
            rule = _rule_of(args[0]) if args else None
            literal = any(isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name)
                          and a.value.id == "Severity" for a in args[1:])
            if rule in F.RUNTIME_FLAGS and literal:
                restated.append(f"{path.relative_to(SRC)}:{node.lineno} {rule}")
    assert restated == []


def test_a_runtime_flag_carries_its_table_severity():
    for rule, kind in F.RUNTIME_FLAGS.items():
        flag = F.runtime_flag(rule, "x")
        assert flag.severity is kind.severity is F.severity_of(rule) and flag.source == "runtime"
