"""The task model: a reference PyTorch module in KernelBench format, and candidates that replace it.

A task source is a self-contained Python module with `class Model(nn.Module)`, module-level size
constants, `get_inputs()` and `get_init_inputs()`. `load_reference` executes it in a fresh module
namespace (reference code is trusted input); candidate code is only ever handled as text here and is
executed by the evaluator's isolated runners.

Built-in tasks may define `SMALL_SIZES = {"CONST": value, ...}`: overrides of their size constants for a
small problem (CPU runs and tests). `load_reference(..., sizes="small")` applies them.
"""

from __future__ import annotations

import ast
import hashlib
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cudal1.core.errors import TaskError
from cudal1.core.syntax import parse as parse_python

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")


def source_hash(source: str) -> str:
    """Content hash of a source text (sha256 hex). Defined for any str: a lone surrogate (valid in JSON, not in
    UTF-8) hashes too, so that the paths that report such a text never fail on it."""
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()


#: The largest source, reference or candidate, in UTF-8 bytes: one limit, checked where a source enters (files,
#: release rows, server requests, `evaluate_candidate`), before any runner starts. Rationale: a source crosses
#: to its sandboxed runner in one message of at most 4 MiB (`eval/shared/channel.MAX_MESSAGE_BYTES`), and JSON's
#: escapes can make it up to 6x longer (a control character becomes `\u0001`); 512 KiB is 19x the largest
#: source of the CUDA-L1 releases (27 KB). tests/eval/shared/test_channel.py keeps the two in step.
MAX_SOURCE_BYTES = 512 * 2**10


def size_problem(text: str | int) -> str | None:
    """Why `text` (or a text of this many bytes) is too large to be evaluated (over `MAX_SOURCE_BYTES`), or None."""
    size = text if isinstance(text, int) else len(text.encode("utf-8", "surrogatepass"))
    if size <= MAX_SOURCE_BYTES:
        return None
    return f"{size} bytes, over the limit of {MAX_SOURCE_BYTES} bytes (512 KiB) for a source"


def source_problem(text: str) -> str | None:
    """Why `text` cannot be evaluated as a source, or None: `text_problem`, or "it is N bytes, over the limit"."""
    problem = size_problem(text)
    return text_problem(text) or (f"it is {problem}" if problem else None)


def text_problem(text: str) -> str | None:
    """Why `text` cannot be a Python source file (a lone surrogate, which UTF-8 cannot encode; a NUL byte,
    which the compiler refuses), or None. Checked where text enters: requests, releases, candidates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"the text holds a character UTF-8 cannot encode ({text[exc.start]!a} at offset {exc.start})"
    if "\0" in text:
        return f"the text holds a NUL character (at offset {text.index(chr(0))})"
    return None


@dataclass(frozen=True)
class Task:
    """A reference module to be made faster. `id` is stable across loaders (e.g. `builtin/level1/relu`)."""

    id: str
    source: str
    level: int | None = None
    origin: str = ""  # file path, dataset name or release path it came from
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def name(self) -> str:
        return self.id.rsplit("/", 1)[-1]

    @property
    def hash(self) -> str:
        return source_hash(self.source)

    @property
    def description(self) -> str:
        """First paragraph of the module docstring (or of the Model docstring), on one line."""
        try:
            tree = parse_python(self.source)
        except SyntaxError:
            return ""
        doc = ast.get_docstring(tree)
        if not doc:
            for node in tree.body:
                if isinstance(node, ast.ClassDef) and node.name == "Model":
                    doc = ast.get_docstring(node)
        paragraph = (doc or "").strip().split("\n\n")[0]
        return " ".join(paragraph.split())

    def load(self, sizes: str = "full") -> Reference:
        return load_reference(self.source, self.id, sizes=sizes)


@dataclass(frozen=True)
class Candidate:
    """A candidate implementation (source of a module defining `ModelNew`) for a task."""

    task_id: str
    source: str
    origin: str = ""
    label: str = ""  # e.g. "cuda-l1/h100", a model name
    published: dict[str, float | None] = field(default_factory=dict, compare=False, hash=False)

    @property
    def hash(self) -> str:
        return source_hash(self.source)


@dataclass
class Reference:
    """A loaded reference module: the model class, its input factories and its size constants."""

    task_id: str
    module: types.ModuleType
    Model: type
    get_inputs: Callable[[], list[Any]]
    get_init_inputs: Callable[[], list[Any]]
    constants: dict[str, Any]


def check_syntax(source: str, task_id: str) -> ast.Module:
    """Check a task source's size, parse it and check that the required names are defined at module level."""
    too_large = size_problem(source)
    if too_large:
        raise TaskError(task_id, f"the reference cannot be evaluated: it is {too_large}")
    try:
        tree = parse_python(source)
    except SyntaxError as exc:
        raise TaskError(task_id, f"syntax error at line {exc.lineno}: {exc.msg}") from None
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.ImportFrom, ast.Import)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
    missing = [n for n in REQUIRED_NAMES if n not in defined]
    if missing:
        raise TaskError(task_id, f"missing {', '.join(missing)} (a task defines {', '.join(REQUIRED_NAMES)})")
    return tree


def module_constants(namespace: dict[str, Any]) -> dict[str, Any]:
    """Module-level numeric/string/tuple constants (the task's sizes and hyperparameters)."""
    return {k: v for k, v in namespace.items()
            if not k.startswith("_") and k != "SMALL_SIZES"
            and isinstance(v, (bool, int, float, str, tuple)) and not isinstance(v, type)}


def load_reference(source: str, task_id: str, sizes: str = "full") -> Reference:
    """Execute a reference source in a fresh module and return its parts.

    `sizes="small"` applies the task's `SMALL_SIZES` overrides (if any) to its module globals, so that
    `get_inputs()`/`get_init_inputs()` build the small problem. Raises `TaskError` with one line.
    """
    check_syntax(source, task_id)
    module = types.ModuleType(f"cudal1_task_{source_hash(source)[:12]}")
    module.__file__ = f"<task {task_id}>"
    try:
        exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102 - trusted reference
    except Exception as exc:  # noqa: BLE001 - any failure of a reference is the task's error
        raise TaskError(task_id, f"executing the reference raised {type(exc).__name__}: {exc}") from None
    ns = module.__dict__
    if sizes == "small":
        overrides = ns.get("SMALL_SIZES") or {}
        unknown = [k for k in overrides if k not in ns]
        if unknown:
            raise TaskError(task_id, f"SMALL_SIZES names unknown constants: {', '.join(unknown)}")
        ns.update(overrides)
    elif sizes != "full":
        raise TaskError(task_id, f"unknown sizes {sizes!r} (use 'full' or 'small')")
    for name in REQUIRED_NAMES:
        if not callable(ns.get(name)):
            raise TaskError(task_id, f"{name} is not callable")
    return Reference(task_id=task_id, module=module, Model=ns["Model"], get_inputs=ns["get_inputs"],
                     get_init_inputs=ns["get_init_inputs"], constants=module_constants(ns))
