"""The kernel form's launch spec: dataclasses, parsing from JSON, validation with one-line errors.

A candidate is CUDA C++ source plus this spec, data only (no candidate host code runs anywhere):

    {"format": 1, "source": "extern \"C\" __global__ void relu(...) {...}", "options": [],
     "buffers": {"x": {"input": 0}, "y": {"output": 0}},
     "workspaces": {"tmp": {"bytes": "x_numel * 4", "zero": true}},
     "steps": [{"kernel": "relu", "grid": "ceil_div(x_numel, 256)", "block": 256, "dyn_smem": 0,
                "args": [{"buf": "x"}, {"buf": "y"}, {"scalar": "x_numel", "type": "int64"}]}]}

Sizes (grid, block, dyn_smem, workspace bytes, integer scalars) are an int or an expression of the task's
dimensions (`expressions.py`): the task's module-level integer constants and, per buffer `b`, `b_numel` and
`b_dim0`, `b_dim1`, ... (`task_dims`). `parse_spec` checks the structure; `check_against_source` checks every
step against the kernel signatures in the source (count, pointer or by-value, scalar types); `SpecError` names
the field (`steps[0].args[2].type: ...`). docs/kernel_form.md is the reference.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cudal1.kernel_form.errors import ExpressionError, SpecError
from cudal1.kernel_form.expressions import parse_expression

FORMAT_VERSION = 1
MAX_SOURCE_BYTES = 512 * 1024
MAX_STEPS = 64
MAX_ARGS = 64
MAX_NAMED = 32  # buffers, workspaces
MAX_WORKSPACE_BYTES = 16 * 2**30
BUFFER_ROLES = ("input", "output", "weight")
# By-value argument types (names as in `cudal1.raw_cuda.signature.SCALAR_TYPES`).
SCALAR_TYPES = ("int32", "uint32", "int64", "uint64", "float32", "float64")
INTEGER_TYPES = ("int32", "uint32", "int64", "uint64")
# NVRTC options a candidate may pass; the arch comes from the evaluator, and nothing that links device code
# (-rdc, -dc) or reads files (-I, --pre-include) is allowed.
_OPTION_PATTERNS = (r"--use_fast_math", r"-use_fast_math", r"--extra-device-vectorization", r"-lineinfo",
                    r"--ftz=(true|false)", r"--prec-div=(true|false)", r"--prec-sqrt=(true|false)",
                    r"--fmad=(true|false)", r"-maxrregcount=\d{1,3}", r"--maxrregcount=\d{1,3}",
                    r"-D[A-Za-z_]\w{0,63}(=[\w.+-]{0,64})?", r"-std=c\+\+(17|20)")
_OPTION = re.compile("|".join(f"(?:{p})" for p in _OPTION_PATTERNS))
_IDENT = re.compile(r"[A-Za-z_]\w{0,127}")
_DIM_NAME = re.compile(r"[A-Za-z_]\w{0,63}")

Size = int | str  # a non-negative int or a size expression


@dataclass(frozen=True)
class Buffer:
    """A tensor of the task bound to a name: `input` i / `output` i of forward, or `weight` (a state_dict key)."""

    name: str
    role: str  # one of BUFFER_ROLES
    key: int | str  # position for input/output, state_dict key for weight


@dataclass(frozen=True)
class Workspace:
    """Scratch device memory the launcher allocates (`bytes`), zeroed before every run when `zero`."""

    name: str
    bytes: Size
    zero: bool = False


@dataclass(frozen=True)
class Arg:
    """One kernel argument: a buffer's or workspace's pointer, or a scalar of `type` by value."""

    kind: str  # "buf", "workspace" or "scalar"
    name: str = ""  # the buffer or workspace
    value: int | float | str = 0  # the scalar: a number or a size expression
    type: str = ""  # the scalar's type (SCALAR_TYPES)


@dataclass(frozen=True)
class Step:
    """One kernel launch."""

    kernel: str
    grid: tuple[Size, ...]  # 1-3 extents
    block: tuple[Size, ...]  # 1-3 extents
    dyn_smem: Size
    args: tuple[Arg, ...]


@dataclass(frozen=True)
class KernelFormSpec:
    """A whole candidate: source, NVRTC options, named buffers and workspaces, and the steps of one call."""

    source: str
    options: tuple[str, ...]
    buffers: tuple[Buffer, ...]
    workspaces: tuple[Workspace, ...]
    steps: tuple[Step, ...]
    format: int = FORMAT_VERSION

    def buffer(self, name: str) -> Buffer:
        return next(b for b in self.buffers if b.name == name)

    def expressions(self) -> list[tuple[str, str]]:
        """(field path, expression text) of every size expression."""
        out = [(f"workspaces.{w.name}.bytes", w.bytes) for w in self.workspaces if isinstance(w.bytes, str)]
        for i, step in enumerate(self.steps):
            out += [(f"steps[{i}].grid[{j}]", g) for j, g in enumerate(step.grid) if isinstance(g, str)]
            out += [(f"steps[{i}].block[{j}]", b) for j, b in enumerate(step.block) if isinstance(b, str)]
            if isinstance(step.dyn_smem, str):
                out.append((f"steps[{i}].dyn_smem", step.dyn_smem))
            out += [(f"steps[{i}].args[{j}].scalar", a.value) for j, a in enumerate(step.args)
                    if a.kind == "scalar" and isinstance(a.value, str)]
        return out


# ----------------------------------------------------------------------------------------------------
# Parsing
# ----------------------------------------------------------------------------------------------------

def _type_name(value: Any) -> str:
    return "null" if value is None else {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
                                         int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def _object(value: Any, field: str, required: Sequence[str], optional: Sequence[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(field, f"expected an object, got {_type_name(value)}")
    for key in value:
        if key not in required and key not in optional:
            allowed = ", ".join([*required, *optional])
            raise SpecError(f"{field}.{key}" if field else str(key), f"unknown field (allowed: {allowed})")
    for key in required:
        if key not in value:
            raise SpecError(f"{field}.{key}" if field else key, "is missing")
    return value


def _name(value: Any, field: str, pattern: re.Pattern[str] = _IDENT) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise SpecError(field, f"{json.dumps(value)[:40]} is not an identifier (letters, digits, '_')")
    return value


def _size(value: Any, field: str, *, low: int = 0) -> Size:
    if type(value) is int:
        if value < low:
            raise SpecError(field, f"{value} is below {low}")
        return value
    if isinstance(value, str):
        try:
            parse_expression(value)
        except ExpressionError as exc:
            raise SpecError(field, str(exc)) from None
        return value
    raise SpecError(field, f"expected an integer or a size expression string, got {_type_name(value)}")


def _extents(value: Any, field: str) -> tuple[Size, ...]:
    items = value if isinstance(value, list) else [value]
    if not 1 <= len(items) <= 3:
        raise SpecError(field, f"expected 1 to 3 extents, got {len(items)}")
    return tuple(_size(v, f"{field}[{i}]" if isinstance(value, list) else field, low=1) for i, v in enumerate(items))


def _arg(value: Any, field: str, buffers: set[str], workspaces: set[str]) -> Arg:
    if not isinstance(value, dict) or len({"buf", "workspace", "scalar"} & set(value)) != 1:
        raise SpecError(field, 'expected one of {"buf": NAME}, {"workspace": NAME}, {"scalar": VALUE, "type": T}')
    if "buf" in value:
        _object(value, field, ["buf"], [])
        name = _name(value["buf"], f"{field}.buf")
        if name not in buffers:
            raise SpecError(f"{field}.buf", f"no buffer {name!r} (buffers: {', '.join(sorted(buffers)) or 'none'})")
        return Arg("buf", name=name)
    if "workspace" in value:
        _object(value, field, ["workspace"], [])
        name = _name(value["workspace"], f"{field}.workspace")
        if name not in workspaces:
            raise SpecError(f"{field}.workspace",
                            f"no workspace {name!r} (workspaces: {', '.join(sorted(workspaces)) or 'none'})")
        return Arg("workspace", name=name)
    _object(value, field, ["scalar", "type"], [])
    ctype = value["type"]
    if ctype not in SCALAR_TYPES:
        raise SpecError(f"{field}.type", f"{json.dumps(ctype)[:40]} is not one of {', '.join(SCALAR_TYPES)}")
    scalar = value["scalar"]
    if ctype in INTEGER_TYPES:
        if type(scalar) is int or isinstance(scalar, str):
            return Arg("scalar", value=_size(scalar, f"{field}.scalar", low=-(2**63)), type=ctype)
        raise SpecError(f"{field}.scalar", f"a {ctype} takes an integer or a size expression, got "
                        f"{_type_name(scalar)}")
    if type(scalar) in (int, float):
        if scalar != scalar or scalar in (float("inf"), float("-inf")):
            raise SpecError(f"{field}.scalar", "must be finite")
        return Arg("scalar", value=scalar, type=ctype)
    if isinstance(scalar, str):
        return Arg("scalar", value=_size(scalar, f"{field}.scalar", low=-(2**63)), type=ctype)
    raise SpecError(f"{field}.scalar", f"a {ctype} takes a number or a size expression, got {_type_name(scalar)}")


def parse_spec(data: Mapping[str, Any] | str) -> KernelFormSpec:
    """A checked `KernelFormSpec` from a JSON object (or its text); `SpecError` names the first bad field."""
    if isinstance(data, str):
        try:
            data = json.loads(data.lstrip("\ufeff"))
        except RecursionError:
            raise SpecError("", "the spec is not JSON: nested too deeply") from None
        except json.JSONDecodeError as exc:
            raise SpecError("", f"the spec is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    top = _object(data, "", ["format", "source", "buffers", "steps"], ["options", "workspaces"])
    if top["format"] != FORMAT_VERSION or type(top["format"]) is not int:
        raise SpecError("format", f"{json.dumps(top['format'])[:40]} is not {FORMAT_VERSION}")
    source = top["source"]
    if not isinstance(source, str) or not source.strip():
        raise SpecError("source", "expected the CUDA C++ source, a non-empty string")
    if len(source.encode("utf-8", errors="replace")) > MAX_SOURCE_BYTES:
        raise SpecError("source", f"longer than {MAX_SOURCE_BYTES} bytes")
    options_raw = top.get("options", [])
    if not isinstance(options_raw, list):
        raise SpecError("options", f"expected a list of strings, got {_type_name(options_raw)}")
    for i, opt in enumerate(options_raw):
        if not isinstance(opt, str) or not _OPTION.fullmatch(opt):
            raise SpecError(f"options[{i}]", f"{json.dumps(opt)[:60]} is not an allowed NVRTC option "
                            "(--use_fast_math, -maxrregcount=N, --ftz=, --prec-div=, --prec-sqrt=, --fmad=, "
                            "-lineinfo, --extra-device-vectorization, -DNAME[=VALUE], -std=c++17|20)")
    buffers_raw = top["buffers"]
    if not isinstance(buffers_raw, dict) or not buffers_raw:
        raise SpecError("buffers", "expected an object of named buffers, at least one")
    if len(buffers_raw) > MAX_NAMED:
        raise SpecError("buffers", f"more than {MAX_NAMED} buffers")
    buffers: list[Buffer] = []
    seen_bindings: dict[tuple[str, int | str], str] = {}
    for name, binding in buffers_raw.items():
        field = f"buffers.{_name(name, 'buffers')}"
        if not isinstance(binding, dict) or len(binding) != 1 or next(iter(binding)) not in BUFFER_ROLES:
            raise SpecError(field, 'expected one of {"input": INDEX}, {"output": INDEX}, {"weight": "KEY"}')
        role, key = next(iter(binding.items()))
        if role in ("input", "output") and (type(key) is not int or key < 0):
            raise SpecError(f"{field}.{role}", f"expected an index >= 0, got {json.dumps(key)[:40]}")
        if role == "weight" and (not isinstance(key, str) or not re.fullmatch(r"[\w.]{1,200}", key)):
            raise SpecError(f"{field}.weight", f"expected a state_dict key, got {json.dumps(key)[:40]}")
        if (role, key) in seen_bindings:
            raise SpecError(field, f"binds {role} {key!r} like buffers.{seen_bindings[role, key]}")
        seen_bindings[role, key] = name
        buffers.append(Buffer(name, role, key))
    outputs = sorted(b.key for b in buffers if b.role == "output")
    if not outputs:
        raise SpecError("buffers", 'no output: bind at least {"output": 0}')
    if outputs != list(range(len(outputs))):
        raise SpecError("buffers", f"outputs {outputs} must be numbered 0, 1, ... without gaps")
    workspaces_raw = top.get("workspaces", {})
    if not isinstance(workspaces_raw, dict):
        raise SpecError("workspaces", f"expected an object, got {_type_name(workspaces_raw)}")
    if len(workspaces_raw) > MAX_NAMED:
        raise SpecError("workspaces", f"more than {MAX_NAMED} workspaces")
    workspaces: list[Workspace] = []
    for name, body in workspaces_raw.items():
        field = f"workspaces.{_name(name, 'workspaces')}"
        if name in buffers_raw:
            raise SpecError(field, "a buffer has the same name")
        body = _object(body, field, ["bytes"], ["zero"])
        if not isinstance(body.get("zero", False), bool):
            raise SpecError(f"{field}.zero", f"expected true or false, got {_type_name(body['zero'])}")
        size = _size(body["bytes"], f"{field}.bytes", low=1)
        if isinstance(size, int) and size > MAX_WORKSPACE_BYTES:
            raise SpecError(f"{field}.bytes", f"{size} exceeds {MAX_WORKSPACE_BYTES}")
        workspaces.append(Workspace(name, size, body.get("zero", False)))
    steps_raw = top["steps"]
    if not isinstance(steps_raw, list) or not 1 <= len(steps_raw) <= MAX_STEPS:
        raise SpecError("steps", f"expected a list of 1 to {MAX_STEPS} steps")
    buffer_names, workspace_names = {b.name for b in buffers}, {w.name for w in workspaces}
    steps: list[Step] = []
    for i, raw in enumerate(steps_raw):
        field = f"steps[{i}]"
        raw = _object(raw, field, ["kernel", "grid", "block", "args"], ["dyn_smem"])
        kernel = _name(raw["kernel"], f"{field}.kernel")
        args_raw = raw["args"]
        if not isinstance(args_raw, list) or len(args_raw) > MAX_ARGS:
            raise SpecError(f"{field}.args", f"expected a list of at most {MAX_ARGS} arguments")
        args = tuple(_arg(a, f"{field}.args[{j}]", buffer_names, workspace_names) for j, a in enumerate(args_raw))
        steps.append(Step(kernel, _extents(raw["grid"], f"{field}.grid"), _extents(raw["block"], f"{field}.block"),
                          _size(raw.get("dyn_smem", 0), f"{field}.dyn_smem"), args))
    used = {a.name for s in steps for a in s.args if a.kind == "buf"}
    for b in buffers:
        if b.role == "output" and b.name not in used:
            raise SpecError(f"buffers.{b.name}", "an output that no step passes to a kernel")
    return KernelFormSpec(source, tuple(options_raw), tuple(buffers), tuple(workspaces), tuple(steps))


# ----------------------------------------------------------------------------------------------------
# Checks that need the task or the source
# ----------------------------------------------------------------------------------------------------

def task_dims(shapes: Mapping[str, Sequence[int]], constants: Mapping[str, Any] | None = None) -> dict[str, int]:
    """The names a size expression may read: each integer constant of the task module (BATCH, DIM, ...) and,
    per buffer `b` of shape (d0, d1, ...), `b_numel`, `b_dim0`, `b_dim1`, ... (a buffer wins a clash)."""
    dims: dict[str, int] = {}
    for name, value in (constants or {}).items():
        if type(value) is int and _DIM_NAME.fullmatch(name) and not name.startswith("_"):
            dims[name] = value
    for name, shape in shapes.items():
        numel = 1
        for i, extent in enumerate(shape):
            dims[f"{name}_dim{i}"] = int(extent)
            numel *= int(extent)
        dims[f"{name}_numel"] = numel
    return dims


def check_names(spec: KernelFormSpec, dim_names: set[str] | frozenset[str]) -> None:
    """Every expression of `spec` reads only `dim_names` (SpecError naming the field otherwise)."""
    for field, text in spec.expressions():
        try:
            parse_expression(text, set(dim_names))
        except ExpressionError as exc:
            raise SpecError(field, str(exc)) from None


def check_against_source(spec: KernelFormSpec) -> None:
    """Every step names an `extern "C"` kernel of the source, with as many arguments as it has parameters,
    pointers for pointer parameters, and scalars whose `type` is the parameter's declared type."""
    from cudal1.raw_cuda.signature import parse_kernel_signatures

    signatures = parse_kernel_signatures(spec.source)
    for i, step in enumerate(spec.steps):
        field = f"steps[{i}]"
        sig = signatures.get(step.kernel)
        if sig is None or not sig.extern_c:
            defined = sorted(n for n, s in signatures.items() if s.extern_c)
            why = " (declare it extern \"C\", not a template)" if sig is not None else ""
            raise SpecError(f"{field}.kernel", f"no extern \"C\" __global__ {step.kernel!r} in the source{why}; "
                            f"defined: {', '.join(defined) or 'none'}")
        if len(step.args) != len(sig.params):
            raise SpecError(f"{field}.args", f"{len(step.args)} argument(s) for {sig.describe()}")
        for j, (arg, param) in enumerate(zip(step.args, sig.params, strict=True)):
            where = f"{field}.args[{j}]"
            if param.is_pointer and arg.kind == "scalar":
                raise SpecError(where, f"a scalar for the pointer parameter {param.describe()}")
            if not param.is_pointer and arg.kind != "scalar":
                raise SpecError(where, f"a {arg.kind} pointer for the by-value parameter {param.describe()}")
            if arg.kind == "scalar" and arg.type != param.base:
                raise SpecError(f"{where}.type", f"{arg.type} but the kernel declares {param.describe()}; "
                                f"the driver copies sizeof({param.base_text}) bytes, so the types must match")
