"""The schema of the protocol's messages: field types and their limits, checked at decode.

Every field of a message (`protocol.py`) is checked against its annotation (`check`): what a runner sends is
hostile input, so nothing reaches the parent's arithmetic that is not the type and range it expects. Defaults,
where an annotation says nothing more: a float is finite, an int fits 64 bits, a string holds at most
`MAX_TEXT` characters, a list or dict at most `MAX_ITEMS` items, and an `Any` value is a JSON tree of bounded
depth and size (`check_tree`). Limits beyond those are `Annotated` markers (`Range`, `MaxLen`, `OneOf`,
`NonFinite`, `Tree`, `Descriptors`). Trees are walked without recursion, so a sender cannot exhaust the
parent's stack.
"""

from __future__ import annotations

import functools
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any


class MalformedMessage(ValueError):
    """A message that is not one of the protocol's (unknown op, wrong, missing or unknown field, a number out of
    its range, a value beyond its size limits)."""


class _WrongType(MalformedMessage):
    """A value of another JSON kind than its field's."""


#: Default limits of a field (see above).
MAX_TEXT = 16 * 1024
MAX_ITEMS = 4096
MAX_INT = 2**63
#: An `Any` value: at most this deep and this many nodes (descriptor trees, constants, a mismatch report).
MAX_TREE_DEPTH = 32
MAX_TREE_NODES = 20_000
#: The longest source a request carries (a candidate's or a reference's module), in characters: the channel's
#: own limit on a message bounds it further.
MAX_SOURCE_CHARS = 4 * 1024 * 1024
#: The longest time any step of an evaluation may report (a day), in milliseconds; a step's own limit is
#: the parent's to check against its clock.
MAX_MS = 86_400_000.0


@dataclass(frozen=True)
class Range:
    """A number between `lo` and `hi` (`lo_open`: strictly above `lo`)."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False

    def check(self, value: float, where: str) -> None:
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            raise MalformedMessage(f"{where} is {value:g}, not {'above' if self.lo_open else 'at least'} {self.lo:g}")
        if self.hi is not None and value > self.hi:
            raise MalformedMessage(f"{where} is {value:g}, above its limit {self.hi:g}")


@dataclass(frozen=True)
class MaxLen:
    """A string of at most `n` characters, or a list or dict of at most `n` items."""

    n: int


@dataclass(frozen=True)
class OneOf:
    """A string that is one of `values`."""

    values: tuple[str, ...]


@dataclass(frozen=True)
class NonFinite:
    """A float that may be inf or NaN (a measured error that overflowed: figures of trusted processes)."""


@dataclass(frozen=True)
class Tree:
    """An `Any` value with limits of its own (`check_tree`)."""

    depth: int = MAX_TREE_DEPTH
    nodes: int = MAX_TREE_NODES
    text: int = MAX_TEXT  # characters per string


#: Times a step reports: finite, above zero, at most a day.
Ms = Annotated[float, Range(0.0, MAX_MS, lo_open=True)]
#: Times that may be zero (a CPU clock, an empty span).
NonNegMs = Annotated[float, Range(0.0, MAX_MS)]
#: Counts and sizes.
Count = Annotated[int, Range(0, MAX_INT - 1)]
#: A measured error of a trusted process (may have overflowed).
Measured = Annotated[float, NonFinite()]


def check_tree(value: Any, where: str, depth: int = MAX_TREE_DEPTH, nodes: int = MAX_TREE_NODES,
               text: int = MAX_TEXT) -> Any:
    """`value` if it is a JSON tree (None, bool, int, float, str, list, dict with string keys) at most `depth`
    deep and `nodes` large, with strings of at most `text` characters and ints that fit 64 bits; else
    MalformedMessage. Iterative: no recursion for the sender to exhaust. Floats may be inf or NaN (a model's
    constant may be); whoever reads a number from a tree checks it."""
    todo: list[tuple[Any, int]] = [(value, 1)]
    seen = 0
    while todo:
        item, level = todo.pop()
        seen += 1
        if seen > nodes:
            raise MalformedMessage(f"{where} holds more than {nodes} values")
        if level > depth:
            raise MalformedMessage(f"{where} is nested deeper than {depth}")
        if item is None or isinstance(item, (bool, float)):
            continue
        if isinstance(item, int):
            if not -MAX_INT <= item < MAX_INT:
                raise MalformedMessage(f"{where} holds an integer beyond 64 bits")
        elif isinstance(item, str):
            if len(item) > text:
                raise MalformedMessage(f"{where} holds a string of {len(item)} characters (limit {text})")
        elif isinstance(item, list):
            todo.extend((v, level + 1) for v in item)
        elif isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str) or len(k) > MAX_TEXT:
                    raise MalformedMessage(f"{where} holds a key that is not a short string")
                todo.append((v, level + 1))
        else:
            raise MalformedMessage(f"{where} holds a {type(item).__name__}")
    return value


@dataclass(frozen=True)
class Descriptors:
    """A descriptor tree of an arena (`arena.pack`): checked node by node (`check_descriptors`)."""


#: Keys of each kind of descriptor node, and how deep and large a tree may be (a model's nested outputs).
_NODE_KEYS = {"tensor": {"t", "offset", "nbytes", "dtype", "shape", "device", "cls"},
              "seq": {"t", "type", "items"}, "value": {"t", "v"}, "opaque": {"t", "type", "repr"}}
MAX_DESCRIPTOR_DEPTH = 16
MAX_DESCRIPTOR_NODES = 4096
_DTYPE_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
_OFFSET = Annotated[int, Range(-1, MAX_INT - 1)]
_DTYPE = Annotated[str, MaxLen(32)]
_SHAPE = Annotated[list[Count], MaxLen(64)]
_DEVICE = Annotated[str, MaxLen(16)]
_NAME = Annotated[str, MaxLen(100)]
_REPR = Annotated[str, MaxLen(1000)]


def check_descriptors(tree: Any, where: str) -> Any:
    """`tree` if it is a well-formed descriptor tree (module `arena`: tensor, seq, value and opaque nodes with
    their fields only, typed and in range), at most `MAX_DESCRIPTOR_DEPTH` deep and `MAX_DESCRIPTOR_NODES`
    large; else MalformedMessage. Iterative, as `check_tree`."""
    todo: list[tuple[Any, int]] = [(tree, 1)]
    seen = 0
    while todo:
        node, level = todo.pop()
        seen += 1
        if seen > MAX_DESCRIPTOR_NODES or level > MAX_DESCRIPTOR_DEPTH:
            raise MalformedMessage(f"{where} is larger or deeper than a descriptor tree may be "
                                   f"({MAX_DESCRIPTOR_NODES} nodes, {MAX_DESCRIPTOR_DEPTH} levels)")
        kind = node.get("t") if isinstance(node, dict) else None
        if not isinstance(kind, str) or kind not in _NODE_KEYS or set(node) - _NODE_KEYS[kind]:
            raise MalformedMessage(f"{where} holds a malformed descriptor")
        if kind == "tensor":
            check(node.get("offset"), _OFFSET, f"{where}.offset")
            check(node.get("nbytes"), Count, f"{where}.nbytes")
            dtype = check(node.get("dtype"), _DTYPE, f"{where}.dtype")
            if not _DTYPE_NAME.fullmatch(dtype):
                raise MalformedMessage(f"{where}.dtype is not a dtype's name")
            check(node.get("shape"), _SHAPE, f"{where}.shape")
            check(node.get("device", "cpu"), _DEVICE, f"{where}.device")
            check(node.get("cls", "Tensor"), _NAME, f"{where}.cls")
        elif kind == "seq":
            check(node.get("type"), _NAME, f"{where}.type")
            items = node.get("items")
            if not isinstance(items, list):
                raise MalformedMessage(f"{where}.items is not a list")
            todo.extend((item, level + 1) for item in items)
        elif kind == "value":
            check_tree(node.get("v"), f"{where}.v", depth=1, nodes=1)
        else:
            check(node.get("type"), _NAME, f"{where}.type")
            check(node.get("repr", ""), _REPR, f"{where}.repr")
    return tree


@dataclass(frozen=True)
class _Spec:
    """A field type taken apart once (`_spec`): its base type, origin, arguments and limits."""

    hint: Any
    origin: Any
    args: tuple[Any, ...]
    descriptors: bool
    tree: Tree | None
    max_len: int | None
    one_of: tuple[str, ...] | None
    ranges: tuple[Range, ...]
    non_finite: bool


@functools.cache
def _spec(hint: Any) -> _Spec:
    limits: tuple[Any, ...] = ()
    if typing.get_origin(hint) is Annotated:
        hint, *extra = typing.get_args(hint)
        limits = tuple(extra)
    return _Spec(hint=hint, origin=typing.get_origin(hint), args=typing.get_args(hint),
                 descriptors=any(isinstance(m, Descriptors) for m in limits),
                 tree=next((m for m in limits if isinstance(m, Tree)), None),
                 max_len=next((m.n for m in limits if isinstance(m, MaxLen)), None),
                 one_of=next((m.values for m in limits if isinstance(m, OneOf)), None),
                 ranges=tuple(m for m in limits if isinstance(m, Range)),
                 non_finite=any(isinstance(m, NonFinite) for m in limits))


def check(value: Any, hint: Any, where: str) -> Any:
    """`value` if it has the type and limits `hint` describes (JSON kinds only), else MalformedMessage."""
    spec = _spec(hint)
    hint, origin = spec.hint, spec.origin
    if spec.descriptors:
        return check_descriptors(value, where)
    if hint is Any or spec.tree is not None:
        kind = {dict: dict, list: list}.get(origin or hint)
        if kind is not None and not isinstance(value, kind):
            raise _WrongType(f"{where}: expected {kind.__name__}, got {type(value).__name__}")
        tree = spec.tree or Tree()
        return check_tree(value, where, tree.depth, tree.nodes, tree.text)
    if isinstance(hint, type) and hasattr(hint, "decode"):  # a message class (`protocol.Message`) inside
        return hint.decode(value, where)
    if origin is typing.Union or origin is types.UnionType:
        for option in spec.args:  # the first option of the value's JSON kind decides (its errors say why)
            if _kind_of(option, value):
                return check(value, option, where)
        raise _WrongType(f"{where}: unexpected {type(value).__name__}")
    max_len = spec.max_len
    if hint is type(None):
        if value is None:
            return None
    elif hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not -MAX_INT <= value < MAX_INT:
                raise MalformedMessage(f"{where} is an integer beyond 64 bits")
            for r in spec.ranges:
                r.check(value, where)
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(value, int) and not -MAX_INT <= value < MAX_INT:
                raise MalformedMessage(f"{where} is a number beyond 64 bits")
            number = float(value)
            if not math.isfinite(number):
                if spec.non_finite:
                    return number
                raise MalformedMessage(f"{where} is not finite")
            for r in spec.ranges:
                r.check(number, where)
            return number
    elif hint is str:
        if isinstance(value, str):
            if len(value) > (max_len or MAX_TEXT):
                raise MalformedMessage(f"{where} has {len(value)} characters (limit {max_len or MAX_TEXT})")
            if spec.one_of is not None and value not in spec.one_of:
                raise MalformedMessage(f"{where} is {value[:40]!r}, not one of {', '.join(spec.one_of)}")
            return value
    elif origin is list or hint is list:
        if isinstance(value, list):
            if len(value) > (max_len or MAX_ITEMS):
                raise MalformedMessage(f"{where} has {len(value)} items (limit {max_len or MAX_ITEMS})")
            return [check(v, spec.args[0], f"{where}[{i}]") for i, v in enumerate(value)] if spec.args else \
                check_tree(value, where)
    elif origin is dict or hint is dict:
        if isinstance(value, dict) and all(isinstance(k, str) and len(k) <= 256 for k in value):
            if len(value) > (max_len or MAX_ITEMS):
                raise MalformedMessage(f"{where} has {len(value)} keys (limit {max_len or MAX_ITEMS})")
            return {k: check(v, spec.args[1], f"{where}.{k}") for k, v in value.items()} if spec.args else \
                check_tree(value, where)
    else:  # pragma: no cover - a field type this module does not support is a programming error
        raise TypeError(f"unsupported field type {hint!r}")
    raise _WrongType(f"{where}: expected {getattr(hint, '__name__', hint)}, got {type(value).__name__}")


def _kind_of(hint: Any, value: Any) -> bool:
    """Whether `value` is of the JSON kind `hint` takes (a union's options are told apart by it)."""
    base = _spec(hint).hint
    origin = typing.get_origin(base) or base
    if base is Any:
        return True
    if base is type(None):
        return value is None
    if base is bool:
        return isinstance(value, bool)
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if base is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is dict or (isinstance(base, type) and hasattr(base, "decode")):
        return isinstance(value, dict)
    return isinstance(value, origin) if isinstance(origin, type) else True
